"""The mla_sparse mutation suite: one broken provider per public mechanism of the family's bugs
(tests/mutants/mla_sparse_*.py), each red with its check exactly where the mechanism is reachable
and green everywhere else. Reachability, for a UNIFORM_BATCH provider: FULL resolves to
FULL_AND_PIECEWISE, so the decode batch replays a padded FULL decode graph in FULL,
FULL_DECODE_ONLY and FULL_AND_PIECEWISE (5 rows in a graph of 8 at k 0; 10 tokens in one of 16 at
k 1, 15 in one of 16 at k 2), and the mixed batch never replays one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from backend.harness.checker import run_case, run_case_local
from backend.result import Status
from tests.families.test_mla_sparse import DECODE, MIXED, make_case, sparse_sessions  # noqa: F401 - a pytest fixture, used by name

# FULL resolves to FULL_AND_PIECEWISE for a UNIFORM_BATCH provider (the same graphs): not run twice here.
MODES = ("NONE", "PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
DECODE_GRAPH = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


@dataclass(frozen=True)
class Expect:
    backend: str
    flagged: Callable[[str, str, int], bool]  # (mode, batch kind, k) -> reachable here
    checks: tuple[str, ...]  # the checks that must be red there (the first failure among them)
    detail: str  # what the failing check names
    ks: tuple[int, ...] = (0, 1)


def decode_graph(mode, kind, k):
    return mode in DECODE_GRAPH and kind == "decode"


MUTANTS = {
    "vLLM #51593 negative length on a seq_len-0 pad row": Expect(
        "tests.mutants.mla_sparse_neg_len:Backend",
        lambda m, kind, k: decode_graph(m, kind, k) and k >= 1,
        ("state_integrity",),
        "token_seq_lens[",
    ),
    "sglang #30378 pad row's seq_len fill below its query len": Expect(
        "tests.mutants.mla_sparse_pad_seq_fill:Backend",
        lambda m, kind, k: decode_graph(m, kind, k) and k >= 2,
        ("state_integrity",),
        "token_seq_lens[",
        ks=(0, 1, 2),
    ),
    # Red wherever a short-context token follows a call that filled more of its top-k row. Eager
    # alone (NONE) at k 1 on the decode batch never does: the verify plan's steps keep requests
    # 0-2 in rows 0-2 and only grow their contexts (5, 5, then 3 requests); every graph mode's
    # capture and replays at other sizes fill those rows first.
    "vLLM #49139 top-k state outliving a call": Expect(
        "tests.mutants.mla_sparse_stale_topk:Backend",
        lambda m, kind, k: not (m == "NONE" and kind == "decode" and k == 1),
        ("reference", "attn_reference", "state_integrity", "replay"),
        "",
    ),
    "vLLM #55636 token_to_req_indices past the rows": Expect(
        "tests.mutants.mla_sparse_req_past_rows:Backend", decode_graph, ("state_integrity",), "req_id_per_token["
    ),
    "TRT-LLM #14297 per-call scratch captured by pointer": Expect(
        "tests.mutants.mla_sparse_per_call_scratch:Backend",
        decode_graph,
        ("state_integrity", "replay"),  # replay: a GPU
        "topk_indices[",
    ),
    "ATOM #1591 top-k size hard-coded in the graph buffer": Expect(
        "tests.mutants.mla_sparse_hardcoded_topk:Backend",
        lambda m, kind, k: True,
        ("reference", "attn_reference", "state_integrity"),
        "",
    ),
}


@pytest.mark.parametrize("name", MUTANTS)
def test_mla_sparse_mutant_red_exactly_where_reachable(name, sparse_sessions):  # noqa: F811 - the imported fixture, by name
    exp = MUTANTS[name]
    seen = []
    for k in exp.ks:
        for batch in (DECODE, MIXED):
            for mode in MODES:
                r = run_case(make_case(exp.backend, mode, "auto", batch, spec_tokens=k), sessions=sparse_sessions)
                flagged = exp.flagged(mode, batch.kind, k)
                where = f"{name}: {mode}/k{k}/{batch.kind}"
                assert r.status == (Status.FAIL if flagged else Status.PASS), f"{where}: {r.status.value} {r.reason}"
                if flagged:
                    assert any(r.reason.startswith(f"{c} check failed") for c in exp.checks), f"{where}: {r.reason}"
                    assert exp.detail in r.reason, f"{where}: {r.reason}"
                seen.append(flagged)
    assert any(seen) and (not all(seen) or exp.flagged("NONE", "mixed", 0))


@pytest.mark.parametrize(
    "backend",
    [
        "tests.mutants.mla_sparse_ds_tile_scale:Backend",  # the first tile's scale read for every tile
        "tests.mutants.mla_sparse_ds_first_scale:Backend",  # the first token's scales written for every token
    ],
)
def test_ds_mla_format_mutant_red_exactly_in_fp8_ds_mla_cells(backend, sparse_sessions):  # noqa: F811 - the imported fixture, by name
    """A format bug: red against the reference in every fp8_ds_mla cell (eager and graphs alike:
    the arithmetic is wrong, not its capture; the batches have several new tokens), green with kv
    auto and fp8, whose caches have neither tiles nor per-token scales; the rows eager and the
    graphs write agree (kv_integrity) and the metadata keeps its contract."""
    for kv in ("auto", "fp8", "fp8_ds_mla"):
        for batch in (DECODE, MIXED):
            for mode in ("NONE", "FULL_AND_PIECEWISE"):
                r = run_case(make_case(backend, mode, kv, batch), sessions=sparse_sessions)
                where = f"{mode}/{kv}/{batch.kind}"
                if kv != "fp8_ds_mla":
                    assert r.status == Status.PASS, f"{where}: {r.status.value} {r.reason}"
                    continue
                assert r.status == Status.FAIL, f"{where}: {r.status.value} {r.reason}"
                assert r.reason.startswith(("reference check failed", "attn_reference check failed")), r.reason
                assert all(c.passed for c in r.checks if c.name in ("kv_integrity", "state_integrity")), r.reason


def test_hardcoded_topk_is_named_by_the_contract_on_short_contexts(sparse_sessions):  # noqa: F811 - the imported fixture, by name
    """Every step's sequences within top-k (max_model_len 16 bounds the later steps' draws): the
    outputs are right (a wider buffer picks no more), the buffer's width is still a violation."""
    import dataclasses

    from backend.case import BatchSpec
    from tests.families.test_mla_sparse import TINY

    short = BatchSpec("sparse_short", (1, 1, 1), (3, 9, 15))
    r = run_case(
        make_case(
            "tests.mutants.mla_sparse_hardcoded_topk:Backend",
            "FULL_AND_PIECEWISE",
            "auto",
            short,
            model=dataclasses.replace(TINY, max_model_len=16),
        ),
        sessions=sparse_sessions,
    )
    assert r.status == Status.FAIL and r.reason.startswith("state_integrity check failed"), r.reason
    assert "topk_indices: sized for index_topk 32" in r.reason, r.reason
    assert all(c.passed for c in r.checks if c.name in ("reference", "replay")), r.reason


@pytest.mark.slow
def test_mla_sparse_allreduce_capture_red_at_tp2(sparse_sessions):  # noqa: F811 - the imported fixture, by name
    """vLLM #41835: a custom all-reduce whose capture leaves the sparse MLA's projection unreduced:
    red at tp 2 where a graph holds the all-reduce, green in eager there and at tp 1 (the correct
    provider's tp 2 cases are the matrix's)."""
    backend = "tests.mutants.mla_sparse_allreduce:Backend"
    cpu = torch.device("cpu")  # a gloo gang: one GPU cannot hold a tp 2 gang
    bad = run_case_local(make_case(backend, "FULL_AND_PIECEWISE", "auto", DECODE, tp=2), device=cpu)
    assert bad.status == Status.FAIL and "replay check failed" in bad.reason.split(",")[0], (
        bad.reason + bad.log_tail[-1500:]
    )
    assert run_case_local(make_case(backend, "NONE", "auto", DECODE, tp=2), device=cpu).status == Status.PASS
    one = run_case(make_case(backend, "FULL_AND_PIECEWISE", "auto", DECODE), sessions=sparse_sessions)
    assert one.status == Status.PASS, one.reason
