"""The hybrid_gdn mutation suite (DESIGN.md §11): each broken backend red with its check exactly
where its bug is reachable and green everywhere else; the correct provider green over seeds 0-2,
both kv dtypes, k 0 and 2, every state dtype. Reachability, for a UNIFORM_BATCH family: FULL
resolves to FULL_AND_PIECEWISE, so the decode batch replays a FULL decode graph in FULL,
FULL_DECODE_ONLY and FULL_AND_PIECEWISE, padded (5 requests in graphs of 8 at k = 0, of 6 at k = 2);
the mixed batch (prompts are prefills: vLLM's V2 runner) never replays one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest

from backend.harness.checker import run_case, run_case_local
from backend.result import Status
from tests.families.conftest import GDN_DECODE, GDN_MIXED, gdn_model, make_gdn_case

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
DECODE_GRAPH = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
UNIFORM = {"FULL": "FULL_AND_PIECEWISE"}  # UNIFORM_BATCH's resolution
M = "tests.mutants.gdn_builders:"


@dataclass(frozen=True)
class Expect:
    backend: str
    flagged: Callable[[str, str, int], bool]  # (mode, batch kind, k) -> reachable here
    status: Status
    check: str  # the check that must fail (and lead the reason, or one of first_any)
    detail: tuple[str, ...] = ("",)  # the failing check's detail holds one of these (which part failed)
    first_any: tuple[str, ...] = ()
    status_at: Callable[[int], Status] | None = None  # a status that depends on k


def padded_decode_graph(mode, kind, k):
    return mode in DECODE_GRAPH and kind == "decode"


MUTANTS = {
    "tokenspeed #700 padding index clamped to 0": Expect(
        M + "PadClampedToZero", padded_decode_graph, Status.FAIL, "state_integrity", ("outside the step's",)),
    # the last slot: nobody's (a write outside), or a live request's (its state overwritten)
    "sglang #36885 padding remapped to the last slot": Expect(
        M + "PadToLastSlot", padded_decode_graph, Status.FAIL, "state_integrity",
        ("outside the step's", "the graph run's state differs from eager's")),
    "vLLM #45100 request buffers padded by tokens": Expect(
        M + "TokenPaddedBuffers", lambda mode, kind, k: kind == "decode" and k > 0, Status.FAIL, "state_integrity",
        ("metadata: spec_state_indices_tensor has",)),
    "vLLM #51483 a recycled slot read by a one-token prompt": Expect(
        M + "RecycledNotZeroed", lambda mode, kind, k: kind == "mixed" and k == 0, Status.FAIL, "state_integrity",
        ("eager",), first_any=("reference",)),
    "accepted count padded with 0": Expect(
        M + "AcceptedPaddedZero", lambda mode, kind, k: padded_decode_graph(mode, kind, k) and k > 0, Status.FAIL,
        "state_integrity", ("metadata: padded requests",)),
    "#51585/#53821 the state group's capture zeroes the shared query_start_loc": Expect(
        M + "ZeroedQueryStart", padded_decode_graph, Status.FAIL, "attn_replay", first_any=("replay",),
        status_at=lambda k: Status.FAIL if k == 0 else Status.ERROR),
    "sglang #30974 padded conv rows unwritten": Expect(
        M + "PaddedConvUnwritten", padded_decode_graph, Status.FAIL, "padded_finite"),
}


@pytest.mark.parametrize("name", MUTANTS)
def test_gdn_mutant_flagged_exactly_where_reachable(name, mla_sessions):
    exp = MUTANTS[name]
    seen = []
    for k in (0, 2):
        for batch in (GDN_DECODE, GDN_MIXED):
            for mode in MODES:
                r = run_case(make_gdn_case(exp.backend, mode, "auto", batch, spec_tokens=k), sessions=mla_sessions)
                flagged = exp.flagged(mode, batch.kind, k)
                status = exp.status_at(k) if exp.status_at else exp.status
                want = status if flagged else Status.PASS
                where = f"{name}: {mode}/k{k}/{batch.kind}"
                assert r.status == want, f"{where}: {r.status.value} {r.reason}"
                if want == Status.FAIL:
                    assert any(r.reason.startswith(f"{c} check failed") for c in (exp.check, *exp.first_any)), \
                        f"{where}: {r.reason}"
                    failed = next(c for c in r.checks if c.name == exp.check)
                    assert not failed.passed and any(d in failed.detail for d in exp.detail), f"{where}: {failed.summary()}"
                resolved = UNIFORM.get(mode, mode)
                assert r.resolved_mode == resolved and r.downgraded == (resolved != mode), where
                seen.append(flagged)
    assert any(seen)


def test_the_zeroed_offsets_fail_the_attention_group_after_the_state_groups(mla_sessions):
    """The first state group's capture build zeroes the shared offsets; at k = 0 the GDN builders
    of the later state group read nothing off them that a graph freezes, the attention group's
    builder (its token count from query_start_loc_cpu) does: layer 3, at replay. A model with one
    state dtype has the same later group."""
    for model in (None, gdn_model(state_dtype="float32")):
        changes = {"model": model} if model else {}
        r = run_case(make_gdn_case(M + "ZeroedQueryStart", "FULL_DECODE_ONLY", **changes), sessions=mla_sessions)
        attn = next(c for c in r.checks if c.name == "attn_replay")
        assert r.status == Status.FAIL and attn.detail.startswith("step 0: layer 3,"), attn.summary()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_torch_passes_every_mode_kv_and_k_over_three_seeds(seed, mla_sessions):
    for kv, k in (("auto", 0), ("fp8", 0), ("auto", 2)):
        for batch in (GDN_DECODE, GDN_MIXED):
            for mode in MODES:
                r = run_case(make_gdn_case("torch", mode, kv, batch, seed=seed, spec_tokens=k), sessions=mla_sessions)
                assert r.status == Status.PASS, f"{mode}/{kv}/k{k}/{batch.kind}/s{seed}: {r.reason}"
                assert [c.name for c in r.checks][4] == "state_integrity"


@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_torch_passes_with_one_state_dtype(state_dtype, mla_sessions):
    model = gdn_model(state_dtype=state_dtype)
    for k in (0, 2):
        for batch in (GDN_DECODE, GDN_MIXED):
            for mode in ("NONE", "FULL_DECODE_ONLY"):
                r = run_case(make_gdn_case("torch", mode, "auto", batch, spec_tokens=k, model=model),
                             sessions=mla_sessions)
                assert r.status == Status.PASS, f"{state_dtype} {mode}/k{k}/{batch.kind}: {r.reason}"


@pytest.mark.slow
def test_gdn_on_a_tp_gang():
    """Key and value heads split over a gloo gang, each rank's state pages its heads' share."""
    r = run_case_local(make_gdn_case("torch", "FULL_DECODE_ONLY", "auto", GDN_DECODE, tp=2))
    assert r.status == Status.PASS, r.reason + r.log_tail[-1500:]
    bad = run_case_local(make_gdn_case(M + "PadClampedToZero", "FULL_DECODE_ONLY", "auto", GDN_DECODE, tp=2))
    assert bad.status == Status.FAIL and "[all ranks fail]" in bad.reason, bad.reason
