"""A worker's memory budget (issue 37; backend/harness/memory.py, session.SessionCache): sessions are
kept by their measured bytes, a session that cannot fit alone is refused before it is built, and an
out-of-memory inside a case reruns it once on a cleared worker; only a case that runs out again
alone is ERROR kind `oom`, never FAIL or FLAKY. CPU sessions are measured by their tensors' sizes,
so the arithmetic is the one a GPU worker does with the allocator's figures."""

from __future__ import annotations

import pytest

from backend.harness import checker
from backend.harness.checker import SessionCache, run_case
from backend.harness.memory import GiB, MemoryBudget, OOM_KIND, is_oom
from backend.harness.session import SessionTooLarge
from backend.result import Status
from tests.checker.conftest import DECODE, make_case
from tests.mutants import out_of_memory

BUDGETS = [
    # (name, budget, share, device bytes (None: the real one), device's real size, expected budget)
    ("whole H100 at vLLM's default", 0.9, 1.0, None, 80 * GiB, int(72 * GiB)),
    ("a quarter of an H100", 0.9, 0.25, None, 80 * GiB, int(18 * GiB)),
    ("24 GiB card emulated on an H100", 0.9, 1.0, 24 * GiB, 80 * GiB, int(0.9 * 24 * GiB)),
    ("an MI250X GCD, two workers", 0.9, 0.5, None, 64 * GiB, int(0.9 * 32 * GiB)),
    ("an emulated size above the real one is the real one", 1.0, 1.0, 200 * GiB, 80 * GiB, 80 * GiB),
]


@pytest.mark.parametrize("name,util,share,device,total,expected", BUDGETS, ids=[b[0] for b in BUDGETS])
def test_a_workers_budget_is_utilization_of_its_share_of_the_device(name, util, share, device, total, expected):
    assert MemoryBudget(util, share, device).budget_bytes(total) == expected


@pytest.mark.parametrize("util,share", [(0.0, 1.0), (1.5, 1.0), (0.9, 0.0), (0.9, 2.0)])
def test_a_budget_outside_its_range_is_refused(util, share):
    with pytest.raises(ValueError):
        MemoryBudget(util, share)


def _session_bytes(kv: str = "auto") -> int:
    cache = SessionCache()
    run_case(make_case(mode="NONE", kv=kv, batch=DECODE), sessions=cache)
    (session,) = cache._sessions.values()
    return session.memory_total()


def test_sessions_are_evicted_by_their_bytes_against_the_budget():
    one = _session_bytes()
    # Room for two sessions of this size and the third's snapshot estimate: the oldest goes.
    cache = SessionCache(capacity=64, budget=int(2.5 * one))
    for backend, kv in (("torch", "auto"), ("torch", "fp8"), ("aiter-emulated", "auto")):
        res = run_case(make_case(backend=backend, mode="NONE", kv=kv, batch=DECODE), sessions=cache)
        assert res.status == Status.PASS, res.reason
        assert cache.held_bytes() <= cache.budget
    assert len(cache) == 2 and cache.evictions >= 1
    # Every result says what its session held and the budget it ran under.
    assert res.memory["session"] > 0 and res.memory["session_kv"] > 0 and res.memory["budget"] == cache.budget


def test_without_a_budget_only_the_count_bounds_the_cache():
    cache = SessionCache(capacity=64)
    for kv in ("auto", "fp8"):
        run_case(make_case(mode="NONE", kv=kv, batch=DECODE), sessions=cache)
    assert len(cache) == 2 and cache.evictions == 0


def test_a_session_over_the_budget_alone_is_refused_before_it_is_built():
    built = []
    cache = SessionCache(budget=1024)
    with pytest.raises(SessionTooLarge) as e:
        cache.get("k", lambda: built.append(1), estimate=4096)
    assert built == [] and e.value.need == 4096 and e.value.budget == 1024
    # Through the checker: ERROR kind oom naming both figures, no rerun, nothing cached.
    res = run_case(make_case(mode="FULL", batch=DECODE), sessions=SessionCache(budget=1024))
    assert res.status == Status.ERROR and res.error_kind == OOM_KIND
    assert "out of memory budget" in res.reason and "the worker's budget is 0.00 GiB" in res.reason
    assert res.memory["needs"] > 1024


def test_out_of_memory_once_is_rerun_on_a_cleared_worker_and_passes(monkeypatch):
    monkeypatch.setitem(out_of_memory._RAISED, "done", False)
    cache = SessionCache(capacity=8)
    run_case(make_case(mode="NONE", batch=DECODE), sessions=cache)  # another session, cached
    res = run_case(make_case(backend="tests.mutants.out_of_memory:OnceBackend", batch=DECODE), sessions=cache)
    assert res.status == Status.PASS, res.reason
    assert "rerun once on a cleared worker" in res.log_tail and "1 cached session" in res.log_tail
    assert len(cache) == 1  # the earlier session was dropped; the rerun's is kept


def test_out_of_memory_again_when_alone_is_error_oom_never_fail_or_flaky():
    res = run_case(make_case(backend="tests.mutants.out_of_memory:AlwaysBackend", batch=DECODE),
                   sessions=SessionCache())
    assert res.status == Status.ERROR and res.error_kind == OOM_KIND
    assert res.reason.startswith("out of memory when alone")
    assert "rerun once on a cleared worker" in res.log_tail


def test_a_tp1_case_out_of_memory_is_rerun_exactly_once_in_the_worker(monkeypatch):
    # (A gang's ranks are not rerun in the worker: the executor reruns the case on a fresh gang,
    # tests/executor/test_memory_packing.py.)
    calls = []
    real = checker._run_case

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(checker, "_run_case", counting)
    res = run_case(make_case(backend="tests.mutants.out_of_memory:AlwaysBackend", batch=DECODE),
                   sessions=SessionCache())
    assert len(calls) == 2 and res.error_kind == OOM_KIND  # tp 1: the worker reran it once


@pytest.mark.parametrize("exc,expected", [
    (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
    (RuntimeError("HIP out of memory. Tried to allocate 2 GiB"), True),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
    (ValueError("shape mismatch"), False),
])
def test_out_of_memory_is_recognised_by_type_text_and_cause(exc, expected):
    assert is_oom(exc) is expected
    wrapped = RuntimeError("CUDA graph capture failed")
    wrapped.__cause__ = exc
    assert is_oom(wrapped) is expected
