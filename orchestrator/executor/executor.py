"""The dispatch loop: cases -> Tasks -> Dispatcher -> gangs of worker actors -> CaseResults.

Single-threaded driver. Every piece of in-flight work is a `_Job` (placing a gang, starting its
actors, the tp rendezvous, a batch of cases) holding Ray refs and a deadline; the loop waits on
all refs at once (`ray.wait`, bounded by the nearest deadline), so a hang is a deadline that
passed, never a blocked driver. What an outcome means is decided by pure parts: the gang pool
(pool.py: slots, widths, which gang a task gets), the attempts (attempts.py: retries, flaky,
widening, lost batches, not-run) and the verdict rules (verdicts.py). This module only talks to
Ray: it places, starts, joins, runs and kills gangs, and turns Ray's answers into calls on those.
Other drivers may share the cluster: placements that wait on their GPUs are handled in sharing.py.
"""

from __future__ import annotations

import enum
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.case import Case
from backend.result import CaseResult, Status
from orchestrator.executor import gangs
from orchestrator.executor.actors import read_tail
from orchestrator.executor.attempts import Action, Attempts, batch_deadline_s, classify
from orchestrator.executor.cluster import ClusterInfo
from orchestrator.executor.config import Deferral, ExecConfig, config_key, group_key
from orchestrator.executor.gangs import Gang, GangState
from orchestrator.executor.packing import config_widths
from orchestrator.executor.pool import ChoiceKind, GangPool
from orchestrator.executor.sharing import SharedCluster
from orchestrator.executor.verdicts import NODE_DEATH, ErrorKind, first_line
from orchestrator.scheduling.cost import estimate_all, grouped_estimates
from orchestrator.scheduling.policy import Dispatcher, Task

__all__ = ["Deferral", "ExecConfig", "Executor", "JobKind", "group_key"]


class JobKind(enum.Enum):
    PLACE = "place"  # waiting on the placement group
    START = "start"  # the gang's actors starting (their info())
    LEAVE = "leave"  # ranks leaving their process group to form another (gangs.reform, gangs.merge)
    JOIN = "join"  # the tp rendezvous
    BATCH = "batch"  # a batch of cases running


SETUP_KINDS = (JobKind.START, JobKind.LEAVE, JobKind.JOIN)


@dataclass
class _Job:
    kind: JobKind
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
        config: ExecConfig | None = None,
        *,
        on_result: Callable[[CaseResult, bool], None] | None = None,
        on_results: Callable[[list[tuple[CaseResult, bool]]], None] | None = None,
        history: dict[str, float] | None = None,
        deferral: Deferral | None = None,
        on_notice: Callable[[str], None] | None = None,
    ):
        config = config or ExecConfig()
        self.cluster = cluster
        self.config = config
        self.pool = GangPool(cluster, config)
        self._sharing = SharedCluster(cluster, config, on_notice or (lambda msg: None), self.pool.unit)
        self.deferral = deferral
        self.on_result = on_result or (lambda r, final: None)
        # Group commit: results are handed over once per loop turn (one Ray wait's worth of
        # batches), so a store can commit them in one transaction before anything is reported.
        self.on_results = on_results
        self.history = history or {}
        self.log_dir = config.log_dir or tempfile.mkdtemp(prefix="orch-workers-")
        self.jobs: list[_Job] = []
        self._nodes_checked = 0.0
        self.attempts = Attempts({}, Dispatcher([], [1]), retries=config.retries, unit=self.pool.unit)

    @property
    def final(self) -> dict[str, CaseResult]:
        return self.attempts.final

    @property
    def gangs(self) -> list[Gang]:
        return self.pool.gangs

    # -- public ---------------------------------------------------------------------------------

    def run(self, cases: Sequence[Case]) -> dict[str, CaseResult]:
        """Run every case once (plus retries); returns case_id -> final result."""
        # A config's later modes are cheap once they follow its first on one worker (Attempts.batch).
        est = grouped_estimates(cases, estimate_all(cases, self.history), config_key, self.history)
        configs = {c.case_id: config_key(c) for c in cases}
        widths = config_widths({c.case_id: self.pool.case_width(c) for c in cases}, configs)
        tasks, skipped = [], []
        for c in cases:
            reason = self.pool.too_wide(c)
            if reason is not None:
                skipped.append((c, reason))
                continue
            later = self.deferral is not None and c.backend in self.deferral.backends
            tasks.append(
                Task(
                    c.case_id,
                    widths[c.case_id],
                    est[c.case_id],
                    group_key(c),
                    tier=int(later),
                    config=configs[c.case_id],
                )
            )
        self.dispatcher = Dispatcher(tasks, self.pool.slots)
        self.attempts = Attempts(
            {c.case_id: c for c in cases}, self.dispatcher, retries=self.config.retries, unit=self.pool.unit
        )
        for c, reason in skipped:
            self.attempts.skip_placement(c, reason)
        self.attempts.queue(tasks)
        deferring = self.deferral is not None and any(t.tier for t in tasks)
        try:
            while True:
                if deferring and self.deferral is not None and not self.deferral.pending():
                    self.dispatcher.lift_tiers()
                    deferring = False
                self._fill()
                self._flush()
                if not self.jobs:
                    self.attempts.unplaceable()  # nothing runs and nothing fits anywhere
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

    def _flush(self) -> None:
        out = self.attempts.take_out()
        if not out:
            return
        if self.on_results is not None:
            self.on_results(out)
        else:
            for res, final in out:
                self.on_result(res, final)

    def shutdown(self) -> None:
        for g in self.pool.gangs:
            if g.state != GangState.DEAD:
                self._teardown(g)
        self.pool.gangs = []
        self.jobs = []

    # -- dispatch -------------------------------------------------------------------------------

    def _teardown(self, g: Gang) -> None:
        """Kill the gang; its pg goes with the last live gang over it (gangs.py: re-formed views)."""
        gangs.teardown(g, remove_pg=not self.pool.shares_pg(g))

    def _fill(self) -> None:
        self._refresh_nodes()
        self.pool.prune()
        for node in range(len(self.cluster.nodes)):
            refused: set[str] = set()
            while self.pool.free(node) > 0:
                task = self.dispatcher.next_for(node, self.pool.free(node), self.pool.warm(node))
                if task is None:
                    break
                self.attempts.taken(task)
                if self.attempts.blocked(task):
                    continue
                gang = self._gang_for(node, task)
                if gang is None:  # a retry that must avoid the only idle worker: ask again later
                    self.attempts.requeue(task)
                    if task.id in refused:
                        break
                    refused.add(task.id)
                    continue
                batch = self.attempts.batch(
                    node,
                    task,
                    self.pool.gang_width(gang),
                    gang.label,
                    self.config.batch_target_s,
                    self.config.max_batch,
                )
                if gang.state == GangState.IDLE:
                    self._submit(gang, batch)
                else:
                    # A gang coming up: its placement job carries the first batch.
                    next(j for j in self.jobs if j.gang is gang).tasks = batch

    def _gang_for(self, node: int, task: Task) -> Gang | None:
        avoid = self.attempts.avoid(task.id)
        choice = self.pool.choose(node, self.attempts.cases[task.id].tp, task.tp, task.group, avoid)
        if choice.kind == ChoiceKind.REUSE:
            return choice.gang
        if choice.kind == ChoiceKind.REFORM:
            assert choice.gang is not None
            parts, refs = gangs.reform(choice.gang, task.tp)
            deadline = time.monotonic() + self.config.setup_timeout_s
            for part, part_refs in zip(parts, refs):
                self.pool.gangs.append(part)
                self.jobs.append(_Job(JobKind.LEAVE, part, part_refs, deadline, []))
            return self.pool.carrier(parts, avoid)
        if choice.kind == ChoiceKind.MERGE:
            gang, refs = gangs.merge(choice.parts, self.attempts.cases[task.id].tp)
            self.pool.gangs.append(gang)
            self.jobs.append(_Job(JobKind.LEAVE, gang, refs, time.monotonic() + self.config.setup_timeout_s, []))
            return gang
        for g in choice.teardown:
            self._teardown(g)
        if choice.kind == ChoiceKind.WAIT:
            return None
        tp = self.attempts.cases[task.id].tp
        spec = self.pool.spec(tp, task.tp, self.log_dir, node)
        gang, ready = gangs.place(spec, node, self.cluster.nodes[node].node_id)
        self.pool.gangs.append(gang)
        self.jobs.append(_Job(JobKind.PLACE, gang, [ready], time.monotonic() + self.config.placement_timeout_s, []))
        return gang

    def _timeout(self, task: Task) -> float:
        return self.config.timeout_s or self.attempts.cases[task.id].timeout_s

    def _submit(self, gang: Gang, batch: list[Task]) -> None:
        # Each case's recorded need (set when workers share GPUs): the worker makes room for it first.
        needs = [self.config.memory_needs.get(t.id, 0) for t in batch]
        refs = gangs.run_batch(
            gang, [self.attempts.cases[t.id].to_dict() for t in batch], needs if any(needs) else None
        )
        allowed = batch_deadline_s([self._timeout(t) for t in batch], [t.est_s for t in batch])
        self.jobs.append(_Job(JobKind.BATCH, gang, refs, time.monotonic() + allowed, batch))
        for t in batch:
            gang.ran(t.group)

    # -- waiting --------------------------------------------------------------------------------

    def _watch_placements(self) -> None:
        placing = [(j.gang.tp, j.started, j.gang.pg) for j in self.jobs if j.kind == JobKind.PLACE]
        if self._sharing.tick(placing, self.pool.ours):
            for g in self.pool.idle():
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
        if job.kind == JobKind.PLACE:
            refs = gangs.start_actors(g)
            self.jobs.append(_Job(JobKind.START, g, refs, time.monotonic() + self.config.setup_timeout_s, job.tasks))
        elif job.kind in (JobKind.START, JobKind.LEAVE):  # leave: a re-formed gang, out of the old group
            refs = gangs.join(g, values, self.config.setup_timeout_s)
            if refs:
                self.jobs.append(_Job(JobKind.JOIN, g, refs, time.monotonic() + self.config.setup_timeout_s, job.tasks))
            elif job.tasks:
                self._submit(g, job.tasks)
        elif job.kind == JobKind.JOIN:
            g.state = GangState.IDLE
            if job.tasks:  # a split's other gangs come up with no batch: idle until asked
                self._submit(g, job.tasks)
        else:
            self._batch_done(job, values)

    def _batch_done(self, job: _Job, values: list[Any]) -> None:
        g = job.gang
        g.state = GangState.IDLE
        each_s = (time.monotonic() - job.started) / len(job.tasks)
        recycle = False
        for i, task in enumerate(job.tasks):
            ranks = [CaseResult.from_dict(rank[i]) for rank in values]
            narrower = self.pool.narrower_than_gpu(g) and task.id not in self.attempts.widened
            seen = classify(ranks, g.label, narrower)
            recycle = recycle or seen.recycle
            if seen.action == Action.OUT_OF_STEP:
                self.attempts.out_of_step(task, seen.reason)
            elif seen.action == Action.WIDEN:
                assert seen.result is not None
                self.attempts.out_of_memory(
                    task, seen.result, self.pool.gang_width(g), self.pool.per_gpu, recycled=seen.recycle
                )
            else:
                assert seen.result is not None
                self.attempts.attempt(task, seen.result, each_s)
        if recycle:
            self._teardown(g)

    def _job_failed(self, job: _Job, err: BaseException) -> None:
        g = job.gang
        self._teardown(g)
        if self._node_died(g, err):
            recurring = self.attempts.node_lost(job.tasks)
            if not recurring:
                return
            job = _Job(job.kind, g, [], job.deadline, recurring, job.started)
        if job.kind != JobKind.BATCH:
            self._setup_failed(job, f"tp{g.tp} gang setup failed ({job.kind.value}): {first_line(err)}")
            return
        self._lost_batch(job, f"worker process died: {first_line(err)}", ErrorKind.CRASH, Status.ERROR)

    def _job_expired(self, job: _Job) -> None:
        g = job.gang
        if job.kind == JobKind.PLACE and self._sharing.keep_waiting(g.pg, self.pool.ours()):
            job.deadline = time.monotonic() + self.config.placement_timeout_s  # held by someone: wait on
            self.jobs.append(job)
            return
        self._teardown(g)
        if job.kind == JobKind.PLACE:
            self.attempts.placement_timed_out(g.tp, job.tasks, self.config.placement_timeout_s)
        elif job.kind in SETUP_KINDS:
            self._setup_failed(
                job, f"tp{g.tp} gang did not come up within {self.config.setup_timeout_s:.0f}s ({job.kind.value})"
            )
        else:
            limit = self._timeout(job.tasks[0])
            self._lost_batch(
                job, f"no result within {limit:.0f}s: worker killed and recreated", ErrorKind.TIMEOUT, Status.TIMEOUT
            )

    def _setup_failed(self, job: _Job, reason: str) -> None:
        """Placing, starting or joining a gang failed before any case ran in it: not the cases'
        fault. They are requeued once (a new gang); a second setup failure is NOT_RUN "gang"."""
        self.attempts.setup_failed(job.tasks, reason)

    def _lost_batch(self, job: _Job, reason: str, kind: ErrorKind | str, status: Status) -> None:
        """A batch lost to a crash or hang: alone, the case is to blame; else find it singly."""
        culprit = self.attempts.lost_batch(job.tasks)
        if culprit is not None:
            res = self._error(culprit, job.gang, reason, ErrorKind(kind), status)
            self.attempts.attempt(culprit, res, time.monotonic() - job.started)

    def _node_died(self, g: Gang, err: BaseException) -> bool:
        """Was the gang lost with its node rather than killed by its case? ActorUnavailableError
        comes before the GCS has noticed the node is gone, so it counts as a loss too; a case that
        really kills its worker gets ActorDiedError, and one that keeps "losing nodes" is blamed."""
        from ray.exceptions import ActorUnavailableError

        self._refresh_nodes(force=True)
        return (
            not self.pool.alive[g.node] or isinstance(err, ActorUnavailableError) or bool(NODE_DEATH.search(str(err)))
        )

    def _refresh_nodes(self, force: bool = False) -> None:
        """Stop using nodes the GCS reports dead (checked at most once a second)."""
        import ray

        now = time.monotonic()
        if not force and now - self._nodes_checked < 1.0:
            return
        self._nodes_checked = now
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        for i, n in enumerate(self.cluster.nodes):
            if self.pool.alive[i] and n.node_id not in alive:
                for g in self.pool.node_lost(i):
                    self._teardown(g)

    # -- results --------------------------------------------------------------------------------

    def _error(self, t: Task, g: Gang, reason: str, kind: ErrorKind, status: Status = Status.ERROR) -> CaseResult:
        case = self.attempts.cases[t.id]
        # The actor's log holds earlier cases too: keep what follows this case's start marker.
        tails = [read_tail(p) for p in g.log_paths]
        tails = [s[s.rfind(f"[orch] case {t.id} ") :] if f"[orch] case {t.id} " in s else s for s in tails]
        tail = tails[0] if len(tails) == 1 else "\n".join(f"--- rank {r} ---\n{s}" for r, s in enumerate(tails) if s)
        return CaseResult(
            case_id=case.case_id,
            status=status,
            reason=reason,
            requested_mode=case.mode,
            error_kind=kind.value,
            log_tail=tail,
            repro=case.repro_command(),
            worker=g.label,
            axes=case.axes,
            device=g.infos[0].device if g.infos else "",
        )
