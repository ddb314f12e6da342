"""A results DB whose run has spec-decode cases (k = 0 and k = 2 of the same shapes), one k = 2
case failing, for the JUnit / summary / dashboard tests of k. Plain results, no torch or Ray."""

from __future__ import annotations

import dataclasses

from backend.case import BatchSpec, Case
from backend.result import Status
from orchestrator.store import NewRun, ResultStore
from tests.results.samples import _checks, result_for

BATCH = BatchSpec("dec4", (1, 1, 1, 1), (17, 33, 40, 64))
FAILING_K2 = "tp1-FULL-auto-k2-dec4-torch-s0"
PASSING_K0 = "tp1-FULL-auto-dec4-torch-s0"


def cases() -> list[Case]:
    return [
        Case("torch", 1, mode, "auto", BATCH, matrix="matrices/spec.yaml", spec_tokens=k)
        for mode in ("NONE", "FULL")
        for k in (0, 2)
    ]


def write_db(tmp_path) -> str:
    path = str(tmp_path / "spec.db")
    cs = cases()
    with ResultStore(path) as s:
        rid = s.create_run(NewRun(matrix="matrices/spec.yaml", cases=cs))
        for c in cs:
            if c.case_id == FAILING_K2:
                r = result_for(
                    c, Status.FAIL, reason="replay: graph replay differs from eager at step 1", checks=_checks("replay")
                )
            else:
                r = result_for(c)
            s.record(rid, r)
        s.finish_run(rid, "finished")
    return path


def old_result():
    """A result stored before the axis existed: its axes have no spec_tokens key."""
    c = cases()[0]
    r = result_for(c)
    axes = {k: v for k, v in r.axes.items() if k != "spec_tokens"}
    return dataclasses.replace(r, axes=axes)
