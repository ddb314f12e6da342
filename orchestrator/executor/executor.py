"""The dispatch loop: cases -> Tasks -> Dispatcher -> gangs of worker actors -> CaseResults.

Single-threaded driver. Every piece of in-flight work is a `_Job` (placing a gang, starting its
actors, the tp rendezvous, a batch of cases) holding Ray refs and a deadline; the loop waits on
all refs at once (`ray.wait`, bounded by the nearest deadline) and turns each outcome into a state
change. A hang is therefore a deadline that passed, never a blocked driver:

    batch finished        -> results (ranks merged), gang idle again (or recycled: device error)
    actor died (crash)    -> ERROR "crash" with the worker's log tail; gang recreated on demand
    node died             -> its cases requeued without blame (blamed if it happens to them again)
    deadline passed       -> ray.kill the gang (a sync task cannot be cancelled); TIMEOUT
    placement deadline    -> the case and every later case of >= that tp: NOT_RUN "placement"
    gang setup failed     -> its cases requeued without blame; a second failure: NOT_RUN "gang"

Several small cases go to an actor in one call (dispatch overhead), so a crash or hang loses the
whole batch: its cases are requeued to run singly, where the culprit is found and blamed alone.
A failed case (fail/error/timeout) runs once more on another worker. FLAKY means one attempt
passed and one did not; two different non-pass verdicts (FAIL then ERROR) stay a failure (the
retry's status, both named in the reason). A retry that cannot be placed keeps the first attempt's
failing verdict ("retry not run" in the reason): an observed failure is not downgraded to NOT_RUN.
SKIP is only for what cannot run here at all (tp larger than any node); a required case that was
runnable but never ran is NOT_RUN, which the gate fails as an infrastructure error.

Other drivers may share the cluster (`--address auto`): each counts every GPU as a slot, and Ray
grants a gang's placement group when its bundles are free (atomically: no driver ever holds part
of a gang). A placement Ray reports as NO_RESOURCES while other jobs hold GPUs is waited for, not
timed out, and said so (`on_notice`); while it waits this driver gives back its idle gangs, so two
drivers can never each sit on GPUs the other's gang needs (sharing.py).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.case import Case
from backend.rank_merge import merge_rank_results
from backend.result import CaseResult, Status
from orchestrator.executor import gangs
from orchestrator.executor.actors import DEFAULT_RUNNER, read_tail
from orchestrator.executor.cluster import ClusterInfo
from orchestrator.executor.sharing import SharedCluster
from orchestrator.executor.verdicts import NODE_DEATH, OOM_KIND, first_line, poisons_worker, retried, two_attempts
from orchestrator.executor.gangs import Gang, GangSpec, GangState
from orchestrator.executor.packing import slot_width
from orchestrator.scheduling.cost import estimate_all
from orchestrator.scheduling.policy import Dispatcher, Task

@dataclass(frozen=True)
class ExecConfig:
    runner: str = DEFAULT_RUNNER  # "module:function" called per case in the actor
    timeout_s: float | None = None  # overrides Case.timeout_s
    placement_timeout_s: float = 30.0
    setup_timeout_s: float = 120.0  # actor start + rendezvous
    batch_target_s: float = 1.0  # batch cases while their summed estimate stays under this
    max_batch: int = 64
    retries: int = 1
    log_dir: str = ""  # per-actor logs; default a fresh temp dir
    reuse_gangs: bool = True  # split an idle larger gang's actors into the tp needed (no new processes)
    poll_s: float = 0.5
    # What each worker may use of its device (backend/harness/memory.py MemoryBudget's utilization
    # and device_bytes; its share comes from the cluster's workers per GPU): handed to the actors.
    gpu_memory_utilization: float = 0.9
    gpu_memory_bytes: int | None = None
    # Several workers per GPU: what each case was measured to need (case id -> bytes, the store's
    # memory_needs) and the device's size as the run sees it, so that a case needing more than one
    # worker's share runs on a wider worker (packing.slot_width). Empty/None: every tp 1 case one slot.
    memory_needs: Mapping[str, int] = field(default_factory=dict)
    device_bytes: int | None = None
    wait_notice_s: float = 5.0  # a placement pending this long is checked for other drivers' GPUs
    wait_repeat_s: float = 60.0  # how often a run that keeps waiting says so again (sharing.py)


@dataclass(frozen=True)
class Deferral:
    """Cases of these backends go after every other case while `pending()` is true (#13: on a
    cold machine the warm-up helpers are compiling their Triton kernels, so the worker runs the
    cases that need none meanwhile instead of compiling the same kernels itself)."""

    backends: frozenset[str]
    pending: Callable[[], bool]


def group_key(case: Case) -> str:
    """Cases that can share captured graphs (same SessionCache entry shapes) on one actor."""
    m = case.model
    family = "" if m.attention == "gqa" else f"{m.attention}{list(m.dims)}|"  # gqa keys as before
    return (f"{family}{case.backend}|tp{case.tp}|{case.kv_cache_dtype}|{m.num_heads}x{m.num_kv_heads}x"
            f"{m.head_size}|{m.dtype}|{m.num_layers}|{m.max_model_len}|{len(case.capture_sizes)}")  # fmt: skip


@dataclass
class _Job:
    kind: str  # "place" | "start" | "join" | "batch"
    gang: Gang
    refs: list[Any]
    deadline: float
    tasks: list[Task]  # the batch (for setup jobs: the batch waiting for the gang)
    started: float = field(default_factory=time.monotonic)
    pending: set[Any] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.pending = set(self.refs)


class Executor:
    def __init__(
        self,
        cluster: ClusterInfo,
        config: ExecConfig = ExecConfig(),
        *,
        on_result: Callable[[CaseResult, bool], None] | None = None,
        on_results: Callable[[list[tuple[CaseResult, bool]]], None] | None = None,
        history: dict[str, float] | None = None,
        deferral: Deferral | None = None,
        on_notice: Callable[[str], None] | None = None,
    ):
        self.cluster = cluster
        self._unit = "GPU" if cluster.device_kind == "gpu" else "CPU worker"
        self._sharing = SharedCluster(cluster, config, on_notice or (lambda msg: None), self._unit)
        self.deferral = deferral
        self.config = config
        self.on_result = on_result or (lambda r, final: None)
        # Group commit: results are handed over once per loop turn (one Ray wait's worth of
        # batches), so a store can commit them in one transaction before anything is reported.
        self.on_results = on_results
        self._out: list[tuple[CaseResult, bool]] = []
        self.history = history or {}
        self.log_dir = config.log_dir or tempfile.mkdtemp(prefix="orch-workers-")
        self.gangs: list[Gang] = []
        self.jobs: list[_Job] = []
        self.final: dict[str, CaseResult] = {}
        self._cases: dict[str, Case] = {}
        self._queued: dict[str, Task] = {}  # in the dispatcher, not yet handed out
        self._first: dict[str, CaseResult] = {}  # first attempt of cases being retried
        self._singles: set[str] = set()  # run alone: they were in a batch that crashed/hung
        self._lost: dict[str, int] = {}  # node losses suffered per case
        self._setup_fails: dict[str, int] = {}  # gang set-ups that failed under a case's batch
        self._alive = [True] * len(cluster.nodes)
        self._nodes_checked = 0.0
        self._no_place_tp: int | None = None  # smallest tp whose placement timed out
        # Several workers per GPU (--workers-per-gpu): a slot is a share of a GPU. A tp 1 worker
        # takes one share; a gang's rank takes a whole device (NCCL refuses two ranks of one
        # communicator on one GPU, and Ray cannot place fractional bundles on distinct GPUs), so a
        # tp t case is t x N slots wide for the dispatcher. Gangs are not split into tp 1 workers
        # then: the split workers would hold whole devices.
        self._per_gpu = cluster.workers_per_gpu if cluster.device_kind == "gpu" else 1
        # tp 1 cases that ran out of memory on a worker of one share: rerun on a whole GPU, with
        # what happened for their result's log (case id -> note).
        self._widened: dict[str, str] = {}

    # -- public ---------------------------------------------------------------------------------

    def run(self, cases: Sequence[Case]) -> dict[str, CaseResult]:
        """Run every case once (plus retries); returns case_id -> final result."""
        self._cases = {c.case_id: c for c in cases}
        est = estimate_all(cases, self.history)
        slots = [n.slots for n in self.cluster.nodes]
        tasks = []
        for c in cases:
            if self._width(c.tp) > max(slots):  # a tp 1 case is never wider than one GPU
                self._skip_placement(c, f"needs {c.tp} {self._unit}s on one node; the largest has "
                                        f"{max(slots) // self._per_gpu}")
            else:
                later = self.deferral is not None and c.backend in self.deferral.backends
                tasks.append(Task(c.case_id, self._case_width(c), est[c.case_id], group_key(c), tier=int(later)))
        self.dispatcher = Dispatcher(tasks, slots)
        self._queued = {t.id: t for t in tasks}
        deferring = self.deferral is not None and any(t.tier for t in tasks)
        try:
            while True:
                if deferring and not self.deferral.pending():
                    self.dispatcher.lift_tiers()
                    deferring = False
                self._fill()
                self._flush()
                if not self.jobs:
                    if self._queued:  # nothing runs and nothing fits anywhere: will never run
                        for t in list(self._queued.values()):
                            self._queued.pop(t.id)
                            self._not_run(self._cases[t.id], f"needs {self._tp(t)} {self._unit}s on one node; none left")
                    break
                self._wait_once()
                self._flush()
            self._flush()
        finally:
            try:
                self._flush()  # best effort on the way out (Ctrl-C): what was seen is kept
            finally:
                self.shutdown()
        return self.final

    def _emit(self, res: CaseResult, final: bool) -> None:
        self._out.append((res, final))

    def _flush(self) -> None:
        if not self._out:
            return
        out, self._out = self._out, []
        if self.on_results is not None:
            self.on_results(out)
        else:
            for res, final in out:
                self.on_result(res, final)

    def shutdown(self) -> None:
        for g in self.gangs:
            if g.state != GangState.DEAD:
                self._teardown(g)
        self.gangs = []
        self.jobs = []

    # -- dispatch -------------------------------------------------------------------------------

    def _width(self, tp: int) -> int:
        """Slots a gang of `tp` takes (a share of a GPU each for tp 1, whole devices for a gang)."""
        return tp if tp == 1 else tp * self._per_gpu

    def _case_width(self, case: Case) -> int:
        """Slots a case takes: a gang's whole devices; for tp 1 one share of a GPU, or several
        where its recorded need says one is too small (an out-of-memory on a share widens it
        later: _widen)."""
        if case.tp != 1 or self._per_gpu == 1:
            return self._width(case.tp)
        need = self.config.memory_needs.get(case.case_id, 0)
        return slot_width(need, self.config.device_bytes, self.config.gpu_memory_utilization, self._per_gpu)

    def _gang_width(self, g: Gang) -> int:
        """Slots a live gang takes: a tp 1 worker its shares (1 / N of a GPU each), a gang's ranks
        whole devices."""
        if g.tp != 1:
            return self._width(g.tp)
        return max(1, round(g.spec.gpu_share * self._per_gpu)) if self.cluster.device_kind == "gpu" else 1

    def _tp(self, task: Task) -> int:
        return self._cases[task.id].tp

    def _memory(self, tp: int, width: int = 1) -> tuple[tuple[str, object], ...]:
        """The actors' MemoryBudget (backend/harness/memory.py), as hashable items."""
        share = width / self._per_gpu if tp == 1 else 1.0
        return (("utilization", self.config.gpu_memory_utilization), ("share", share),
                ("device_bytes", self.config.gpu_memory_bytes))

    def _held(self, node: int) -> int:
        """Slots reserved on the node: a pg's every bundle while any gang over it lives."""
        pgs = {id(g.pg): g.pg_size * self._gang_width(g) // g.spec.tp
               for g in self.gangs if g.node == node and g.state != GangState.DEAD}
        return sum(pgs.values())

    def _teardown(self, g: Gang) -> None:
        """Kill the gang; its pg goes with the last live gang over it (gangs.py: re-formed views)."""
        shared = any(o is not g and o.pg is g.pg and o.state != GangState.DEAD for o in self.gangs)
        gangs.teardown(g, remove_pg=not shared)

    def _free(self, node: int) -> int:
        """Slots the dispatcher may fill: not held by a gang that is busy or coming up."""
        busy = sum(self._gang_width(g) for g in self.gangs
                   if g.node == node and g.state not in (GangState.DEAD, GangState.IDLE))
        if not self._alive[node]:
            return 0
        free = self.cluster.nodes[node].slots - busy
        cores = self.cluster.nodes[node].cores
        if cores and busy:  # CPU: a second gang only while the ranks fit in the cores (NodeSlots)
            free = min(free, cores - busy)
        return max(free, 0)

    def _fill(self) -> None:
        self._refresh_nodes()
        self.gangs = [g for g in self.gangs if g.state != GangState.DEAD]
        for node in range(len(self.cluster.nodes)):
            refused: set[str] = set()
            while self._free(node) > 0:
                idle = [g for g in self.gangs if g.node == node and g.state == GangState.IDLE]
                last = idle[0].last_group if idle else None
                task = self.dispatcher.next_for(node, self._free(node), last)
                if task is None:
                    break
                self._queued.pop(task.id, None)
                case = self._cases[task.id]
                if self._no_place_tp is not None and case.tp >= self._no_place_tp:
                    self.dispatcher.done(task, 0.0)
                    self._not_run(case, f"needs {case.tp} {self._unit}s on one node (an earlier placement timed out)")
                    continue
                gang = self._gang_for(node, task, idle)
                if gang is None:  # a retry that must avoid the only idle worker: ask again later
                    self._requeue(task)
                    if task.id in refused:
                        break
                    refused.add(task.id)
                    continue
                batch = self._batch(node, task, gang)
                if gang.state == GangState.IDLE:
                    self._submit(gang, batch)
                else:
                    # A gang coming up: its placement job carries the first batch.
                    next(j for j in self.jobs if j.gang is gang).tasks = batch

    def _gang_for(self, node: int, task: Task, idle: list[Gang]) -> Gang | None:
        avoid = self._first[task.id].worker if task.id in self._first else None
        tp, width = self._tp(task), task.tp
        same = [g for g in idle if g.tp == tp and self._gang_width(g) == width and not (avoid and g.label == avoid)]
        same.sort(key=lambda g: g.last_group != task.group)
        if same:
            return same[0]
        fits = [g for g in idle if g.tp == tp and self._gang_width(g) == width]
        if avoid and any(g.label == avoid for g in fits) and self.cluster.total_slots < 2 * width:
            return fits[0]  # nowhere else to go
        if self.config.reuse_gangs and self._per_gpu == 1:
            parts = self._reform(task, idle, avoid)
            if parts is not None:
                return parts
        # New gang: tear idle gangs down until its slots are unheld (counted free by _free).
        for g in sorted(idle, key=lambda g: g.tp == tp):  # other sizes go first
            if self.cluster.nodes[node].slots - self._held(node) >= width:
                break
            self._teardown(g)
        if self.cluster.nodes[node].slots - self._held(node) < width:
            return None
        spec = GangSpec(tp, self.cluster.device_kind, self.config.runner, self.log_dir, self.cluster.cpu_per_worker,
                        gpu_share=width / self._per_gpu if tp == 1 else 1.0, memory=self._memory(tp, width))
        gang, ready = gangs.place(spec, node, self.cluster.nodes[node].node_id)
        self.gangs.append(gang)
        self.jobs.append(_Job("place", gang, [ready], time.monotonic() + self.config.placement_timeout_s, []))
        return gang

    def _reform(self, task: Task, idle: list[Gang], avoid: str | None) -> Gang | None:
        """Split the smallest idle gang whose ranks divide into task.tp-sized gangs (#13: the tp 8
        gang's processes serve the tp 4, 2 and 1 phases); returns the one to carry the batch."""
        fits = sorted((g for g in idle if gangs.splits(g, task.tp)), key=lambda g: g.tp)
        if not fits:
            return None
        parts, refs = gangs.reform(fits[0], task.tp)
        deadline = time.monotonic() + self.config.setup_timeout_s
        for part, part_refs in zip(parts, refs):
            self.gangs.append(part)
            self.jobs.append(_Job("leave", part, part_refs, deadline, []))
        # A retry avoids the worker of its first attempt; the split gives at least two to choose from.
        return next((p for p in parts if p.label != avoid), parts[-1])

    def _batch(self, node: int, first: Task, gang: Gang) -> list[Task]:
        batch, total = [first], first.est_s
        if first.id in self._singles or first.est_s >= self.config.batch_target_s:
            return batch
        while len(batch) < self.config.max_batch:
            t = self.dispatcher.next_for(node, self._gang_width(gang), first.group)
            if t is None:
                break
            ok = (t.tp == self._gang_width(gang) and t.id not in self._singles and total + t.est_s < self.config.batch_target_s
                  and not (t.id in self._first and self._first[t.id].worker == gang.label))  # fmt: skip
            if not ok:
                self.dispatcher.requeue(t)
                break
            self._queued.pop(t.id, None)
            batch.append(t)
            total += t.est_s
        return batch

    def _timeout(self, task: Task) -> float:
        return self.config.timeout_s or self._cases[task.id].timeout_s

    def _submit(self, gang: Gang, batch: list[Task]) -> None:
        refs = gangs.run_batch(gang, [self._cases[t.id].to_dict() for t in batch])
        # A batch may use its longest case's deadline plus generous room for the others.
        deadline = time.monotonic() + max(self._timeout(t) for t in batch) + 2 * sum(t.est_s for t in batch[1:])
        self.jobs.append(_Job("batch", gang, refs, deadline, batch))
        gang.last_group = batch[-1].group

    def _requeue(self, task: Task) -> None:
        self.dispatcher.requeue(task)
        self._queued[task.id] = task

    # -- waiting --------------------------------------------------------------------------------

    def _ours(self) -> float:
        """What our placed gangs reserve, in the resource other drivers compete for."""
        gpu = self.cluster.device_kind == "gpu"
        pgs = {id(g.pg): g.pg_size * (g.spec.gpu_share if gpu else self.cluster.cpu_per_worker)
               for g in self.gangs if g.state not in (GangState.DEAD, GangState.PLACING)}  # a share of a GPU each
        return sum(pgs.values())

    def _watch_placements(self) -> None:
        placing = [(j.gang.tp, j.started, j.gang.pg) for j in self.jobs if j.kind == "place"]
        if self._sharing.tick(placing, self._ours):
            for g in [g for g in self.gangs if g.state == GangState.IDLE]:
                self._teardown(g)  # never sit on GPUs another driver's gang may be waiting for

    def _wait_once(self) -> None:
        import ray

        self._watch_placements()
        now = time.monotonic()
        refs = [r for j in self.jobs for r in j.pending]
        timeout = max(0.0, min([j.deadline for j in self.jobs] + [now + self.config.poll_s]) - now)
        ready: list[Any] = []
        if refs:
            ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
            if ready and rest:
                ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        else:
            time.sleep(timeout)
        ready_set = set(ready)
        for job in list(self.jobs):
            hit = job.pending & ready_set
            if not hit:
                continue
            job.pending -= hit
            err = None
            for r in hit:
                try:
                    ray.get(r, timeout=0)
                except Exception as e:  # noqa: BLE001 - RayActorError, task error, ...
                    err = e
                    break
            if err is not None:
                self._jobs_remove(job)
                self._job_failed(job, err)
            elif not job.pending:
                self._jobs_remove(job)
                self._job_done(job, ray.get(job.refs))
        now = time.monotonic()
        for job in list(self.jobs):
            if now >= job.deadline:
                self._jobs_remove(job)
                self._job_expired(job)

    def _jobs_remove(self, job: _Job) -> None:
        self.jobs = [j for j in self.jobs if j is not job]

    def _job_done(self, job: _Job, values: list[Any]) -> None:
        g = job.gang
        if job.kind == "place":
            refs = gangs.start_actors(g)
            self.jobs.append(_Job("start", g, refs, time.monotonic() + self.config.setup_timeout_s, job.tasks))
        elif job.kind in ("start", "leave"):  # leave: a re-formed gang, its ranks out of the old group
            refs = gangs.join(g, values, self.config.setup_timeout_s)
            if refs:
                self.jobs.append(_Job("join", g, refs, time.monotonic() + self.config.setup_timeout_s, job.tasks))
            elif job.tasks:
                self._submit(g, job.tasks)
        elif job.kind == "join":
            g.state = GangState.IDLE
            if job.tasks:  # a split's other gangs come up with no batch: idle until asked
                self._submit(g, job.tasks)
        else:
            g.state = GangState.IDLE
            elapsed = time.monotonic() - job.started
            poisoned = False
            for i, task in enumerate(job.tasks):
                ranks = [CaseResult.from_dict(rank[i]) for rank in values]
                if any(r.status == Status.NOT_RUN for r in ranks):  # the gang barrier tripped
                    poisoned = True
                    culprit = [r for r in ranks if r.status == Status.ERROR]
                    if not culprit:  # an innocent case on an out-of-step gang: run it again
                        self._out_of_step(task, ranks[0].reason)
                        continue
                    ranks = culprit[:1]  # the rank that left the case early is the verdict
                res = merge_rank_results(ranks).replace(worker=g.label)
                if self._widen(task, g, res):
                    poisoned = poisoned or poisons_worker(res)
                    continue
                if poisons_worker(res):  # verdicts.py: device errors, sticky faults in a capture
                    poisoned = True
                    if res.error_kind != OOM_KIND:  # an oom stays one (retried: verdicts.retried)
                        # A sticky fault seen inside a capture is the machine's, not the code's: retried.
                        res = res.replace(reason=f"{res.reason} (device error: worker recycled)", error_kind="exception")
                self._attempt(task, res, elapsed / len(job.tasks))
            if poisoned:
                self._teardown(g)

    def _job_failed(self, job: _Job, err: BaseException) -> None:
        g = job.gang
        self._teardown(g)
        if self._node_died(g, err):
            for t in job.tasks:
                self._lost[t.id] = self._lost.get(t.id, 0) + 1
            recurring = [t for t in job.tasks if self._lost[t.id] > 1]
            for t in job.tasks:
                if t not in recurring:
                    self._requeue(t)
            if not recurring:
                return
            job = _Job(job.kind, g, [], job.deadline, recurring, job.started)
        if job.kind != "batch":
            self._setup_failed(job, f"tp{g.tp} gang setup failed ({job.kind}): {first_line(err)}")
            return
        self._lost_batch(job, f"worker process died: {first_line(err)}", "crash", Status.ERROR)

    def _job_expired(self, job: _Job) -> None:
        g = job.gang
        if job.kind == "place" and self._sharing.keep_waiting(g.pg, self._ours()):  # held by someone: wait on
            job.deadline = time.monotonic() + self.config.placement_timeout_s
            self.jobs.append(job)
            return
        self._teardown(g)
        if job.kind == "place":
            tp = g.tp
            self._no_place_tp = tp if self._no_place_tp is None else min(self._no_place_tp, tp)
            for t in job.tasks:
                self.dispatcher.done(t, 0.0)
                self._not_run(self._cases[t.id], f"needs {tp} {self._unit}s on one node (no placement within {self.config.placement_timeout_s:.0f}s)")
            return
        if job.kind in ("start", "join", "leave"):
            self._setup_failed(job, f"tp{g.tp} gang did not come up within {self.config.setup_timeout_s:.0f}s ({job.kind})")
            return
        limit = self._timeout(job.tasks[0])
        self._lost_batch(job, f"no result within {limit:.0f}s: worker killed and recreated", "timeout", Status.TIMEOUT)

    def _out_of_step(self, task: Task, reason: str) -> None:
        self._setup_fails[task.id] = self._setup_fails.get(task.id, 0) + 1
        if self._setup_fails[task.id] > 1:
            self.dispatcher.done(task, 0.0)
            self._not_run(self._cases[task.id], reason, kind="gang")
        else:
            self._singles.add(task.id)
            self._requeue(task)

    def _setup_failed(self, job: _Job, reason: str) -> None:
        """Placing, starting or joining a gang failed before any case ran in it: not the cases'
        fault. They are requeued once (a new gang); a second setup failure is NOT_RUN "gang"."""
        for t in job.tasks:
            self._setup_fails[t.id] = self._setup_fails.get(t.id, 0) + 1
            if self._setup_fails[t.id] > 1:
                self.dispatcher.done(t, 0.0)
                self._not_run(self._cases[t.id], reason, kind="gang")
            else:
                self._requeue(t)

    def _lost_batch(self, job: _Job, reason: str, kind: str, status: Status) -> None:
        """A batch lost to a crash or hang: alone, the case is to blame; else find it singly."""
        if len(job.tasks) == 1:
            t = job.tasks[0]
            res = self._error(t, job.gang, reason, kind, status)
            self._attempt(t, res, time.monotonic() - job.started)
            return
        for t in job.tasks:
            self._singles.add(t.id)
            self._requeue(t)

    def _node_died(self, g: Gang, err: BaseException) -> bool:
        """Was the gang lost with its node rather than killed by its case?

        ActorUnavailableError (connection to the actor's node broken) comes before the GCS has
        noticed the node is gone, so it counts as a loss too; a case that really kills its
        worker gets ActorDiedError, and one that keeps "losing nodes" is blamed on recurrence.
        """
        from ray.exceptions import ActorUnavailableError

        self._refresh_nodes(force=True)
        return (not self._alive[g.node] or isinstance(err, ActorUnavailableError)
                or bool(NODE_DEATH.search(str(err))))  # fmt: skip

    def _refresh_nodes(self, force: bool = False) -> None:
        """Stop using nodes the GCS reports dead (checked at most once a second)."""
        import ray

        now = time.monotonic()
        if not force and now - self._nodes_checked < 1.0:
            return
        self._nodes_checked = now
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        for i, n in enumerate(self.cluster.nodes):
            if self._alive[i] and n.node_id not in alive:
                self._alive[i] = False
                for g in self.gangs:
                    if g.node == i and g.state == GangState.IDLE:
                        self._teardown(g)

    # -- results --------------------------------------------------------------------------------

    def _error(self, t: Task, g: Gang, reason: str, kind: str, status: Status = Status.ERROR) -> CaseResult:
        case = self._cases[t.id]
        # The actor's log holds earlier cases too: keep what follows this case's start marker.
        tails = [read_tail(p) for p in g.log_paths]
        tails = [s[s.rfind(f"[orch] case {t.id} ") :] if f"[orch] case {t.id} " in s else s for s in tails]
        tail = tails[0] if len(tails) == 1 else "\n".join(f"--- rank {r} ---\n{s}" for r, s in enumerate(tails) if s)
        return CaseResult(
            case_id=case.case_id, status=status, reason=reason, requested_mode=case.mode, error_kind=kind,
            log_tail=tail, repro=case.repro_command(), worker=g.label, axes=case.axes,
            device=g.infos[0].device if g.infos else "",
        )  # fmt: skip

    def _skip_placement(self, case: Case, reason: str) -> None:
        res = CaseResult(case_id=case.case_id, status=Status.SKIP, reason=reason, requested_mode=case.mode,
                         error_kind="placement", repro=case.repro_command(), axes=case.axes)  # fmt: skip
        self.final[case.case_id] = res
        self._emit(res, True)

    def _not_run(self, case: Case, reason: str, kind: str = "placement") -> None:
        """A runnable, required case that will not run: NOT_RUN, or, for a retry, the first
        attempt's failure (it was observed; only its confirmation is missing)."""
        first = self._first.pop(case.case_id, None)
        if first is not None:
            res = first.replace(reason=f"{first.reason}; retry not run: {reason}")
        else:
            res = CaseResult(case_id=case.case_id, status=Status.NOT_RUN, reason=f"not run: {reason}",
                             requested_mode=case.mode, error_kind=kind, repro=case.repro_command(), axes=case.axes)  # fmt: skip
        self.final[case.case_id] = res
        self._emit(res, True)

    def _widen(self, task: Task, g: Gang, res: CaseResult) -> bool:
        """A tp 1 case that ran out of memory on a worker of less than a whole GPU saw nothing of
        the backend: it runs again on a worker of the whole GPU (its share of the budget was the
        limit, not the device), and only an out-of-memory there is its verdict (`oom`)."""
        if res.error_kind != OOM_KIND or g.tp != 1 or task.id in self._widened:
            return False
        width = self._gang_width(g)
        if width >= self._per_gpu:
            return False
        self._widened[task.id] = (f"out of device memory on a worker of {width}/{self._per_gpu} of a GPU "
                                  f"({first_line(res.reason)}): rerun on a whole GPU")
        wide = dataclasses.replace(task, tp=self._per_gpu)
        self.dispatcher.requeue(task, wide)
        self._queued[task.id] = wide
        return True

    def _attempt(self, task: Task, res: CaseResult, duration_s: float) -> None:
        if task.id in self._widened:
            res = res.replace(log_tail=(self._widened[task.id] + "\n" + res.log_tail).strip())
        first = self._first.pop(task.id, None)
        if first is None and retried(res, self._tp(task)) and self.config.retries > 0:
            self._first[task.id] = res
            self._emit(res, False)
            self._requeue(task)
            return
        if first is not None:
            res = two_attempts(first, res)
        self.dispatcher.done(task, duration_s)
        self.final[task.id] = res
        self._emit(res, True)
