"""The hybrid_gdn mutation suite (DESIGN.md §11): each broken backend red with its check exactly
where its bug is reachable and green everywhere else; the correct provider green over seeds 0-2,
both kv dtypes, k 0 and 2, every state dtype. Reachability, for a UNIFORM_BATCH family: FULL
resolves to FULL_AND_PIECEWISE, so the decode batch replays a FULL decode graph in FULL,
FULL_DECODE_ONLY and FULL_AND_PIECEWISE, padded (5 requests in graphs of 8 at k = 0, of 6 at k = 2);
the mixed batch (prompts are prefills: vLLM's V2 runner) never replays one. At k = 2 the decode
batch's step 2 drops to 4 requests in the graph of 6 (backend/harness/steps.py count_ranks), so
padded rows a larger step wrote are replayed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from backend.case import BatchSpec
from backend.harness.checker import SessionCache, run_case, run_case_local
from backend.harness.steps import plan_steps
from backend.result import Status
from tests.families.conftest import GDN_DECODE, GDN_MIXED, gdn_model, make_gdn_case

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
DECODE_GRAPH = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
UNIFORM = {"FULL": "FULL_AND_PIECEWISE"}  # UNIFORM_BATCH's resolution
M = "tests.mutants.gdn_builders:"
STALE = "tests.mutants.gdn_stale_tail:StaleSpecTail"


@dataclass(frozen=True)
class Expect:
    backend: str
    flagged: Callable[[str, str, int], bool]  # (mode, batch kind, k) -> reachable here
    status: Status
    check: str  # the check that must fail (and lead the reason, or one of first_any)
    detail: tuple[str, ...] = ("",)  # the failing check's detail holds one of these (which part failed)
    first_any: tuple[str, ...] = ()
    also: tuple[tuple[str, str], ...] = ()  # (check, words of its detail): checks that fail too


def padded_decode_graph(mode, kind, k):
    return mode in DECODE_GRAPH and kind == "decode"


MUTANTS = {
    "tokenspeed #700 padding index clamped to 0": Expect(
        M + "PadClampedToZero", padded_decode_graph, Status.FAIL, "state_integrity", ("outside the step's",)
    ),
    # the last slot: nobody's (a write outside), or a live request's (its state overwritten)
    "sglang #36885 padding remapped to the last slot": Expect(
        M + "PadToLastSlot",
        padded_decode_graph,
        Status.FAIL,
        "state_integrity",
        ("outside the step's", "the graph run's state differs from eager's"),
    ),
    "vLLM #45100 request buffers padded by tokens": Expect(
        M + "TokenPaddedBuffers",
        lambda mode, kind, k: kind == "decode" and k > 0,
        Status.FAIL,
        "state_integrity",
        ("metadata: spec_state_indices_tensor has",),
    ),
    "vLLM #51483 a recycled slot read by a one-token prompt": Expect(
        M + "RecycledNotZeroed",
        lambda mode, kind, k: kind == "mixed" and k == 0,
        Status.FAIL,
        "state_integrity",
        ("eager",),
        first_any=("reference",),
    ),
    "accepted count padded with 0": Expect(
        M + "AcceptedPaddedZero",
        lambda mode, kind, k: padded_decode_graph(mode, kind, k) and k > 0,
        Status.FAIL,
        "state_integrity",
        ("metadata: padded requests",),
    ),
    # k = 2: the later state group classes the zeroed rows as one-token decodes, rows that cannot
    # hold 1 + k tokens each: no core runs for it (gdn_groups.py), where a kernel raised on shapes
    "the state group's capture zeroes the shared query_start_loc": Expect(
        M + "ZeroedQueryStart",
        padded_decode_graph,
        Status.FAIL,
        "attn_replay",
        first_any=("replay",),
        also=(("state_integrity", "capture build wrote the shared query_start_loc"),),
    ),
    "sglang #30974 padded conv rows unwritten": Expect(
        M + "PaddedConvUnwritten", padded_decode_graph, Status.FAIL, "padded_finite"
    ),
    "the spec state indices' tail left as a larger step wrote it": Expect(
        STALE,
        lambda mode, kind, k: padded_decode_graph(mode, kind, k) and k > 0,
        Status.FAIL,
        "state_integrity",
        ("outside the step's", "metadata: padded requests"),
    ),
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
                want = exp.status if flagged else Status.PASS
                where = f"{name}: {mode}/k{k}/{batch.kind}"
                assert r.status == want, f"{where}: {r.status.value} {r.reason}"
                if want == Status.FAIL:
                    assert any(r.reason.startswith(f"{c} check failed") for c in (exp.check, *exp.first_any)), (
                        f"{where}: {r.reason}"
                    )
                    failed = next(c for c in r.checks if c.name == exp.check)
                    assert not failed.passed and any(d in failed.detail for d in exp.detail), (
                        f"{where}: {failed.summary()}"
                    )
                    for name, words in exp.also:
                        other = next(c for c in r.checks if c.name == name)
                        assert not other.passed and words in other.detail, f"{where}: {other.summary()}"
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


# 7 decodes at k = 2: graphs of 8 (steps 0, 1), then 5 requests in the graph of 6 (step 2). The plan
# that dropped to 6 requests filled that graph exactly, and no padded row a larger step wrote was
# replayed: the stale tail passed.
GDN_DECODE7 = BatchSpec("decode7", (1,) * 7, (40, 20, 70, 9, 33, 51, 12))


def test_a_stale_spec_tail_is_red_where_a_step_drops_into_a_padded_decode_graph(mla_sessions):
    case = make_gdn_case("torch", "FULL_DECODE_ONLY", "auto", GDN_DECODE7, spec_tokens=2)
    plans = plan_steps(case.batch, case.model, case.capture_sizes, case.steps, case.seed, 2)
    assert [len(p.query_lens) for p in plans] == [7, 7, 5]
    for mode in MODES:
        bad = run_case(make_gdn_case(STALE, mode, "auto", GDN_DECODE7, spec_tokens=2), sessions=mla_sessions)
        good = run_case(make_gdn_case("torch", mode, "auto", GDN_DECODE7, spec_tokens=2), sessions=mla_sessions)
        assert good.status == Status.PASS, f"torch {mode}: {good.reason}"
        if mode in DECODE_GRAPH:
            assert bad.status == Status.FAIL and bad.reason.startswith("state_integrity check failed at step 2"), (
                f"{mode}: {bad.status.value} {bad.reason}"
            )
        else:
            assert bad.status == Status.PASS, f"{mode}: {bad.reason}"


def test_the_zeroed_offsets_are_a_verdict_under_the_gpu_churn_too(monkeypatch):
    """On a GPU the harness runs vLLM's dummy batch (a capture build) eagerly before every replay,
    PIECEWISE included (backend/harness/churn.py). There the later state group's zeroed rows reached
    the GDN core, which raised on shapes ("Expected size 1 but got size 3"): an ERROR of the
    harness. Emulated here: PIECEWISE passes (no graph holds attention metadata), FULL fails naming
    the shared field."""
    from backend.harness import checker
    from backend.harness.churn import dummy_step

    monkeypatch.setattr(checker, "churn", lambda session, n, size: dummy_step(session, n, size))
    sessions = SessionCache(capacity=8)
    pw = run_case(make_gdn_case(M + "ZeroedQueryStart", "PIECEWISE", spec_tokens=2), sessions=sessions)
    assert pw.status == Status.PASS, pw.reason
    full = run_case(make_gdn_case(M + "ZeroedQueryStart", "FULL_DECODE_ONLY", spec_tokens=2), sessions=sessions)
    state = next(c for c in full.checks if c.name == "state_integrity")
    assert full.status == Status.FAIL and "wrote the shared query_start_loc" in state.detail, full.reason


def test_rows_that_cannot_hold_the_steps_tokens_are_named():
    """gdn_groups.uncovered: a decode-only metadata whose state rows hold fewer tokens than the step
    runs (a non-spec decode row holds one, a spec row 1 + k); the family runs no core for it."""
    import torch

    from backend.attention.gdn import GDNMetadata
    from backend.families.gdn_groups import uncovered

    def md(spec, decodes, prefills=0, rows=2, cols=3):
        m = GDNMetadata(
            num_prefills=prefills,
            num_prefill_tokens=0,
            num_decodes=decodes,
            num_decode_tokens=0,
            num_spec_decodes=spec,
            num_spec_decode_tokens=0,
            num_actual_tokens=0,
            num_reqs=rows,
            num_padded_reqs=rows,
        )
        m.spec_state_indices_tensor = torch.zeros(rows, cols, dtype=torch.int32)
        m.non_spec_state_indices_tensor = torch.zeros(rows, dtype=torch.int32)
        return m

    assert uncovered(md(2, 0), 6) is None and uncovered(md(0, 2), 2) is None
    assert uncovered(md(0, 2, prefills=1), 6) is None and uncovered(md(0, 0), 6) is None
    assert uncovered(md(0, 2), 6) == (
        "non_spec_state_indices_tensor has 2 rows of 1 token for the step's 6 tokens (0 spec decodes, 2 decodes)"
    )
    assert uncovered(md(2, 0), 9).startswith("spec_state_indices_tensor has 2 rows of 3 tokens for the step's 9")


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
                r = run_case(
                    make_gdn_case("torch", mode, "auto", batch, spec_tokens=k, model=model), sessions=mla_sessions
                )
                assert r.status == Status.PASS, f"{state_dtype} {mode}/k{k}/{batch.kind}: {r.reason}"


@pytest.mark.slow
def test_gdn_on_a_tp_gang():
    """Key and value heads split over a gloo gang, each rank's state pages its heads' share."""
    r = run_case_local(make_gdn_case("torch", "FULL_DECODE_ONLY", "auto", GDN_DECODE, tp=2))
    assert r.status == Status.PASS, r.reason + r.log_tail[-1500:]
    bad = run_case_local(make_gdn_case(M + "PadClampedToZero", "FULL_DECODE_ONLY", "auto", GDN_DECODE, tp=2))
    assert bad.status == Status.FAIL and "[all ranks fail]" in bad.reason, bad.reason
