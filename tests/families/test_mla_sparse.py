"""mla_sparse (backend/families/mla_sparse.py): the selection rule the provider and the fp32
reference share, the metadata's contract as a table of violations, and the correct provider green
in every mode over a padded decode batch and a mixed one."""

from __future__ import annotations

import pytest
import torch

from backend.attention.mla_sparse import Buffers, problems, token_seq_lens
from backend.case import BatchSpec, Case, ModelShape
from backend.families import spec
from backend.families.mla_sparse import picked_mask
from backend.harness.checker import SessionCache, run_case
from backend.providers.torch_mla_sparse import index_scores, select_topk
from backend.result import Status
from tests.families.conftest import _tiny_case

_CPU = spec("mla_sparse").defaults["cpu"]
DIMS = tuple((k, _CPU[k]) for k in spec("mla_sparse").dim_names)
TOPK = _CPU["index_topk"]  # 16
TINY = ModelShape(
    num_heads=4,
    num_kv_heads=1,
    head_size=48,
    block_size=16,
    dtype="bfloat16",
    num_layers=1,
    max_model_len=128,
    max_num_seqs=16,
    attention="mla_sparse",
    dims=DIMS,
)
# Contexts below, at and above top-k; 5 decode rows pad to 8 (seq_len-0 padded rows).
DECODE = BatchSpec("sparse_decode5", (1, 1, 1, 1, 1), (3, 16, 17, 40, 100))
# Decodes, a fresh prompt shorter than top-k, a chunk of 20 (> top-k) over 30 of context.
MIXED = BatchSpec("sparse_mixed4", (1, 1, 6, 20), (9, 70, 6, 50))
MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def make_case(backend="torch", mode="FULL", kv="auto", batch=DECODE, tp=1, seed=0, **changes) -> Case:
    return _tiny_case(TINY, "tests/tiny-mla-sparse.yaml", backend, mode, kv, batch, tp, seed, changes)


@pytest.fixture(scope="module")
def sparse_sessions() -> SessionCache:
    return SessionCache(capacity=16)


# ---- the selection: the provider's sort and the reference's dense ranking agree ---------------


@pytest.mark.parametrize(
    "context, query_len, zeros",
    [(3, 1, False), (15, 1, False), (40, 1, False), (40, 2, True), (0, 6, False), (30, 20, True), (100, 1, True)],
)
def test_provider_and_reference_pick_the_same_set(context, query_len, zeros):
    gen = torch.Generator().manual_seed(context * 7 + query_len)
    s = context + query_len
    keys = torch.randn(s, 16, generator=gen).bfloat16().float()
    if zeros:  # many exact ties: keys whose every score is 0 after the ReLU
        keys[::3] = -keys[::3].abs() * 0 - 1.0
    iq, iw = torch.randn(2, 16, generator=gen).abs().bfloat16().float(), torch.rand(2, generator=gen).bfloat16().float()
    want = picked_mask(keys, context, query_len, iq, iw, TOPK)
    lens = torch.tensor(token_seq_lens([query_len], [s]))
    got = select_topk(
        index_scores(keys, iq, iw)[None].expand(query_len, s), torch.full((query_len,), context), lens, TOPK
    )
    mask = torch.zeros(query_len, s, dtype=torch.bool)
    rows = torch.arange(query_len)[:, None].expand_as(got)
    mask[rows[got >= 0], got[got >= 0].long()] = True
    assert torch.equal(mask, want)
    # causal, at most top-k, all of a short context, the step's latest tokens first
    pos = torch.arange(s)
    assert not (want & (pos[None, :] > (context + torch.arange(query_len))[:, None])).any()
    assert (want.sum(1) == torch.clamp(lens, max=TOPK)).all()
    assert want[-1, s - 1]


# ---- the contract: each violation names its field, row and value -------------------------------


def _buffers(**changes) -> Buffers:
    # 2 live requests (query 1 and 2, seq 5 and 3) and 1 padded one; 4 tokens + 2 padded.
    topk = torch.full((6, TOPK), -1, dtype=torch.int64)
    topk[0, :5] = torch.arange(5)
    topk[1, :2] = torch.tensor([1, 0])
    topk[2, :3] = torch.tensor([2, 1, 0])
    base = {
        "num_actual_tokens": 3,
        "num_padded_tokens": 6,
        "num_reqs": 2,
        "num_padded_reqs": 3,
        "index_topk": TOPK,
        "seq_lens": [5, 3, 0],
        "query_lens": [1, 2, 0],
        "block_table_rows": 3,
        "token_seq_lens": [5, 2, 3, 0, 0, 0],
        "req_id_per_token": [0, 1, 1, 2, 2, 2],
        "topk": topk,
    }
    return Buffers(**{**base, **changes})


def _topk_with(row: int, values: list[int]) -> torch.Tensor:
    t = _buffers().topk.clone()
    t[row, : len(values)] = torch.tensor(values)
    return t


@pytest.mark.parametrize(
    "changes, expect",
    [
        ({}, None),
        ({"token_seq_lens": [5, 2, 3, -1, 0, 0]}, "token_seq_lens[3] = -1: outside [0, seq_len 0] of request 2"),
        ({"token_seq_lens": [6, 2, 3, 0, 0, 0]}, "token_seq_lens[0] = 6: outside [0, seq_len 5] of request 0"),
        ({"req_id_per_token": [0, 1, 1, 3, 2, 2]}, "req_id_per_token[3] = 3: outside the block table's 3 rows"),
        (
            {"req_id_per_token": [0, 1, 1, 1, 2, 2], "token_seq_lens": [5, 2, 3, 2, 0, 0]},
            "req_id_per_token[3] = 1: padded token 3 resolves into live request 1",
        ),
        ({"topk": _topk_with(1, [2])}, "topk_indices[1] = 2: past its token_seq_lens 2 (not causal)"),
        ({"topk": _topk_with(0, [0, 0])}, "topk_indices[0]: a position picked twice"),
        ({"topk": _topk_with(2, [-5])}, "topk_indices[2] holds -5: neither -1 nor a position"),
        (
            {"topk": _topk_with(4, [0]), "req_id_per_token": [0, 1, 1, 2, 0, 2], "token_seq_lens": [5, 2, 3, 0, 1, 0]},
            "topk_indices[4] = 0: padded token 4 indexes live request 0",
        ),
        (
            {"topk": torch.full((6, 2 * TOPK), -1, dtype=torch.int64)},
            f"topk_indices: sized for index_topk {2 * TOPK} (metadata {TOPK}), the model's is {TOPK}",
        ),
    ],
)
def test_the_contract_names_field_row_and_value(changes, expect):
    found = problems(_buffers(**changes), TOPK)
    assert (expect in found) if expect else found == [], found


# ---- the correct provider ---------------------------------------------------------------------


@pytest.mark.parametrize("batch", [DECODE, MIXED], ids=lambda b: b.name)
def test_torch_provider_passes_every_mode(batch, sparse_sessions):
    for kv, k in (("auto", 0), ("auto", 1), ("fp8", 0), ("fp8_ds_mla", 0), ("fp8_ds_mla", 1)):
        for mode in MODES:
            r = run_case(make_case("torch", mode, kv, batch, spec_tokens=k), sessions=sparse_sessions)
            assert r.status == Status.PASS, f"{mode}/{kv}/k{k}/{batch.name}: {r.reason}"
            assert "state_integrity" in {c.name for c in r.checks}
