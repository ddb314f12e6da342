"""A case's attempts, from dispatch to its final verdict: pure bookkeeping (no Ray) over the
dispatcher, driven by the executor's loop.

- A failed case (fail/error/timeout) runs once more on another worker; the two attempts combine
  into its verdict (verdicts.two_attempts). A retry that cannot be placed keeps the first attempt's
  failing verdict ("retry not run"): an observed failure is not downgraded to NOT_RUN.
- A batch lost to a crash or hang: alone, its case is to blame; else its cases run singly.
- A node lost: its cases run again without blame, blamed if it happens to them again.
- A gang that could not come up, or whose ranks fell out of step: its cases run again once on a
  new gang, then are NOT_RUN "gang" (not the cases' fault).
- A tp 1 case out of memory on less than a whole GPU runs again on a whole GPU (widened).
- A placement that timed out: the case and every later case of >= that tp are NOT_RUN.
Results are collected in `out` (handed over once per loop turn) and `final`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from backend.case import Case
from backend.rank_merge import merge_rank_results
from backend.result import CaseResult, Status
from orchestrator.executor.verdicts import (
    ErrorKind,
    first_line,
    poisons_worker,
    retried,
    two_attempts,
)
from orchestrator.scheduling.policy import Dispatcher, Task

# How a widened case's log begins (its rerun on a whole GPU after running out of a share):
# benchmarks/speed_table.py counts them.
WIDENED = "out of device memory on a worker of"
# How a case's log begins when it ran out of memory beside what its worker could not give back,
# and ran again on a fresh worker of the same share (Attempts.out_of_memory).
REFRESHED = "out of device memory in a worker that could not give its memory back"


class Action(enum.Enum):
    ATTEMPT = "attempt"  # the result is an attempt of the case (Attempts.attempt)
    WIDEN = "widen"  # out of memory on a share of a GPU: run again on a fresh worker or a whole GPU (Attempts.out_of_memory)
    OUT_OF_STEP = "out_of_step"  # an innocent case on a gang whose ranks fell out of step


@dataclass(frozen=True)
class Seen:
    """What one case of a returned batch means (classify)."""

    action: Action
    result: CaseResult | None  # None for OUT_OF_STEP
    recycle: bool  # the worker is unusable now: tear it down
    reason: str = ""  # OUT_OF_STEP: the barrier's reason


def classify(ranks: Sequence[CaseResult], worker: str, narrower: bool) -> Seen:
    """One case's rank results -> what to do with it. `narrower`: it ran on a tp 1 worker of less
    than a whole GPU and was not widened yet (its share, not the device, may have been the limit).

    A NOT_RUN rank means the gang's end-of-case barrier tripped: the rank that left early (ERROR)
    is the verdict, and a case with none is innocent. A device error recycles the worker and is
    relabelled `exception` (retried); an out-of-memory keeps its kind (never relabelled) and
    recycles only a worker that could not give its memory back."""
    recycle = any(r.status == Status.NOT_RUN for r in ranks)
    if recycle:
        culprit = [r for r in ranks if r.status == Status.ERROR]
        if not culprit:
            return Seen(Action.OUT_OF_STEP, None, True, ranks[0].reason)
        ranks = culprit[:1]
    res = merge_rank_results(list(ranks)).replace(worker=worker)
    oom = res.error_kind == ErrorKind.OOM
    if oom and narrower:
        return Seen(Action.WIDEN, res, recycle or poisons_worker(res))
    if poisons_worker(res):
        recycle = True
        if not oom:  # a sticky fault seen inside a capture is the machine's, not the code's: retried
            res = res.replace(
                reason=f"{res.reason} (device error: worker recycled)", error_kind=ErrorKind.EXCEPTION.value
            )
    return Seen(Action.ATTEMPT, res, recycle)


def batch_deadline_s(timeouts: Sequence[float], estimates: Sequence[float]) -> float:
    """Seconds a batch may take: its longest case's timeout plus generous room for the others."""
    return max(timeouts) + 2 * sum(estimates[1:])


class Attempts:
    def __init__(self, cases: Mapping[str, Case], dispatcher: Dispatcher, *, retries: int, unit: str):
        self.cases = dict(cases)
        self.dispatcher = dispatcher
        self.retries = retries
        self.unit = unit  # "GPU" | "CPU worker", for reasons
        self.final: dict[str, CaseResult] = {}
        self.out: list[tuple[CaseResult, bool]] = []  # (result, final) not yet handed over
        self.queued: dict[str, Task] = {}  # in the dispatcher, not yet handed out
        self.first: dict[str, CaseResult] = {}  # first attempt of cases being retried
        self.singles: set[str] = set()  # run alone: they were in a batch that crashed/hung
        self.lost: dict[str, int] = {}  # node losses suffered per case
        self.setup_fails: dict[str, int] = {}  # gang set-ups failed (or out of step) under a case
        self.widened: dict[str, str] = {}  # case id -> note for its log: rerun on a whole GPU
        self.refreshed: dict[str, str] = {}  # case id -> note for its log: rerun on a fresh worker
        self.no_place_tp: int | None = None  # smallest tp whose placement timed out

    # -- queue ----------------------------------------------------------------------------------

    def queue(self, tasks: Sequence[Task]) -> None:
        self.queued.update((t.id, t) for t in tasks)

    def taken(self, task: Task) -> None:
        """The dispatcher handed `task` out."""
        self.queued.pop(task.id, None)

    def requeue(self, task: Task, as_task: Task | None = None) -> None:
        self.dispatcher.requeue(task, as_task)
        self.queued[task.id] = as_task or task

    def avoid(self, task_id: str) -> str | None:
        """The worker a retry must avoid (its first attempt's), if any."""
        first = self.first.get(task_id)
        return first.worker if first is not None else None

    def batch(self, node: int, first: Task, width: int, worker: str, target_s: float, max_batch: int) -> list[Task]:
        """`first` and, unless it runs alone or is long, more tasks of its group for one call on a
        worker of `width` slots, while their summed estimate stays under `target_s`. Each task comes
        with the other waiting cases of its config (its cudagraph modes: they reuse its eager steps
        and reference on this worker), whatever their estimates."""
        batch = [first]
        if first.id in self.singles:
            return batch
        self._siblings(batch, node, width, worker, max_batch)
        total = sum(t.est_s for t in batch)
        if first.est_s >= target_s:
            return batch
        while len(batch) < max_batch:
            t = self.dispatcher.next_for(node, width, (first.group,))
            if t is None:
                break
            if t.tp != width or t.id in self.singles or total + t.est_s >= target_s or self.avoid(t.id) == worker:
                self.dispatcher.give_back(t)  # untried: it still goes with its config later
                break
            self.taken(t)
            batch.append(t)
            added = self._siblings(batch, node, width, worker, max_batch)
            total += t.est_s + sum(s.est_s for s in added)
        return batch

    def _siblings(self, batch: list[Task], node: int, width: int, worker: str, max_batch: int) -> list[Task]:
        """Append the waiting cases of batch[-1]'s config that may run here; the rest go back."""
        added = []
        for sib in self.dispatcher.siblings(batch[-1], node):
            if len(batch) >= max_batch or sib.tp != width or sib.id in self.singles or self.avoid(sib.id) == worker:
                self.dispatcher.give_back(sib)
                continue
            self.taken(sib)
            batch.append(sib)
            added.append(sib)
        return added

    # -- outcomes -------------------------------------------------------------------------------

    def emit(self, res: CaseResult, final: bool) -> None:
        if final:
            self.final[res.case_id] = res
        self.out.append((res, final))

    def take_out(self) -> list[tuple[CaseResult, bool]]:
        out, self.out = self.out, []
        return out

    def attempt(self, task: Task, res: CaseResult, duration_s: float) -> None:
        """A finished attempt: the first of a retried failure (requeued), or the case's verdict."""
        notes = [n[task.id] for n in (self.refreshed, self.widened) if task.id in n]
        if notes:
            res = res.replace(log_tail="\n".join([*notes, res.log_tail]).strip())
        first = self.first.pop(task.id, None)
        if first is None and retried(res, self.cases[task.id].tp) and self.retries > 0:
            self.first[task.id] = res
            self.emit(res, False)
            self.requeue(task)
            return
        if first is not None:
            res = two_attempts(first, res)
        self.dispatcher.done(task, duration_s)
        self.emit(res, True)

    def out_of_memory(self, task: Task, res: CaseResult, width: int, per_gpu: int, recycled: bool) -> None:
        """Out of memory on a worker of `width` of `per_gpu` shares. A worker that could not give
        its memory back after dropping its sessions (`recycled`) held what the case lacked, not its
        share: the case runs again at its width on a fresh worker, once, at once beside the other
        workers. Otherwise, or out of memory again there, on a whole GPU (widen), which waits for
        the GPU's other workers to finish: on the H100 the six widened cases of the families'
        slice at 2 per GPU ran after every other case, 5.8 s of a 50.8 s cases phase."""
        if recycled and task.id not in self.refreshed:
            self.refreshed[task.id] = (
                f"{REFRESHED} ({width}/{per_gpu} of a GPU; {first_line(res.reason)}): rerun on a fresh worker"
            )
            self.requeue(task)
            return
        self.widen(task, res, width, per_gpu)

    def widen(self, task: Task, res: CaseResult, width: int, per_gpu: int) -> None:
        """Out of memory on a worker of `width` of `per_gpu` shares: run again on a whole GPU,
        where only an out-of-memory is its verdict (`oom`)."""
        self.widened[task.id] = f"{WIDENED} {width}/{per_gpu} of a GPU ({first_line(res.reason)}): rerun on a whole GPU"
        self.requeue(task, dataclasses.replace(task, tp=per_gpu))

    def not_run(self, case: Case, reason: str, kind: ErrorKind = ErrorKind.PLACEMENT) -> None:
        """A runnable, required case that will not run: NOT_RUN, or, for a retry, the first
        attempt's failure (it was observed; only its confirmation is missing)."""
        first = self.first.pop(case.case_id, None)
        if first is not None:
            res = first.replace(reason=f"{first.reason}; retry not run: {reason}")
        else:
            res = CaseResult(
                case_id=case.case_id,
                status=Status.NOT_RUN,
                reason=f"not run: {reason}",
                requested_mode=case.mode,
                error_kind=kind.value,
                repro=case.repro_command(),
                axes=case.axes,
            )
        self.emit(res, True)

    def skip_placement(self, case: Case, reason: str) -> None:
        """A case that cannot run here at all (tp larger than any node): SKIP."""
        self.emit(
            CaseResult(
                case_id=case.case_id,
                status=Status.SKIP,
                reason=reason,
                requested_mode=case.mode,
                error_kind=ErrorKind.PLACEMENT.value,
                repro=case.repro_command(),
                axes=case.axes,
            ),
            True,
        )

    def _give_up(self, task: Task, reason: str, kind: ErrorKind = ErrorKind.PLACEMENT) -> None:
        self.dispatcher.done(task, 0.0)
        self.not_run(self.cases[task.id], reason, kind)

    def blocked(self, task: Task) -> bool:
        """A task of a tp whose placement already timed out: NOT_RUN now, without trying."""
        tp = self.cases[task.id].tp
        if self.no_place_tp is None or tp < self.no_place_tp:
            return False
        self._give_up(task, f"needs {tp} {self.unit}s on one node (an earlier placement timed out)")
        return True

    def placement_timed_out(self, tp: int, tasks: Sequence[Task], timeout_s: float) -> None:
        self.no_place_tp = tp if self.no_place_tp is None else min(self.no_place_tp, tp)
        for t in tasks:
            self._give_up(t, f"needs {tp} {self.unit}s on one node (no placement within {timeout_s:.0f}s)")

    def unplaceable(self) -> None:
        """Nothing runs and nothing waiting fits anywhere: the waiting cases will never run."""
        for t in list(self.queued.values()):
            self.queued.pop(t.id)
            self.not_run(self.cases[t.id], f"needs {self.cases[t.id].tp} {self.unit}s on one node; none left")

    def _once_more(self, task: Task, reason: str) -> bool:
        """Not the case's fault: run it again once (True), a second time is NOT_RUN "gang"."""
        self.setup_fails[task.id] = self.setup_fails.get(task.id, 0) + 1
        if self.setup_fails[task.id] > 1:
            self._give_up(task, reason, ErrorKind.GANG)
            return False
        self.requeue(task)
        return True

    def setup_failed(self, tasks: Sequence[Task], reason: str) -> None:
        """Placing, starting or joining a gang failed before any case ran in it."""
        for t in tasks:
            self._once_more(t, reason)

    def out_of_step(self, task: Task, reason: str) -> None:
        """An innocent case on a gang whose ranks fell out of step: once more, alone."""
        if self._once_more(task, reason):
            self.singles.add(task.id)

    def node_lost(self, tasks: Sequence[Task]) -> list[Task]:
        """Cases whose worker's node died: requeued without blame; returns those it happened to
        before (to be blamed as a crash)."""
        for t in tasks:
            self.lost[t.id] = self.lost.get(t.id, 0) + 1
        recurring = [t for t in tasks if self.lost[t.id] > 1]
        for t in tasks:
            if t not in recurring:
                self.requeue(t)
        return recurring

    def lost_batch(self, tasks: Sequence[Task]) -> Task | None:
        """A batch lost to a crash or hang: returns its case if it ran alone (to blame); else its
        cases run again singly, where the culprit is found alone."""
        if len(tasks) == 1:
            return tasks[0]
        for t in tasks:
            self.singles.add(t.id)
            self.requeue(t)
        return None
