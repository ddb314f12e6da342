"""A worker's memory budget (backend/harness/memory.py, session.SessionCache): sessions are
kept by their measured bytes, a session that cannot fit alone is refused before it is built, and an
out-of-memory inside a case reruns it once on a cleared worker; only a case that runs out again
alone is ERROR kind `oom`, never FAIL or FLAKY. CPU sessions are measured by their tensors' sizes,
so the arithmetic is the one a GPU worker does with the allocator's figures."""

from __future__ import annotations

import pytest

from backend.harness import checker, model, step_data
from backend.harness.checker import SessionCache, run_case
from backend.harness.memory import OOM_KIND, GiB, MemoryBudget, is_oom
from backend.harness.session_cache import SessionTooLarge
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


CPU = "cpu"  # the arithmetic on sizes the test controls (a GPU's allocator figures are the benchmark's)


def _session_bytes(kv: str = "auto") -> int:
    cache = SessionCache()
    run_case(make_case(mode="NONE", kv=kv, batch=DECODE), sessions=cache, device=CPU)
    (session,) = cache._sessions.values()
    return session.memory_total()


def test_sessions_are_evicted_by_their_bytes_against_the_budget(monkeypatch):
    one = _session_bytes()
    others = [0]  # the process's other caches, as the budget sees them: fixed here
    monkeypatch.setattr(step_data, "cached_bytes", lambda: others[0])
    # Room for two sessions of this size and the third's estimate: the oldest goes.
    cache = SessionCache(capacity=64, budget=int(2.5 * one))
    for backend, kv in (("torch", "auto"), ("torch", "fp8"), ("aiter-emulated", "auto")):
        res = run_case(make_case(backend=backend, mode="NONE", kv=kv, batch=DECODE), sessions=cache, device=CPU)
        assert res.status == Status.PASS, res.reason
        assert cache.held_bytes() <= cache.budget
    assert len(cache) == 2 and cache.evictions >= 1
    # Every result says what its session held and the budget it ran under.
    assert res.memory["session"] > 0 and res.memory["session_kv"] > 0 and res.memory["budget"] == cache.budget


def test_without_a_budget_only_the_count_bounds_the_cache():
    cache = SessionCache(capacity=64)
    for kv in ("auto", "fp8"):
        run_case(make_case(mode="NONE", kv=kv, batch=DECODE), sessions=cache, device=CPU)
    assert len(cache) == 2 and cache.evictions == 0


def test_the_budget_keeps_room_for_the_largest_transient_and_the_other_caches(monkeypatch):
    one = _session_bytes()
    others, cleared = [0], []
    monkeypatch.setattr(step_data, "cached_bytes", lambda: others[0])
    monkeypatch.setattr(step_data, "clear_caches", lambda: (cleared.append(1), others.__setitem__(0, 0)))
    cache = SessionCache(capacity=64, budget=int(3.5 * one))
    run_case(make_case(mode="NONE", kv="auto", batch=DECODE), sessions=cache, device=CPU)
    run_case(make_case(mode="NONE", kv="fp8", batch=DECODE), sessions=cache, device=CPU)
    assert len(cache) == 2 and cache.evictions == 0
    # A case was seen to need a session's worth above what was held: the older session goes even
    # when the next case's own session is cached (a hit).
    cache.note_transient(2 * one)  # the two held sessions together are under 2 x one (fp8 is smaller)
    run_case(make_case(mode="NONE", kv="fp8", batch=DECODE), sessions=cache, device=CPU)
    assert len(cache) == 1 and cache.evictions == 1 and cleared == []
    # The step caches are dropped only when no session is left to evict.
    others[0] = 2 * one
    run_case(make_case(mode="NONE", kv="fp8", batch=DECODE), sessions=cache, device=CPU)
    assert len(cache) == 1 and cleared == [1]


def test_a_recorded_need_makes_room_before_the_case_runs(monkeypatch):
    """The executor sends a case's recorded need (SessionCache.expect): room is made for it before
    the case, on a session hit (the other sessions go) and on a miss (before the new session is
    built), once: the next case without one keeps what it finds."""
    one = _session_bytes()
    monkeypatch.setattr(step_data, "cached_bytes", lambda: 0)
    cache = SessionCache(capacity=64, budget=int(3.5 * one))
    run_case(make_case(mode="NONE", kv="auto", batch=DECODE), sessions=cache, device=CPU)
    run_case(make_case(mode="NONE", kv="fp8", batch=DECODE), sessions=cache, device=CPU)
    assert len(cache) == 2 and cache.evictions == 0
    cache.expect(3 * one)  # its session and twice that above it: the auto session must go
    res = run_case(make_case(mode="NONE", kv="fp8", batch=DECODE), sessions=cache, device=CPU)
    assert res.status == Status.PASS and len(cache) == 1 and cache.evictions == 1
    run_case(make_case(mode="NONE", kv="auto", batch=DECODE), sessions=cache, device=CPU)
    assert len(cache) == 2 and cache.evictions == 1  # expected once, not for every case after
    cache.expect(3 * one)  # a miss: both held sessions go before the new one is built
    run_case(make_case(backend="aiter-emulated", mode="NONE", kv="auto", batch=DECODE), sessions=cache, device=CPU)
    assert len(cache) == 1 and cache.evictions == 3


def test_memory_the_process_holds_beside_its_sessions_counts_against_the_budget(monkeypatch):
    """What the allocator says the process holds beyond its sessions and step caches (the step's
    snapshot, eager sides, workspaces) takes room too: a recorded need that fits beside the
    sessions alone evicts the older one when that memory is there."""
    one, fp8 = _session_bytes(), _session_bytes("fp8")
    monkeypatch.setattr(step_data, "cached_bytes", lambda: 0)

    def run(untracked: int) -> SessionCache:
        cache = SessionCache(capacity=64, budget=int(3.5 * one))
        cache.allocated = lambda: cache.held_bytes() + untracked
        run_case(make_case(mode="NONE", kv="auto", batch=DECODE), sessions=cache, device=CPU)
        run_case(make_case(mode="NONE", kv="fp8", batch=DECODE), sessions=cache, device=CPU)
        cache.expect(fp8 + one)  # the fp8 session (a hit) and one session's worth above it
        res = run_case(make_case(mode="NONE", kv="fp8", batch=DECODE), sessions=cache, device=CPU)
        assert res.status == Status.PASS, res.reason
        return cache

    assert run(0).evictions == 0  # both sessions and the need fit the budget
    crowded = run(int(1.5 * one))
    assert crowded.evictions == 1 and len(crowded) == 1


def test_a_session_over_the_budget_alone_is_refused_before_it_is_built():
    built = []
    cache = SessionCache(budget=1024)
    with pytest.raises(SessionTooLarge) as e:
        cache.get("k", lambda: built.append(1), estimate=4096)
    assert built == [] and e.value.need == 4096 and e.value.budget == 1024
    # Through the checker: ERROR kind oom naming both figures, no rerun, nothing cached.
    res = run_case(make_case(mode="FULL", batch=DECODE), device=CPU, sessions=SessionCache(budget=1024))
    assert res.status == Status.ERROR and res.error_kind == OOM_KIND
    assert "out of memory budget" in res.reason and "the worker's budget is 0.00 GiB" in res.reason
    assert res.memory["needs"] > 1024


def test_out_of_memory_once_is_rerun_on_a_cleared_worker_and_passes(monkeypatch):
    monkeypatch.setitem(out_of_memory._RAISED, "done", False)
    cache = SessionCache(capacity=8)
    first = make_case(mode="NONE", batch=DECODE)
    run_case(first, device=CPU, sessions=cache)  # another session, cached
    weights = model.make_weights(first.model, device=CPU)  # the process's cached weights
    res = run_case(
        make_case(backend="tests.mutants.out_of_memory:OnceBackend", batch=DECODE), device=CPU, sessions=cache
    )
    assert res.status == Status.PASS, res.reason
    assert "rerun once on a cleared worker" in res.log_tail and "1 cached session" in res.log_tail
    assert len(cache) == 1  # the earlier session was dropped; the rerun's is kept
    # The weights went with the other caches (on a GPU they kept the worker from giving its memory
    # back), and the rerun drew them again.
    assert model.make_weights(first.model, device=CPU) is not weights


def test_out_of_memory_again_when_alone_is_error_oom_never_fail_or_flaky():
    res = run_case(
        make_case(backend="tests.mutants.out_of_memory:AlwaysBackend", batch=DECODE),
        sessions=SessionCache(),
        device=CPU,
    )
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
    res = run_case(
        make_case(backend="tests.mutants.out_of_memory:AlwaysBackend", batch=DECODE), sessions=SessionCache()
    )
    assert len(calls) == 2 and res.error_kind == OOM_KIND  # tp 1: the worker reran it once


@pytest.mark.parametrize(
    "exc,expected",
    [
        (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
        (RuntimeError("HIP out of memory. Tried to allocate 2 GiB"), True),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
        (ValueError("shape mismatch"), False),
    ],
)
def test_out_of_memory_is_recognised_by_type_text_and_cause(exc, expected):
    assert is_oom(exc) is expected
    wrapped = RuntimeError("CUDA graph capture failed")
    wrapped.__cause__ = exc
    assert is_oom(wrapped) is expected


def test_a_worker_that_cannot_give_its_memory_back_is_not_reused_for_the_rerun(monkeypatch):
    # What a CUDA allocator holds after the worker dropped everything cannot exist on this CPU: the
    # figure is set here. Past UNRELEASED_LIMIT the worker is no clean state: no in-process rerun;
    # the result says so and the executor recycles the worker (tests/executor/test_verdicts.py).
    from backend.harness import memory

    calls = []
    real = checker._run_case
    monkeypatch.setattr(checker, "_run_case", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    monkeypatch.setattr(memory, "unreleased", lambda device: 9 * GiB)
    res = run_case(
        make_case(backend="tests.mutants.out_of_memory:AlwaysBackend", batch=DECODE),
        sessions=SessionCache(),
        device=CPU,
    )
    assert len(calls) == 1 and res.error_kind == OOM_KIND and res.memory["unreleased"] == 9 * GiB
    assert "could not give back 9.00 GiB (0.00 GiB of it in live tensors)" in res.reason
