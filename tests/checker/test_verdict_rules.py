"""How failed checks become a verdict: the determinism rule (FLAKY only when eager jitter can
explain every other failure), on real providers with deliberately nondeterministic kernels."""

from __future__ import annotations

import pytest

from backend.checker import run_case
from backend.result import Status
from tests.checker.conftest import DECODE, MIXED, make_case

DETERMINISM_SCENARIOS = {
    # name: (backend, batch, status, first failed check named in the reason)
    "jitter only: flaky": ("tests.mutants.jittery:Backend", DECODE, Status.FLAKY, "eager not deterministic"),
    "ulp jitter on a wrong kernel: still a failure": ("tests.mutants.jittery:WrongBackend", MIXED, Status.FAIL,
                                                      "reference check failed"),
    "jitter but the bug is out of reach: flaky": ("tests.mutants.jittery:WrongBackend", DECODE, Status.FLAKY,
                                                  "eager not deterministic"),
}


@pytest.mark.parametrize("name", DETERMINISM_SCENARIOS)
def test_determinism_rule(name):
    backend, batch, status, reason = DETERMINISM_SCENARIOS[name]
    r = run_case(make_case(backend, "NONE", "auto", batch))
    assert r.status == status, (r.reason, [c.summary() for c in r.checks])
    assert r.reason.startswith(reason), r.reason
    det = next(c for c in r.checks if c.name == "determinism")
    assert not det.passed and det.max_abs_err > 0  # the measured jitter is recorded
