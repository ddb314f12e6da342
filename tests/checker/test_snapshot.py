"""The step snapshot after a verified step copies only the slots the context fill wrote
(scratch.take_snapshot). Whatever the path, the snapshot must equal the caches byte for byte when
it is taken: checked on every step of a sequence of cases that shares one session, with graphs
captured in between, a backend that writes outside its slots, and another session on the same
scratch buffers; and the verdicts must be those of the whole-cache copy."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from backend.harness import checker, scratch, sides
from backend.harness.checker import SessionCache, run_case
from backend.harness.checks import raw
from tests.checker.conftest import DECODE, MIXED, TINY, make_case
from tests.families.conftest import DECODE as MLA_DECODE
from tests.families.conftest import make_case as make_mla_case

BIG = dataclasses.replace(TINY, num_blocks=256)  # contexts well under a quarter of the cache: partial copies
SEQUENCE = [  # (backend, mode, kv, batch): the worker's order, modes of a batch in a row
    *[("torch", m, "auto", MIXED) for m in ("FULL", "PIECEWISE", "NONE", "FULL_AND_PIECEWISE")],
    ("tests.mutants.padded_slot_write:Backend", "FULL", "auto", DECODE),  # writes outside its slots
    *[("torch", m, "auto", DECODE) for m in ("FULL_DECODE_ONLY", "FULL", "NONE")],  # new graphs captured
    ("torch", "FULL", "fp8", MIXED),  # another session, other buffers
    *[("torch", m, "auto", MIXED) for m in ("FULL", "NONE")],
]


def _run(sequence, monkeypatch, *, partial: bool):
    calls = {"partial": 0, "full": 0}
    problems: list[str] = []
    real = scratch.take_snapshot

    def checked(caches, session=None, written=None):
        # Which path ran is observed, not re-derived from the threshold: the whole-cache path
        # copy_()s into every scratch buffer, the partial one into none.
        copied: list[int] = []
        tensor_copy = torch.Tensor.copy_

        def spy(self, *args, **kwargs):
            copied.append(self.data_ptr())
            return tensor_copy(self, *args, **kwargs)

        torch.Tensor.copy_ = spy
        try:
            bufs = real(caches, session, written)
        finally:
            torch.Tensor.copy_ = tensor_copy
        # Recorded, not asserted here: run_case turns an exception into an ERROR verdict.
        whole = [b.data_ptr() in copied for b in bufs]
        if not len(bufs) == len(caches) > 0:
            problems.append(f"{len(bufs)} snapshots of {len(caches)} caches")
        elif not all(torch.equal(raw(b), raw(c)) for b, c in zip(bufs, caches)):
            problems.append("the snapshot is not the caches' state")
        elif any(whole) and not all(whole):
            problems.append(f"some caches copied whole, some partially: {whole}")
        calls["full" if all(whole) else "partial"] += 1
        return bufs

    monkeypatch.setattr(checker, "take_snapshot", checked)  # the step loop's
    # The GPU's churn leaves the scratch out of sync before every replay (its dummy step ran the
    # backend): the partial path is this test's subject, churn's own tests are elsewhere.
    monkeypatch.setattr(checker, "churn", lambda *a: None)
    monkeypatch.setattr(scratch, "PARTIAL_SNAPSHOT_MAX", 0.25 if partial else -1.0)
    scratch.SCRATCH.clear()
    sessions = SessionCache(capacity=8)
    results = [run_case(make_case(b, m, kv, batch, model=BIG), sessions=sessions) for b, m, kv, batch in sequence]
    assert not problems, problems
    return results, calls


def test_snapshot_equals_the_caches_on_every_step_and_verdicts_do_not_change(monkeypatch):
    fast, calls = _run(SEQUENCE, monkeypatch, partial=True)
    slow, slow_calls = _run(SEQUENCE, monkeypatch, partial=False)
    assert calls["partial"] >= 10 and calls["full"] >= 3, calls  # both paths were taken
    assert slow_calls["partial"] == 0
    assert len(fast) == len(slow) == len(SEQUENCE)
    for a, b in zip(fast, slow):
        assert (a.case_id, a.status, a.reason) == (b.case_id, b.status, b.reason)
        assert [(c.name, c.passed, c.step) for c in a.checks] == [(c.name, c.passed, c.step) for c in b.checks]
    mutant = fast[4]
    assert mutant.status.value == "fail" and "kv_integrity" in mutant.reason, mutant.reason
    assert all(r.status.value == "pass" for i, r in enumerate(fast) if i != 4), [r.reason for r in fast]


@pytest.mark.parametrize("event", ["capture", "capture_write", "outside_write", "exception"])
def test_what_may_write_the_caches_unmarks_the_scratch(monkeypatch, event):
    sessions = SessionCache(capacity=8)
    scratch.SCRATCH.clear()
    case = make_case("torch", "FULL", "auto", MIXED, model=BIG)
    assert run_case(case, sessions=sessions).status.value == "pass"
    session = next(iter(sessions._sessions.values()))
    assert scratch.scratch_in_sync(session)  # a verified step
    if event == "capture":
        monkeypatch.setattr(checker, "churn", lambda *a: None)  # a GPU's churn unmarks it before each replay
        seen = []
        real = scratch.take_snapshot

        def record(caches, session=None, written=None):
            seen.append(scratch.scratch_in_sync(session))
            return real(caches, session, written)

        monkeypatch.setattr(checker, "take_snapshot", record)
        r = run_case(dataclasses.replace(case, mode="FULL_AND_PIECEWISE", batch=DECODE), sessions=sessions)
        assert r.status.value == "pass" and r.timings["capture_s"] > 0  # this case captured new graphs
        # capture_checked compared the caches after every capture: nothing written, so the scratch
        # still equals them and the first step's snapshot is a partial one.
        assert seen and all(seen), seen
    elif event == "capture_write":  # a graph whose warm-up writes slot 0 (vLLM #39444)
        seen = []
        real = scratch.take_snapshot

        def record(caches, session=None, written=None):
            seen.append(scratch.scratch_in_sync(session) if session is not None else None)
            return real(caches, session, written)

        monkeypatch.setattr(checker, "take_snapshot", record)
        mla = make_mla_case("tests.mutants.mla_warmup_slot0:Backend", "FULL_AND_PIECEWISE", batch=MLA_DECODE)
        r = run_case(mla, sessions=sessions)
        assert r.status.value == "fail" and "written during its warm-up and capture" in r.reason, r.reason
        assert seen and seen[0] is False, seen  # the capture wrote: the first step copied the caches whole
    elif event == "outside_write":
        r = run_case(
            make_case("tests.mutants.padded_slot_write:Backend", "FULL", "auto", DECODE, model=BIG), sessions=sessions
        )
        assert r.status.value == "fail"
        assert scratch.SCRATCH_OWNER[0] is None  # the last step wrote outside its slots
    else:

        def boom(*a, **k):
            raise RuntimeError("boom")

        monkeypatch.setattr(sides, "kv_integrity", boom)
        assert run_case(case, sessions=sessions).status.value == "error"
        assert not scratch.scratch_in_sync(session)
