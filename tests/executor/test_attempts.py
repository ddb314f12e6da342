"""orchestrator/executor/attempts.py as tables: what one returned result means (classify: the
out-of-memory and device-fault classification), and a case's attempts from dispatch to verdict
(retry, flaky, widen, out of step, lost batch, lost node, not run). No Ray: the bookkeeping drives
the real (pure) Dispatcher."""

from __future__ import annotations

import pytest

from backend.case import BatchSpec, Case
from backend.result import CaseResult, Status
from orchestrator.executor.attempts import REFRESHED, WIDENED, Action, Attempts, batch_deadline_s, classify
from orchestrator.scheduling.policy import Dispatcher, Task

P, F, E, T, N = Status.PASS, Status.FAIL, Status.ERROR, Status.TIMEOUT, Status.NOT_RUN
CUDA = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
CAPTURE = "CUDA error: operation not permitted when stream is capturing (cudaErrorStreamCaptureUnsupported)"


def _r(status, kind="", reason="", memory=None, worker="w") -> CaseResult:
    return CaseResult("c", status, reason=reason, error_kind=kind, worker=worker, memory=memory or {})


UNRELEASED = {"unreleased": 3 << 30}
# A group as the executor keys it (config.group_key): a name of many characters, as a string
# handed where a tuple of groups belongs would show (its characters are no group).
G = "torch|tp1|auto|8x2x32|bfloat16|2|512|51"


@pytest.mark.parametrize("ranks, narrower, action, status, kind, recycle", [
    # one rank (tp 1)
    ([_r(P)], False, Action.ATTEMPT, P, "", False),
    ([_r(F)], True, Action.ATTEMPT, F, "", False),
    # out of memory: on a share of a GPU it is widened; on a whole GPU it is the verdict, never relabelled
    ([_r(E, "oom", "out of memory")], True, Action.WIDEN, E, "oom", False),
    ([_r(E, "oom", "out of memory")], False, Action.ATTEMPT, E, "oom", False),
    ([_r(E, "oom", "out of memory", UNRELEASED)], False, Action.ATTEMPT, E, "oom", True),
    ([_r(E, "oom", "out of memory", UNRELEASED)], True, Action.WIDEN, E, "oom", True),
    # a device fault recycles the worker and is retried as an exception; a plain capture error is kept
    ([_r(E, "exception", CUDA)], False, Action.ATTEMPT, E, "exception", True),
    ([_r(E, "capture", CAPTURE)], False, Action.ATTEMPT, E, "capture", False),
    ([_r(E, "capture", CUDA)], False, Action.ATTEMPT, E, "exception", True),
    # a gang whose barrier tripped: the rank that left early is the verdict; none: innocent
    ([_r(E, "exception", "boom"), _r(N, "", "out of step")], False, Action.ATTEMPT, E, "exception", True),
    ([_r(N, "", "out of step"), _r(N, "", "out of step")], False, Action.OUT_OF_STEP, None, None, True),
])  # fmt: skip # a table: one row per line, as it reads
def test_classify(ranks, narrower, action, status, kind, recycle):
    seen = classify(ranks, "gpu0", narrower)
    assert (seen.action, seen.recycle) == (action, recycle)
    if status is None:
        assert seen.result is None and seen.reason == "out of step"
        return
    assert (seen.result.status, seen.result.error_kind, seen.result.worker) == (status, kind, "gpu0")
    device_fault = any(r.reason == CUDA for r in ranks)
    assert ("(device error: worker recycled)" in seen.result.reason) == device_fault


def test_batch_deadline_is_the_longest_timeout_and_room_for_the_rest():
    assert batch_deadline_s([10.0], [3.0]) == 10.0
    assert batch_deadline_s([10.0, 30.0, 5.0], [1.0, 2.0, 0.5]) == 30.0 + 2 * 2.5


# -- attempts over a real Dispatcher ---------------------------------------------------------


def _case(cid: str, tp: int = 1) -> Case:
    return Case(backend=cid, tp=tp, mode="FULL", kv_cache_dtype="auto", batch=BatchSpec("b", (1,), (16,)))


def _setup(*specs, retries=1, slots=(4,)):
    """specs: (name, tp, est_s, group). Returns (attempts, {name: task})."""
    cases = {name: _case(name, tp) for name, tp, _, _ in specs}
    tasks = {name: Task(cases[name].case_id, tp, est, group) for name, tp, est, group in specs}
    at = Attempts(
        {c.case_id: c for c in cases.values()},
        Dispatcher(list(tasks.values()), list(slots)),
        retries=retries,
        unit="GPU",
    )
    at.queue(list(tasks.values()))
    return at, tasks


def _run(at: Attempts, task: Task) -> Task:
    """Hand the task out (as the loop does) and return it."""
    got = at.dispatcher.next_for(0, task.tp, (task.group,))
    assert got is not None and got.id == task.id, (got, task)
    at.taken(got)
    return got


def _res(task: Task, status, kind="", worker="w1", reason="") -> CaseResult:
    return CaseResult(task.id, status, error_kind=kind, worker=worker, reason=reason or status.value)


@pytest.mark.parametrize("first, second, final, attempts", [
    (P, None, P, 1),
    (F, P, Status.FLAKY, 2),
    (F, F, F, 2),
    (F, E, E, 2),          # two different failures stay a failure: the retry's
    (T, T, T, 2),
])  # fmt: skip # a table: one row per line, as it reads
def test_a_failure_runs_once_more_and_the_attempts_combine(first, second, final, attempts):
    at, t = _setup(("a", 1, 1.0, G))
    task = _run(at, t["a"])
    at.attempt(task, _res(task, first), 1.0)
    if second is None:
        assert at.final[task.id].status == final and at.out == [(at.final[task.id], True)]
        return
    assert task.id not in at.final and at.out[0][1] is False  # the first attempt, not final
    assert at.avoid(task.id) == "w1" and task.id in at.queued
    task = _run(at, task)
    at.attempt(task, _res(task, second, worker="w2"), 1.0)
    assert (at.final[task.id].status, at.final[task.id].attempts) == (final, attempts)
    assert at.dispatcher.remaining() == 0


@pytest.mark.parametrize("status, kind, retries, retried", [
    (F, "", 0, False), (E, "capture", 1, False), (E, "oom", 1, False), (Status.UNVERIFIABLE, "", 1, False),
    (E, "crash", 1, True),
])  # fmt: skip # a table: one row per line, as it reads
def test_what_is_not_retried(status, kind, retries, retried):
    at, t = _setup(("a", 1, 1.0, G), retries=retries)
    task = _run(at, t["a"])
    at.attempt(task, _res(task, status, kind), 1.0)
    assert (task.id not in at.final) == retried


def test_a_retry_that_never_runs_keeps_the_observed_failure():
    at, t = _setup(("a", 1, 1.0, G))
    task = _run(at, t["a"])
    at.attempt(task, _res(task, F, reason="replay check failed"), 1.0)
    at.unplaceable()
    res = at.final[task.id]
    assert res.status == F and "retry not run: needs 1 GPUs on one node; none left" in res.reason


def test_not_run_kinds():
    at, t = _setup(("a", 2, 2.0, ""), ("b", 4, 5.0, ""), ("c", 1, 1.0, ""), ("d", 2, 0.5, ""))
    a = _run(at, t["b"])
    at.placement_timed_out(4, [a], 30.0)
    res = at.final[a.id]
    assert (res.status, res.error_kind) == (N, "placement") and "no placement within 30s" in res.reason
    # after a tp 4 placement timed out, smaller tps still run and larger-or-equal ones do not
    assert not at.blocked(_run(at, t["a"]))
    at2, t2 = _setup(("a", 2, 1.0, ""), ("b", 2, 0.5, ""))
    at2.placement_timed_out(2, [_run(at2, t2["a"])], 30.0)
    assert at2.blocked(_run(at2, t2["b"])) and at2.final[t2["b"].id].error_kind == "placement"


@pytest.mark.parametrize("fail", ["setup_failed", "out_of_step"])
def test_not_the_cases_fault_runs_once_more_then_is_not_run_gang(fail):
    at, t = _setup(("a", 2, 1.0, ""))
    task = _run(at, t["a"])
    (at.setup_failed([task], "no rendezvous") if fail == "setup_failed" else at.out_of_step(task, "no rendezvous"))
    assert task.id not in at.final and task.id in at.queued
    assert (task.id in at.singles) == (fail == "out_of_step")
    task = _run(at, task)
    (at.setup_failed([task], "no rendezvous") if fail == "setup_failed" else at.out_of_step(task, "no rendezvous"))
    res = at.final[task.id]
    assert (res.status, res.error_kind, res.reason) == (N, "gang", "not run: no rendezvous")


def test_a_node_lost_twice_under_a_case_blames_it():
    at, t = _setup(("a", 1, 1.0, ""), ("b", 1, 0.9, ""))
    a, b = _run(at, t["a"]), _run(at, t["b"])
    assert at.node_lost([a, b]) == [] and set(at.queued) == {a.id, b.id}
    a = _run(at, a)
    assert at.node_lost([a]) == [a] and a.id not in at.queued


def test_a_batch_fills_with_its_own_group_before_a_slightly_longer_other_one():
    """x (another session) is the longest waiting task, b of the batch's group within GROUP_TIE of
    it: b joins the batch, on the worker that holds its session, and x no longer fits (0.6 s)."""
    at, t = _setup(("a", 1, 0.3, G), ("x", 1, 0.25, G + "|fp8"), ("b", 1, 0.2, G))
    batch = at.batch(0, _run(at, t["a"]), 1, "w1", 0.6, 64)
    assert [x.id for x in batch] == [t["a"].id, t["b"].id]


def test_a_lost_batch_blames_a_lone_case_and_splits_the_rest():
    at, t = _setup(("a", 1, 0.2, G), ("b", 1, 0.1, G))
    a, b = _run(at, t["a"]), _run(at, t["b"])
    assert at.lost_batch([a, b]) is None and at.singles == {a.id, b.id} and set(at.queued) == {a.id, b.id}
    assert at.lost_batch([_run(at, a)]) == a


def test_widen_runs_the_case_again_on_a_whole_gpu_and_says_so():
    at, t = _setup(("a", 1, 1.0, ""), slots=(4,))
    task = _run(at, t["a"])
    at.widen(task, _res(task, E, "oom", reason="out of memory\nmore"), 1, 4)
    wide = at.queued[task.id]
    assert wide.tp == 4 and at.dispatcher.next_for(0, 3) is None  # needs the whole GPU now
    wide = _run(at, wide)
    at.attempt(wide, _res(wide, P), 1.0)
    assert at.final[task.id].log_tail.startswith("out of device memory on a worker of 1/4 of a GPU (out of memory)")


@pytest.mark.parametrize("recycled, widths", [
    # a worker that kept memory it could not give back: a fresh worker of the same share, then a whole GPU
    (True, [1, 4]),
    # a cleared worker that still ran out (the share is the limit): a whole GPU at once
    (False, [4]),
])  # fmt: skip # a table: one row per line, as it reads
def test_out_of_memory_on_a_share_runs_again_fresh_then_on_a_whole_gpu(recycled, widths):
    at, t = _setup(("a", 1, 1.0, ""), slots=(4,))
    task, seen = _run(at, t["a"]), []
    for _ in widths:  # out of memory on every worker it gets: where it goes next, each time
        at.out_of_memory(task, _res(task, E, "oom", reason="out of memory"), task.tp, 4, recycled=recycled)
        task = at.queued[task.id]
        seen.append(task.tp)
        task = _run(at, task)
    assert seen == widths
    at.attempt(task, _res(task, P), 1.0)
    log = at.final[task.id].log_tail
    assert log.startswith(REFRESHED if recycled else WIDENED)
    assert (WIDENED in log) and (REFRESHED in log) == recycled


@pytest.mark.parametrize("singles, avoid, target, expected", [
    ((), None, 1.0, ["a", "b", "c"]),        # same width, summed estimate under the target
    ((), None, 0.5, ["a", "b"]),             # 0.3 + 0.15 < 0.5; + 0.1 is not
    (("a",), None, 1.0, ["a"]),              # a case that runs alone
    (("b",), None, 1.0, ["a"]),              # the next one runs alone: the batch ends there
    ((), "b", 1.0, ["a"]),                   # a retry does not join its first attempt's worker
    ((), None, 0.2, ["a"]),                  # a long first case runs alone
])  # fmt: skip # a table: one row per line, as it reads
def test_batch(singles, avoid, target, expected):
    at, t = _setup(("a", 1, 0.3, G), ("b", 1, 0.15, G), ("c", 1, 0.1, G), ("d", 2, 0.01, G))
    at.singles.update(t[s].id for s in singles)
    if avoid:
        at.first[t[avoid].id] = _res(t[avoid], F, worker="w1")
    first = _run(at, t["a"])
    batch = at.batch(0, first, 1, "w1", target, 64)
    assert [x.id for x in batch] == [t[n].id for n in expected]
    assert all(x.id not in at.queued for x in batch)
    assert at.dispatcher.remaining() == 4 - len(batch)  # what did not suit went back
