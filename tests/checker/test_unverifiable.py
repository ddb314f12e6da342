"""A kernel launched behind PyTorch's dispatcher. A real graph captures it; the
CPU emulation replays a ctypes launch (the case passes, as on a GPU) and says `emulation:
unverifiable` for a launch it cannot see (numpy's C code on raw addresses). Where every check passed
that is a pass the gate counts apart; where the replay disagreed it is UNVERIFIABLE, which fails the
gate unless allowed: never a silent pass, never a false red. Real checker, real gate, CPU."""

from __future__ import annotations

import pytest

from backend.harness.checker import run_case, run_case_local
from backend.result import UNVERIFIABLE_ADVICE, UNVERIFIABLE_PREFIX, Status
from orchestrator.errors import ExitCode
from orchestrator.gate import GateRules, evaluate
from tests.checker.conftest import CPU, DECODE, GANG_DEVICES, MIXED, make_case


@pytest.mark.parametrize("mode", ["FULL", "NONE"])
def test_a_ctypes_launch_on_raw_pointers_replays_like_a_kernel(mode):
    r = run_case(make_case("tests.mutants.raw_pointer:CtypesBackend", mode, batch=DECODE), device=CPU)
    assert r.status == Status.PASS and r.reason == "", (r.reason, [c.summary() for c in r.checks])


# The replay reads the scratch the copy left: stale values, or NaN where the pool's uninitialised
# bytes are read (then `finite` fails on the graph side too, and must still count as graph-only).
@pytest.mark.parametrize("backend", ["CExtensionBackend", "PoisonedCExtensionBackend"])
def test_a_disagreement_on_a_launch_the_emulation_cannot_see_is_unverifiable_and_gates(backend):
    r = run_case(make_case(f"tests.mutants.raw_pointer:{backend}", "FULL", batch=DECODE), device=CPU)
    # The emulation saw the replay disagree; it cannot say why, but it is never a pass.
    assert r.status == Status.UNVERIFIABLE and not r.unverifiable, (r.status, r.reason)
    assert r.reason.startswith(UNVERIFIABLE_PREFIX) and r.reason.endswith(UNVERIFIABLE_ADVICE)
    assert "Tensor.data_ptr() at raw_pointer.py" in r.reason
    # Only the graph side could fail: the replay did not redo the copy the emulation cannot see.
    assert r.failed_checks and {c.name for c in r.failed_checks} <= {
        "replay",
        "attn_replay",
        "padded_finite",
        "finite",
        "kv_integrity",
    }
    assert not any("outside" in c.detail for c in r.failed_checks)
    gate = evaluate([r])
    assert gate.classification[r.case_id] == "unverifiable" and gate.exit_code == ExitCode.GATE_FAILED
    assert gate.unverifiable == (r.case_id,) and gate.counts["pass"] == 0
    assert "1 unverifiable (run on a GPU to decide)" in gate.verdict()
    allowed = evaluate([r], rules=GateRules(allow_unverifiable=True))
    assert allowed.exit_code == ExitCode.OK and allowed.unverifiable == (r.case_id,)
    assert "1 unverifiable allowed" in allowed.verdict()
    # Eager runs it for real: without graphs there is nothing to be unsure about.
    eager = run_case(make_case(f"tests.mutants.raw_pointer:{backend}", "NONE", batch=DECODE), device=CPU)
    assert eager.status == Status.PASS and eager.reason == ""


def test_a_pass_on_a_launch_the_emulation_cannot_see_stays_a_pass_counted_apart():
    """A pointer taken and nothing launched on it (an alignment check): the replay agrees, PASS with
    the reason prefix, counted apart and not gating."""
    r = run_case(make_case("tests.mutants.raw_pointer:AlignmentCheckBackend", "FULL", batch=DECODE), device=CPU)
    assert r.status == Status.PASS and r.unverifiable and r.reason.startswith(UNVERIFIABLE_PREFIX), r.reason
    gate = evaluate([r])
    assert gate.classification[r.case_id] == "pass-unverifiable" and gate.exit_code == ExitCode.OK
    assert gate.pass_unverifiable == (r.case_id,) and gate.unverifiable == ()


# The tp 2 shape: a custom all-reduce that records the buffer's address while capturing and
# skips the reduction. Was PASS ("emulation: unverifiable") and the gate passed (exit 0).
# On two GPUs real graphs hold no reduction either, and nothing is unverifiable there: FAIL replay.
@pytest.mark.parametrize("device", GANG_DEVICES, ids=str)
@pytest.mark.parametrize(
    "mode, status", [("FULL", Status.UNVERIFIABLE), ("PIECEWISE", Status.UNVERIFIABLE), ("NONE", Status.PASS)]
)
def test_an_allreduce_skipped_in_capture_behind_a_raw_pointer_fails_the_gate_at_tp2(mode, status, device):
    r = run_case_local(
        make_case("tests.mutants.allreduce_registered:Backend", mode, "auto", MIXED, tp=2), device=device
    )
    if device.type == "cuda" and status == Status.UNVERIFIABLE:
        status = Status.FAIL
    assert r.status == status, (r.status, r.reason)
    if status == Status.UNVERIFIABLE:
        assert "allreduce_registered.py" in r.reason and UNVERIFIABLE_ADVICE in r.reason
    if status != Status.PASS:
        assert "replay" in {c.name for c in r.failed_checks}
        assert evaluate([r]).exit_code == ExitCode.GATE_FAILED
