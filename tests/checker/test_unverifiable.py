"""Issue #32: a kernel launched behind PyTorch's dispatcher. A real graph captures it; the CPU
emulation replays a ctypes launch (the case passes, as on a GPU) and says `emulation: unverifiable`
for a launch it cannot see (numpy's C code on raw addresses), which the gate counts apart from
pass: never a silent pass, never a false red. Real checker, real gate, CPU."""

from __future__ import annotations

import pytest
import torch

from backend.harness.checker import run_case
from backend.result import UNVERIFIABLE_PREFIX, Status
from orchestrator.gate import GATING, evaluate
from tests.checker.conftest import DECODE, make_case

CPU = torch.device("cpu")


@pytest.mark.parametrize("mode", ["FULL", "NONE"])
def test_a_ctypes_launch_on_raw_pointers_replays_like_a_kernel(mode):
    r = run_case(make_case("tests.mutants.raw_pointer:CtypesBackend", mode, batch=DECODE), device=CPU)
    assert r.status == Status.PASS and r.reason == "", (r.reason, [c.summary() for c in r.checks])


# The replay reads the scratch the copy left: stale values, or NaN where the pool's uninitialised
# bytes are read (then `finite` fails on the graph side too, and must still count as graph-only).
@pytest.mark.parametrize("backend", ["CExtensionBackend", "PoisonedCExtensionBackend"])
def test_a_launch_the_emulation_cannot_see_is_unverifiable_not_a_pass_nor_a_failure(backend):
    r = run_case(make_case(f"tests.mutants.raw_pointer:{backend}", "FULL", batch=DECODE), device=CPU)
    assert r.unverifiable and r.reason.startswith(UNVERIFIABLE_PREFIX), (r.status, r.reason)
    assert "Tensor.data_ptr() at raw_pointer.py" in r.reason
    # Only the graph side could fail: the replay did not redo the copy the emulation cannot see.
    assert {c.name for c in r.failed_checks} <= {"replay", "attn_replay", "padded_finite", "finite", "kv_integrity"}
    assert not any("outside" in c.detail for c in r.failed_checks)
    gate = evaluate([r])
    assert gate.classification[r.case_id] == "unverifiable" and "unverifiable" not in GATING
    assert gate.unverifiable == (r.case_id,) and gate.counts["pass"] == 0
    assert "1 unverifiable on the emulation" in gate.verdict()
    # Eager runs it for real: without graphs there is nothing to be unsure about.
    eager = run_case(make_case(f"tests.mutants.raw_pointer:{backend}", "NONE", batch=DECODE), device=CPU)
    assert eager.status == Status.PASS and eager.reason == ""
