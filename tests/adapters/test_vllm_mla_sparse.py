"""vLLM's own sparse builders for the mla_sparse family (backend/adapters/vllm/mla_sparse.py): what
the bridge declares, vLLM's DSA indexer and FlashMLA sparse builders under the CPU graph emulation
(orch's torch kernels attend, labelled), vLLM's values in the family's buffers, and the torch
stand-ins of the Triton calls in their build paths held to the kernels' arithmetic."""

from __future__ import annotations

import pytest
import torch

from backend.adapters.vllm.sparse_standins import (
    prefill_chunk_metadata,
    token_to_req_indices,
    uniform_decode,
)
from backend.attention.mla_sparse import token_seq_lens
from backend.attention.registry import get_backend, get_capabilities
from backend.harness.checker import SessionCache, run_case
from backend.result import Status
from tests.families.test_mla_sparse import DECODE, MIXED, MODES, make_case

vllm = pytest.importorskip("vllm", reason="vllm not importable (docs/VLLM.md: .ci/run installs it)")
pytestmark = pytest.mark.vllm

CPU = torch.device("cpu")
NAME = "vllm:FLASHMLA_SPARSE"


@pytest.fixture(scope="module")
def sessions() -> SessionCache:
    return SessionCache(capacity=16)


def test_what_the_bridge_declares_and_says_it_runs():
    cls = get_backend(NAME, "mla_sparse")
    assert cls.family == "mla_sparse" and cls.unavailable_reason(CPU) is None
    # vLLM's FlashMLASparseMetadataBuilder._cudagraph_support, read from the class
    assert get_capabilities(NAME, "mla_sparse").cudagraph_support.name == "UNIFORM_BATCH"
    assert "builders: vLLM's" in cls.kernels and "orch's torch" in cls.kernels
    assert any("compute_token_to_req_indices" in e for e in cls.emulated()) == (not torch.cuda.is_available())
    rocm = get_backend("vllm:ROCM_AITER_MLA_SPARSE", "mla_sparse").unavailable_reason(CPU)
    assert "aiter.get_mla_metadata_v1" in rocm and "generate_sparse_seqlen_triton" in rocm
    assert "MLA backend" in get_backend(NAME, "gqa").unavailable_reason(CPU)


@pytest.mark.parametrize("kv, says", [("fp8_ds_mla", "get_mla_metadata"), ("fp8", "orch's per-tensor fp8")])
def test_the_quantised_caches_skip_with_the_reason(kv, says, sessions):
    r = run_case(make_case(NAME, "FULL", kv, DECODE), sessions=sessions)
    assert r.status == Status.SKIP and says in r.reason, r.reason


@pytest.mark.parametrize("k", [0, 2])  # k 1: the padded replay below; k 2: the indexer's flattened decode
def test_vllms_builders_pass_every_mode_on_cpu(k, sessions):
    for batch, modes in ((DECODE, MODES), (MIXED, ("NONE", "FULL"))):
        for mode in modes:
            r = run_case(make_case(NAME, mode, "auto", batch, spec_tokens=k), device=CPU, sessions=sessions)
            assert r.status == Status.PASS, f"{mode}/k{k}/{batch.name}: {r.reason}"
            assert "state_integrity" in {c.name for c in r.checks}
            assert "builders: vLLM's" in r.versions["kernels"] and r.versions["vllm"]


def test_the_buffers_hold_vllms_values_on_a_padded_replay():
    """A padded FULL decode replay at k 1 (3 requests of 2 tokens in a graph of 8 tokens): the real
    tokens' lengths are the causal ones; the two padded tokens, past vLLM's mapped tokens, get
    request 0 from its token_to_req_indices and length 0 from its indexer (orch's own builder names
    a padded row instead: the values are vLLM's)."""
    sessions = SessionCache()
    r = run_case(make_case(NAME, "FULL_DECODE_ONLY", "auto", DECODE, spec_tokens=1), device=CPU, sessions=sessions)
    assert r.status == Status.PASS, r.reason
    (session,) = sessions._sessions.values()
    md = session.last_metadata
    n, padded = md.num_actual_tokens, md.num_padded_tokens
    assert md.vllm is not None and padded > n
    q, s = md.query_lens.tolist()[: md.num_reqs], md.seq_lens.tolist()[: md.num_reqs]
    assert md.token_seq_lens.tolist() == token_seq_lens(q, s) + [0] * (padded - n)
    assert md.req_id_per_token.tolist()[n:] == [0] * (padded - n)


def test_token_to_req_indices_is_the_kernels_search():
    # requests of 2, 0 (skipped), 3 and 1 tokens; 8 tokens of which 6 mapped
    qsl = torch.tensor([0, 2, 2, 5, 6], dtype=torch.int32)
    out = torch.full((10,), 9, dtype=torch.int32)
    got = token_to_req_indices(qsl, out, 6, 8)
    assert got.tolist() == [0, 0, 2, 2, 2, 3, 0, 0] and out[8:].tolist() == [9, 9]


def test_prefill_chunk_metadata_is_the_kernels_ranges():
    # two prefill requests: 3 new tokens over 2 cached (seq 5), 2 new over 0 (seq 2); keys 5 + 2
    qsl = torch.tensor([0, 3, 5], dtype=torch.int32)
    seq = torch.tensor([5, 2], dtype=torch.int32)
    cu = torch.tensor([0, 5, 7], dtype=torch.int32)
    ks, ke = torch.empty(4, dtype=torch.int32), torch.empty(4, dtype=torch.int32)  # query slice [1, 5)
    t2s = torch.empty(7, dtype=torch.int32)
    prefill_chunk_metadata(qsl, seq, cu, cu, t2s, ks, ke, 1, 5, 0, 1, 1, num_reqs=2, COMPRESS_RATIO=1)
    assert ks.tolist() == [0, 0, 5, 5] and ke.tolist() == [4, 5, 6, 7] and t2s.tolist() == [0] * 5 + [1] * 2
    with pytest.raises(NotImplementedError):
        prefill_chunk_metadata(qsl, seq, cu, cu, t2s, ks, ke, 1, 5, 0, 2, 1, num_reqs=2, COMPRESS_RATIO=1)


def test_uniform_decode_is_the_kernels_expansion():
    # two live requests of 3 tokens (seq 5 and 3) and a padded one (seq 0): lengths clamped at 0
    seq = torch.tensor([5, 3, 0], dtype=torch.int32)
    table = torch.tensor([[7, 8], [9, 10], [0, 0]], dtype=torch.int32)
    lens, expanded, dl = (
        torch.full((10,), -9, dtype=torch.int32),
        torch.zeros(10, 2, dtype=torch.int32),
        torch.zeros(10, dtype=torch.int32),
    )
    uniform_decode(seq, lens, table, expanded, dl, 9, 3)
    assert lens.tolist() == [3, 4, 5, 1, 2, 3, 0, 0, 0, -9]
    assert expanded[:9, 0].tolist() == [7, 7, 7, 9, 9, 9, 0, 0, 0] and dl[:9].tolist() == [1] * 9
