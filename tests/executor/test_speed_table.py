"""benchmarks/speed_table.py's rerun tail: how long a run went on after its last case that was not
rerun for memory (the H100's families' slice: 5.8 s of 50.8 s, six cases widened to a whole GPU)."""

from __future__ import annotations

import pytest

from backend.result import CaseResult, Status
from benchmarks.speed_table import rerun_tail
from orchestrator.executor.attempts import REFRESHED, WIDENED


def _r(case_id: str, note: str = "") -> CaseResult:
    return CaseResult(case_id, Status.PASS, log_tail=f"{note}: rerun\nmore" if note else "")


@pytest.mark.parametrize("notes, finished, tail", [
    ({}, {"a": 1.0, "b": 2.0}, 0.0),                              # nothing rerun
    ({"b": WIDENED}, {"a": 3.0, "b": 5.5}, 2.5),                 # widened: after every other case
    ({"b": REFRESHED}, {"a": 3.0, "b": 2.0}, 0.0),               # a fresh worker, done before the end
    ({"b": WIDENED, "c": REFRESHED}, {"a": 1.0, "b": 4.0, "c": 2.0}, 3.0),
    ({"a": WIDENED}, {"a": 1.0}, 0.0),                            # nothing else to end before it
])  # fmt: skip # a table: one row per line, as it reads
def test_rerun_tail(notes, finished, tail):
    ran = [_r(c, notes.get(c, "")) for c in finished]
    assert rerun_tail(ran, finished) == pytest.approx(tail)
