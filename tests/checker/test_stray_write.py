"""A deterministic stray KV write fails on every attempt, in every mode that pads.

The padded_slot_write mutant writes a padded token's K/V through slot -1 (the cache's last slot).
It was green in one mode and FLAKY in another: the capture's warm-up ran it on the same padded
input rows a later step used, so the step rewrote bytes that were already there, and nothing
checked what making a graph wrote. Now making a graph is checked and every replay's padded rows
are new (scratch.capture_checked, sides.pad_seed)."""

from __future__ import annotations

import pytest

from backend.harness import checker, sides
from backend.harness.checker import SessionCache, run_case
from backend.result import Status
from tests.checker.conftest import BatchSpec, make_case

STRAY = "tests.mutants.padded_slot_write:Backend"
# 8 decode rows: a capture size, so step 0 replays unpadded and only the varied steps pad.
DECODE8 = BatchSpec("decode8", (1,) * 8, (40, 20, 70, 33, 17, 90, 64, 5))
PADDING_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def attempts(mode: str, seed: int, shared: SessionCache) -> list:
    """The case three times: twice in a worker's long-lived session, once in a fresh one (a retry)."""
    case = make_case(STRAY, mode, "auto", DECODE8, seed=seed)
    return [
        run_case(case, sessions=shared),
        run_case(case, sessions=shared),
        run_case(case, sessions=SessionCache(capacity=1)),
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_attempt_fails_kv_integrity_in_every_padding_mode(seed):
    shared = SessionCache(capacity=8)
    for mode in PADDING_MODES:
        for r in attempts(mode, seed, shared):
            # FAIL, never FLAKY or PASS; kv_integrity failed (replay may come first in the reason
            # when the last slot belongs to one of the step's own requests on this small cache)
            assert r.status == Status.FAIL, f"{mode}: {r.status.value} {r.reason}"
            kv = next(c for c in r.checks if c.name == "kv_integrity")
            assert not kv.passed and "written" in kv.detail, f"{mode}: {kv.detail}"


def test_unpadded_modes_stay_green():
    shared = SessionCache(capacity=8)
    for mode in ("NONE", "PIECEWISE"):
        for r in attempts(mode, 0, shared):
            assert r.status == Status.PASS, f"{mode}: {r.reason}"


def test_without_the_checks_the_stray_write_can_pass(monkeypatch):
    """Break the fix on purpose (the old pad seed and no check of what capture writes): some
    attempt passes again, so the test above can fail."""
    monkeypatch.setattr(sides, "pad_seed", lambda case, step, session: checker.hash_seed(case.seed, step, 31))
    monkeypatch.setattr(checker, "capture_checked", lambda session, keys: session.ensure_graphs(keys))
    # And no churn (GPU): its dummy step runs the mutant too and writes other bytes into the slot,
    # which the replay's write then changes: a second, independent catch of the same write.
    monkeypatch.setattr(checker, "churn", lambda *a: None)
    shared = SessionCache(capacity=8)
    statuses = [r.status for mode in PADDING_MODES for seed in (0, 1, 2) for r in attempts(mode, seed, shared)]
    assert Status.PASS in statuses and Status.FAIL in statuses, statuses
