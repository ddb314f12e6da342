"""The mutation suite: each deliberately broken backend (tests/mutants) is flagged with the
expected status and check in exactly the expected places, and passes everywhere else.

Expectation table: for every mutant, a predicate over (mode, kv dtype, batch kind, tp) says where
the bug is reachable, and which status/check must be reported there. Every other cell must PASS:
a checker that flags a mutant everywhere is as broken as one that flags it nowhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from backend.harness.checker import run_case, run_case_local
from backend.result import Status
from tests.checker.conftest import DECODE, MIXED, make_case

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
FULL_DECODE_GRAPH = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")  # modes replaying decode in FULL


@dataclass(frozen=True)
class Expect:
    backend: str
    flagged: Callable[[str, str, str], bool]  # (mode, kv, batch kind) -> is the bug reachable here
    status: Status
    check: str  # first failed check (or error kind for ERROR)
    resolved: dict | None = None  # requested -> resolved mode, when resolution changes it
    # Checks that may come first in the reason (a coarser check that sees the bug on this small
    # shape); `check` itself must still have failed.
    first_any: tuple[str, ...] = ()


MUTANTS = {
    # Decode-branch freeze: unreachable under vLLM's capture (mixed graphs are captured with host
    # max_query_len = N, so the branch is frozen on the prefill side): a negative control now.
    "frozen max_query_len == 1 branch (decode-side freeze)": Expect(
        "tests.mutants.frozen_branch:Backend", lambda mode, kv, kind: False, Status.PASS, ""
    ),
    # The seed as it was (#22721 in 0.10.2): prefill branch captured, its per-step metadata stale
    # in every FULL mixed graph: the prefill rows are wrong. FULL has no decode graphs, so decode
    # batches replay a mixed graph too, but their rows take the decode kernel (live buffers): right,
    # as in vLLM 0.10.2 itself (docs/VLLM.md "The seed, replayed").
    "seed ROCM_AITER_FA 0.10.2: ALWAYS + fresh prefill metadata (#22721)": Expect(
        "tests.mutants.seed_aiter_fa:Backend",
        lambda mode, kv, kind: mode == "FULL" and kind == "mixed",
        Status.FAIL,
        "replay",
    ),
    "seed lowered to UNIFORM_SINGLE_TOKEN_DECODE (#25104)": Expect(
        "tests.mutants.seed_aiter_fa:FixedBackend",
        lambda mode, kv, kind: False,
        Status.PASS,
        "",
        resolved={"FULL": "FULL_AND_PIECEWISE"},
    ),
    "metadata reallocated each step": Expect(
        "tests.mutants.fresh_metadata:Backend",
        lambda mode, kv, kind: mode == "FULL" or (mode in FULL_DECODE_GRAPH and kind == "decode"),
        Status.FAIL,
        "replay",
    ),
    "padded slot -1 wraps into the cache": Expect(
        "tests.mutants.padded_slot_write:Backend",
        lambda mode, kv, kind: mode == "FULL" or (mode in FULL_DECODE_GRAPH and kind == "decode"),
        Status.FAIL,
        "kv_integrity",
    ),
    "fp8 scale frozen on the capture path (#49010)": Expect(
        "tests.mutants.fp8_scale_capture:Backend",
        lambda mode, kv, kind: kv == "fp8" and (mode == "FULL" or (mode in FULL_DECODE_GRAPH and kind == "decode")),
        Status.FAIL,
        "replay",
    ),
    "prefill output overwritten by decode kernel": Expect(
        "tests.mutants.wrong_prefill:Backend", lambda mode, kv, kind: kind == "mixed", Status.FAIL, "reference"
    ),
    "support overstated as ALWAYS": Expect(
        "tests.mutants.overstated_support:Backend",
        lambda mode, kv, kind: mode == "FULL" and kind == "mixed",
        Status.FAIL,
        "replay",
    ),
    "same code, honest UNIFORM_SINGLE_TOKEN_DECODE": Expect(
        "tests.mutants.overstated_support:HonestBackend",
        lambda mode, kv, kind: False,
        Status.PASS,
        "",
        resolved={"FULL": "FULL_AND_PIECEWISE"},
    ),
    "host sync in forward (pa_decode's k_scale.item())": Expect(
        "tests.mutants.host_sync:Backend",
        lambda mode, kv, kind: mode == "FULL" or (mode in FULL_DECODE_GRAPH and kind == "decode"),
        Status.ERROR,
        "capture",
    ),
    "host sync inside a custom op (AITER op wrapping k_scale.item())": Expect(
        "tests.mutants.customop_host_sync:Backend",
        lambda mode, kv, kind: mode == "FULL" or (mode in FULL_DECODE_GRAPH and kind == "decode"),
        Status.ERROR,
        "capture",
    ),
    # The seed inside a torch.library custom op reading the forward context (vLLM's
    # unified_attention form): red exactly where the plain seed is, once the op body is recorded.
    "seed inside a custom op reading the forward context": Expect(
        "tests.mutants.customop_seed:Backend",
        lambda mode, kv, kind: mode == "FULL" and kind == "mixed",
        Status.FAIL,
        "replay",
    ),
    "control: the torch impl through the same custom op and forward context": Expect(
        "tests.mutants.customop_seed:ControlBackend", lambda mode, kv, kind: False, Status.PASS, ""
    ),
    # Near-threshold, where benchmarks/gpu_tolerances.py REACHABLE says: red there,
    # green elsewhere (auto kv has both scales 1.0, so V's scale cannot be wrong).
    "V dequantised with K's scale": Expect(
        "tests.mutants.near_threshold:VWithKScale", lambda mode, kv, kind: kv == "fp8", Status.FAIL, "reference"
    ),
    "V read back 1.25x": Expect(
        "tests.mutants.near_threshold:VScale125", lambda mode, kv, kind: kv == "fp8", Status.FAIL, "reference"
    ),
    "one query head zeroed": Expect(
        "tests.mutants.near_threshold:HeadZeroed", lambda mode, kv, kind: True, Status.FAIL, "reference"
    ),
    "a token cannot attend itself": Expect(
        "tests.mutants.near_threshold:NoSelf", lambda mode, kv, kind: True, Status.FAIL, "reference"
    ),
    # Inside the residual tolerance on this shape: only the per-head attention checks see these.
    "one query head 10% low": Expect(
        "tests.mutants.near_threshold:HeadScaled",
        lambda mode, kv, kind: True,
        Status.FAIL,
        "attn_reference",
        first_any=("reference",),
    ),
    "one query head 10% low in captured graphs only": Expect(
        "tests.mutants.near_threshold:HeadScaledCaptured",
        lambda mode, kv, kind: mode == "FULL" or (mode in FULL_DECODE_GRAPH and kind == "decode"),
        Status.FAIL,
        "attn_replay",
        first_any=("replay",),
    ),
    "NaN left in padded output rows": Expect(
        "tests.mutants.padded_nan:Backend",
        lambda mode, kv, kind: mode == "FULL" or (mode in FULL_DECODE_GRAPH and kind == "decode"),
        Status.FAIL,
        "padded_finite",
    ),
}


@pytest.mark.parametrize("name", MUTANTS)
def test_mutant_flagged_exactly_where_reachable(name, sessions):
    exp = MUTANTS[name]
    seen = []
    for kv in ("auto", "fp8"):
        for batch in (DECODE, MIXED):
            for mode in MODES:
                r = run_case(make_case(exp.backend, mode, kv, batch), sessions=sessions)
                flagged = exp.flagged(mode, kv, batch.kind)
                want = exp.status if flagged else Status.PASS
                where = f"{name}: {mode}/{kv}/{batch.kind}"
                assert r.status == want, f"{where}: {r.status.value} {r.reason}"
                if want == Status.FAIL:
                    assert any(r.reason.startswith(f"{c} check failed") for c in (exp.check, *exp.first_any)), (
                        f"{where}: {r.reason}"
                    )
                    assert not next(c for c in r.checks if c.name == exp.check).passed, f"{where}: {r.reason}"
                if want == Status.ERROR:
                    assert r.error_kind == exp.check, f"{where}: {r.error_kind} {r.reason}"
                resolved = (exp.resolved or {}).get(mode, mode)
                if r.status != Status.ERROR or r.resolved_mode:
                    assert r.resolved_mode == resolved and r.downgraded == (resolved != mode), where
                seen.append(flagged)
    assert any(seen) or exp.status == Status.PASS  # the table never declares a mutant invisible


def test_reasons_point_at_the_bad_rows(sessions):
    """The overstated-support mutant drops the causal mask inside the prefill row (row 1, tokens
    1..4) of the mixed batch; the other rows stay right."""
    r = run_case(make_case("tests.mutants.overstated_support:Backend", "FULL", "auto", MIXED), sessions=sessions)
    replay = next(c for c in r.checks if c.name == "replay")
    assert replay.step == 0 and replay.first_bad[0] in (1, 2, 3, 4)
    assert "first bad row" in r.reason and "max_abs" in r.reason and "mismatched" in r.reason


def test_replay_reason_names_the_requests_of_the_bad_rows(sessions):
    """The seed replays stale prefill metadata: the reason names the one prefill request (row 1,
    query len 4), not the decode rows around it, which the decode kernel wrote from live buffers."""
    from backend.harness.checks import rows_by_request

    r = run_case(make_case("tests.mutants.seed_aiter_fa:Backend", "FULL", "auto", MIXED), sessions=sessions)
    assert r.status == Status.FAIL and r.reason.startswith("replay check failed")
    assert "bad rows 4/6 in request 1 (q 4)" in r.reason, r.reason
    # The naming itself: whole requests, part of one, and rows past the last request (padding).
    assert rows_by_request((1, 2, 3, 4), (1, 4, 1)) == "bad rows 4/6 in request 1 (q 4)"
    assert (
        rows_by_request((0, 2, 7), (1, 4, 1))
        == "bad rows 3/6 in requests 0 (q 1), 1 (1 of q 4), 1 past the last request"
    )
    assert rows_by_request((), (1,)) == ""


def test_customop_seed_needs_the_body_recorded(monkeypatch):
    """Break the emulation on purpose: record custom ops as one opaque call (the body re-runs at
    replay, reading the live forward context) and the seed in a custom op passes FULL: the silent
    green it once gave. The real recorder turns the same cell red. On the CPU device (the emulated
    runner) also on a GPU machine, where the default device would capture real CUDA graphs, which
    need no recorder (there the mutant is red: test_mutants' table)."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    from backend.graphs import emulated, provenance
    from backend.harness.checker import SessionCache

    case = make_case("tests.mutants.customop_seed:Backend", "FULL", "auto", MIXED)
    cpu = torch.device("cpu")
    assert run_case(case, device=cpu, sessions=SessionCache(capacity=2)).status == Status.FAIL

    def opaque(self, func, args, kwargs):
        with _disable_current_modes():
            out = func(*args, **kwargs)
        self.ops.append(emulated._Op(func, args, kwargs, out, "run"))
        return out

    monkeypatch.setattr(emulated._Recorder, "_custom_op", opaque)
    # and the host-provenance mode hands the op itself on, not its body (the other modes run the body there)
    monkeypatch.setattr(provenance, "custom_op_body", lambda func: None)
    r = run_case(case, device=cpu, sessions=SessionCache(capacity=2))
    assert r.status == Status.PASS, r.reason


# TP: one spawned gloo gang per case (a few seconds each), so only the cells that matter.
TP_SCENARIOS = {
    # (backend, tp, mode): expected status
    ("torch", 2, "FULL"): Status.PASS,
    ("torch", 2, "PIECEWISE"): Status.PASS,
    ("tests.mutants.tp_head_shard:Backend", 2, "NONE"): Status.FAIL,
    ("tests.mutants.tp_head_shard:Backend", 2, "FULL"): Status.FAIL,
    ("tests.mutants.tp_head_shard:Backend", 1, "FULL"): Status.PASS,
    # all-reduce skipped while capturing: replays lack the reduction at tp 2, eager is right.
    ("tests.mutants.allreduce_capture:Backend", 2, "PIECEWISE"): Status.FAIL,
    ("tests.mutants.allreduce_capture:Backend", 2, "FULL"): Status.FAIL,
    ("tests.mutants.allreduce_capture:Backend", 2, "NONE"): Status.PASS,
    ("tests.mutants.allreduce_capture:Backend", 1, "FULL"): Status.PASS,
}
TP_FAILED_CHECK = {
    "tests.mutants.tp_head_shard:Backend": "reference",
    "tests.mutants.allreduce_capture:Backend": "replay",
}


@pytest.mark.slow
@pytest.mark.parametrize("key", TP_SCENARIOS, ids=lambda k: f"{k[0].rsplit('.', 1)[-1]}-tp{k[1]}-{k[2]}")
def test_tp_gang(key):
    backend, tp, mode = key
    r = run_case_local(make_case(backend, mode, "auto", MIXED, tp=tp))
    assert r.status == TP_SCENARIOS[key], r.reason + r.log_tail[-1500:]
    if tp == 2:
        assert r.worker == "rank0,rank1"
    if r.status == Status.FAIL:
        assert r.reason.startswith(f"rank 0: {TP_FAILED_CHECK[backend]} check failed"), r.reason
        assert "[all ranks fail]" in r.reason


# Spec decode (k > 0, DESIGN.md §4b): (mode, batch kind at k, k) -> reachable. Batches: DECODE
# becomes 3 verify rows of q = 1 + k (uniform); MIXED (1, 4, 1) at k = 2 is (3, 4, 3), not uniform.
SPLIT = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")  # UNIFORM_BATCH: FULL -> FULL_AND_PIECEWISE
# Resolution at k > 0 (requested -> resolved, others unchanged): vLLM's spec-decode rule sends a
# backend below UNIFORM_BATCH from any FULL decode mode to PIECEWISE; UNIFORM_BATCH keeps its
# decode graphs and only mixed FULL drops to FULL_AND_PIECEWISE.
UNIFORM_K = {"FULL": "FULL_AND_PIECEWISE"}
SINGLE_TOKEN_K = dict.fromkeys(SPLIT, "PIECEWISE")
SPEC_MUTANTS = {
    "decode kernel reads one query token per request": Expect(
        "tests.mutants.one_query_token:Backend",
        lambda mode, kind, k: k > 0 and kind == "decode",
        Status.FAIL,
        "reference",
        resolved=UNIFORM_K,
    ),
    "UNIFORM_BATCH overstated: verify split frozen from the capture batch": Expect(
        "tests.mutants.partition_frozen:Backend",
        lambda mode, kind, k: k > 0 and kind == "decode" and mode in SPLIT,
        Status.FAIL,
        "replay",
        resolved=UNIFORM_K,
    ),
    "same code, honest UNIFORM_SINGLE_TOKEN_DECODE (k > 0: PIECEWISE)": Expect(
        "tests.mutants.partition_frozen:HonestBackend",
        lambda mode, kind, k: False,
        Status.PASS,
        "",
        resolved=SINGLE_TOKEN_K,
    ),
    "max_query_len == 1 branch under a k > 0 capture (control)": Expect(
        "tests.mutants.decode_branch_spec:Backend", lambda mode, kind, k: False, Status.PASS, "", resolved=UNIFORM_K
    ),
    # ALWAYS overstated, fast path chosen on num_tokens == num_reqs (host, frozen at capture). FULL
    # has no decode graphs: its mixed graphs of N <= max_num_seqs tokens are captured on N one-token
    # requests, i.e. on the fast path, so at k > 0 the verify batches (q = 1 + k) replay it too and
    # the uniform decode cells turn red as well; split modes capture decode graphs on size / q
    # requests of q tokens (not the fast path) and stay green.
    "support overstated as ALWAYS (k > 0: verify batches through the mixed graphs)": Expect(
        "tests.mutants.overstated_support:Backend",
        lambda mode, kind, k: mode == "FULL" and (kind == "mixed" or k > 0),
        Status.FAIL,
        "replay",
    ),
    "same code, honest UNIFORM_SINGLE_TOKEN_DECODE (k > 0: no FULL decode graph)": Expect(
        "tests.mutants.overstated_support:HonestBackend",
        lambda mode, kind, k: False,
        Status.PASS,
        "",
        resolved=SINGLE_TOKEN_K,
    ),
}


@pytest.mark.parametrize("name", SPEC_MUTANTS)
def test_spec_mutant_flagged_exactly_where_reachable(name, sessions):
    exp = SPEC_MUTANTS[name]
    for k in (0, 2):
        for batch in (DECODE, MIXED):
            for mode in MODES:
                r = run_case(make_case(exp.backend, mode, "auto", batch, spec_tokens=k), sessions=sessions)
                want = exp.status if exp.flagged(mode, batch.kind, k) else Status.PASS
                where = f"{name}: {mode}/k{k}/{batch.kind}"
                assert r.status == want, f"{where}: {r.status.value} {r.reason}"
                if want == Status.FAIL:
                    assert r.reason.startswith(f"{exp.check} check failed"), f"{where}: {r.reason}"
                if k > 0:
                    resolved = (exp.resolved or {}).get(mode, mode)
                    assert r.resolved_mode == resolved and r.downgraded == (resolved != mode), (
                        f"{where}: {r.resolved_mode}"
                    )
                    if resolved == "PIECEWISE" and mode != "PIECEWISE":
                        assert "with spec-decode for attention backend" in r.log_tail, where


def test_frozen_partition_is_a_v2_capture_hazard(sessions):
    """V1 captures with seq_lens = max_model_len, so the frozen split covers every replay."""
    import dataclasses

    from tests.checker.conftest import TINY

    for style, want in (("v1", Status.PASS), ("v2", Status.FAIL)):
        model = dataclasses.replace(TINY, capture_style=style)
        r = run_case(
            make_case(
                "tests.mutants.partition_frozen:Backend", "FULL_DECODE_ONLY", "auto", DECODE, spec_tokens=2, model=model
            ),
            sessions=sessions,
        )
        assert r.status == want, f"{style}: {r.reason}"
