"""The eager path's graph side (NONE, and the steps other modes run eagerly) is judged from the
eager side's second run (backend/harness/sides.py eager_side): the same run from the same
snapshot that a third eager step would have been. These pin that the verdicts are those of the
third run, whatever mode a config runs first, for correct backends and for one whose writes
land outside its slots in every run, and that a config's NONE case then runs no eager step."""

from __future__ import annotations

import pytest

from backend.harness import sides
from backend.harness.checker import SessionCache, run_case
from backend.harness.session import Session
from tests.checker.conftest import DECODE, MIXED, make_case

STRAY = "tests.mutants.stray_write_every_run:Backend"
ORDERS = {
    "none-first": ("NONE", "FULL", "PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"),
    "full-first": ("FULL", "FULL_DECODE_ONLY", "NONE", "PIECEWISE", "FULL_AND_PIECEWISE"),
}


def _verdicts(monkeypatch, reuse: bool, order: tuple[str, ...]) -> list[tuple]:
    if not reuse:
        monkeypatch.setattr(sides, "second_run_as_eager_path", lambda session, state: False)
    sessions = SessionCache(capacity=8)
    out = []
    for backend in ("torch", STRAY):
        for kv in ("auto", "fp8"):
            for batch in (DECODE, MIXED):
                for mode in order:
                    r = run_case(make_case(backend, mode, kv, batch), sessions=sessions)
                    out.append(
                        (r.case_id, r.status, r.reason, tuple((c.name, c.passed, c.step, c.detail) for c in r.checks))
                    )
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("order", ORDERS, ids=list(ORDERS))
def test_the_eager_path_judged_from_the_second_run_gives_the_third_runs_verdicts(monkeypatch, order):
    reused = _verdicts(monkeypatch, True, ORDERS[order])
    ran = _verdicts(monkeypatch, False, ORDERS[order])
    assert reused == ran
    correct = [(cid, s) for cid, s, *_ in reused if cid.endswith("-torch-s0")]
    stray = {cid: (s, reason) for cid, s, reason, _ in reused if cid.endswith("-Backend-s0")}
    assert len(correct) == len(stray) == 20 and all(s.value == "pass" for _, s in correct), correct
    # an eager run's outside write is seen where the eager path is the graph side: NONE
    assert all(
        s.value == "fail" and "written outside" in reason for cid, (s, reason) in stray.items() if "-NONE-" in cid
    ), stray


def test_a_configs_none_case_runs_no_eager_step_of_its_own(monkeypatch):
    sessions = SessionCache(capacity=8)
    assert run_case(make_case("torch", "FULL", "auto", MIXED), sessions=sessions).status.value == "pass"
    calls = []
    real = Session.run_eager_step
    monkeypatch.setattr(Session, "run_eager_step", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    r = run_case(make_case("torch", "NONE", "auto", MIXED), sessions=sessions)
    assert r.status.value == "pass" and not calls, (r.reason, len(calls))


ACCUMULATE = "tests.mutants.stray_accumulate:Backend"


def test_a_first_run_that_wrote_outside_is_undone_before_the_second(monkeypatch):
    """A backend whose every run moves a context byte it reads: the second eager run (the eager
    path's graph side) must start from the snapshot as a third run would, or it reads the byte
    moved twice and eager looks nondeterministic. Pins the whole restore between the runs (red
    without it)."""
    got = {}
    for reuse in (True, False):
        if not reuse:
            monkeypatch.setattr(sides, "second_run_as_eager_path", lambda session, state: False)
        sessions = SessionCache(capacity=8)
        got[reuse] = [
            (r.status, r.reason, tuple((c.name, c.passed, c.detail) for c in r.checks))
            for batch in (DECODE, MIXED)
            for r in [run_case(make_case(ACCUMULATE, "NONE", "auto", batch), sessions=sessions)]
        ]
        monkeypatch.undo()
    assert got[True] == got[False]
    for status, reason, checks in got[True]:
        passed = {name: ok for name, ok, _ in checks}
        assert status.value == "fail" and passed["determinism"] and not passed["kv_integrity"], (reason, checks)
