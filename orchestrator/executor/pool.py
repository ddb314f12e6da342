"""The gang pool: which gangs exist, what they hold on each node, and where a task's gang comes
from. Pure (no Ray): the executor's loop applies what it decides (gangs.place, reform, teardown).

A slot is what the dispatcher counts: a whole device, or with N workers per GPU a 1/N share of
one. A tp 1 worker takes its shares; a gang's rank takes a whole device (NCCL refuses two ranks
of one communicator on one GPU, and Ray cannot place fractional bundles on distinct GPUs), so a
tp t case is t x N slots wide, and idle gangs are not split into tp 1 workers then (the split
workers would hold whole devices). A placement group's bundles stay held while any gang over it
lives (gangs.py: a split's gangs are views over one pg).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backend.case import Case
from orchestrator.executor import gangs
from orchestrator.executor.cluster import ClusterInfo, DeviceKind
from orchestrator.executor.gangs import Gang, GangSpec, GangState
from orchestrator.executor.packing import slot_width
from orchestrator.executor.threads import CPU_WORKER_THREADS, worker_threads
from orchestrator.scheduling.policy import WARM_GROUPS

if TYPE_CHECKING:
    from orchestrator.executor.config import ExecConfig


class ChoiceKind(enum.Enum):
    REUSE = "reuse"  # run on `gang`, an idle gang of the right tp and width
    REFORM = "reform"  # split `gang`, an idle larger gang, into gangs of the task's tp
    MERGE = "merge"  # join `parts`, idle views of one placement group, into one gang of the task's tp
    PLACE = "place"  # place a new gang (after tearing down `teardown`)
    WAIT = "wait"  # no room on the node now (after tearing down `teardown`): ask again later


@dataclass(frozen=True)
class Choice:
    kind: ChoiceKind
    gang: Gang | None = None
    teardown: tuple[Gang, ...] = ()
    parts: tuple[Gang, ...] = ()


class GangPool:
    def __init__(self, cluster: ClusterInfo, config: ExecConfig):
        self.cluster = cluster
        self.config = config
        self.gpu = cluster.device_kind == DeviceKind.GPU
        self.per_gpu = cluster.workers_per_gpu if self.gpu else 1
        self.unit = "GPU" if self.gpu else "CPU worker"
        self.gangs: list[Gang] = []
        self.alive = [True] * len(cluster.nodes)

    # -- widths ---------------------------------------------------------------------------------

    @property
    def slots(self) -> list[int]:
        return [n.slots for n in self.cluster.nodes]

    def width(self, tp: int) -> int:
        """Slots a gang of `tp` takes (a share of a GPU for tp 1, whole devices for a gang)."""
        return tp if tp == 1 else tp * self.per_gpu

    def case_width(self, case: Case) -> int:
        """Slots a case takes: a gang's whole devices; for tp 1 one share of a GPU, or several
        where its recorded need says one is too small (an out-of-memory on a share widens it later)."""
        if case.tp != 1 or self.per_gpu == 1:
            return self.width(case.tp)
        need = self.config.memory_needs.get(case.case_id, 0)
        return slot_width(need, self.config.device_bytes, self.config.gpu_memory_utilization, self.per_gpu)

    def gang_width(self, g: Gang) -> int:
        """Slots a live gang takes: a tp 1 worker its shares, a gang's ranks whole devices."""
        if g.tp != 1:
            return self.width(g.tp)
        return max(1, round(g.spec.gpu_share * self.per_gpu)) if self.gpu else 1

    def too_wide(self, case: Case) -> str | None:
        """Why a case can never run on this cluster (its tp is larger than any node), or None."""
        largest = max(self.slots)
        if self.width(case.tp) <= largest:  # a tp 1 case is never wider than one GPU
            return None
        return f"needs {case.tp} {self.unit}s on one node; the largest has {largest // self.per_gpu}"

    def narrower_than_gpu(self, g: Gang) -> bool:
        """A tp 1 worker holding less than a whole GPU (an out-of-memory there widens the case)."""
        return g.tp == 1 and self.gang_width(g) < self.per_gpu

    def memory(self, tp: int, width: int = 1) -> tuple[tuple[str, object], ...]:
        """The actors' MemoryBudget (backend/harness/memory.py), as hashable items."""
        share = width / self.per_gpu if tp == 1 else 1.0
        return (
            ("utilization", self.config.gpu_memory_utilization),
            ("share", share),
            ("device_bytes", self.config.gpu_memory_bytes),
        )

    def threads(self, node: int, tp: int, width: int) -> int:
        """Torch threads for each rank of a gang placed on `node` (threads.worker_threads): a GPU
        worker's share of the node's cores by the slots it holds; a CPU worker one."""
        if not self.gpu:
            return CPU_WORKER_THREADS
        n = self.cluster.nodes[node]
        return worker_threads(n.cpus, n.slots, width if tp == 1 else self.per_gpu)

    def spec(self, tp: int, width: int, log_dir: str, node: int = 0) -> GangSpec:
        return GangSpec(
            tp,
            self.cluster.device_kind,
            self.config.runner,
            log_dir,
            self.cluster.cpu_per_worker,
            gpu_share=width / self.per_gpu if tp == 1 else 1.0,
            memory=self.memory(tp, width),
            threads=self.threads(node, tp, width),
        )

    # -- what is held ---------------------------------------------------------------------------

    def prune(self) -> None:
        self.gangs = [g for g in self.gangs if g.state != GangState.DEAD]

    def idle(self, node: int | None = None) -> list[Gang]:
        return [g for g in self.gangs if g.state == GangState.IDLE and (node is None or g.node == node)]

    def warm(self, node: int) -> tuple[str, ...]:
        """The groups the node's idle gangs hold sessions of, by recency (each gang's latest first,
        then their second latest...): what the dispatcher prefers for them (Dispatcher.next_for)."""
        idle = self.idle(node)
        ranked = sorted((i, group) for g in idle for i, group in enumerate(g.warm))
        return tuple(dict.fromkeys(group for _, group in ranked))

    def held(self, node: int, without: Collection[Gang] = ()) -> int:
        """Slots reserved on the node: a pg's every bundle while any gang over it lives (`without`:
        as if those gangs were torn down)."""
        gone = {id(g) for g in without}
        pgs = {
            id(g.pg): g.pg_size * self.gang_width(g) // g.spec.tp
            for g in self.gangs
            if g.node == node and g.state != GangState.DEAD and id(g) not in gone
        }
        return sum(pgs.values())

    def free(self, node: int) -> int:
        """Slots the dispatcher may fill: not held by a gang that is busy or coming up."""
        if not self.alive[node]:
            return 0
        busy = sum(
            self.gang_width(g) for g in self.gangs if g.node == node and g.state not in (GangState.DEAD, GangState.IDLE)
        )
        free = self.cluster.nodes[node].slots - busy
        cores = self.cluster.nodes[node].cores
        if cores and busy:  # CPU: a second gang only while the ranks fit in the cores (NodeSlots)
            free = min(free, cores - busy)
        return max(free, 0)

    def shares_pg(self, g: Gang) -> bool:
        """Another live gang is over g's placement group (a split): the pg outlives g."""
        return any(o is not g and o.pg is g.pg and o.state != GangState.DEAD for o in self.gangs)

    def ours(self) -> float:
        """What our placed gangs reserve, in the resource other drivers compete for."""
        per = (lambda g: g.spec.gpu_share) if self.gpu else (lambda g: self.cluster.cpu_per_worker)
        pgs = {id(g.pg): g.pg_size * per(g) for g in self.gangs if g.state not in (GangState.DEAD, GangState.PLACING)}
        return sum(pgs.values())

    def node_lost(self, node: int) -> list[Gang]:
        """Stop using the node; returns its idle gangs (to tear down: nothing will run there)."""
        self.alive[node] = False
        return self.idle(node)

    # -- where a task runs ----------------------------------------------------------------------

    def choose(self, node: int, tp: int, width: int, group: str, avoid: str | None) -> Choice:
        """The gang for a task of `tp` and `width` slots on `node`: an idle one of that size (the
        one holding its session first, not the worker `avoid` of its first attempt), a split of a larger idle
        one, idle views of one split joined again, or a new one once idle gangs of other sizes have
        given back their slots. A split and a join reuse live worker processes; a new gang starts
        them (seconds each), which a matrix ordered by duration would otherwise pay at every switch
        from narrow gangs back to wide ones."""
        idle = self.idle(node)
        fits = [g for g in idle if g.tp == tp and self.gang_width(g) == width]
        # The gang whose workers used the task's session most recently (their caches keep it).
        held = lambda g: g.warm.index(group) if group in g.warm else WARM_GROUPS
        same = sorted((g for g in fits if not (avoid and g.label == avoid)), key=held)
        if same:
            return Choice(ChoiceKind.REUSE, same[0])
        if avoid and any(g.label == avoid for g in fits) and self.cluster.total_slots < 2 * width:
            return Choice(ChoiceKind.REUSE, fits[0])  # nowhere else to go
        if self.config.reuse_gangs and self.per_gpu == 1:
            larger = sorted((g for g in idle if gangs.splits(g, width)), key=lambda g: g.tp)
            if larger:
                return Choice(ChoiceKind.REFORM, larger[0])
            parts = self.joinable(idle, tp)
            if parts:
                return Choice(ChoiceKind.MERGE, parts=parts)
        room = self.cluster.nodes[node].slots
        down: list[Gang] = []
        for g in sorted(idle, key=lambda g: g.tp == tp):  # other sizes go first
            if room - self.held(node, down) >= width:
                break
            down.append(g)
        kind = ChoiceKind.PLACE if room - self.held(node, down) >= width else ChoiceKind.WAIT
        return Choice(kind, None, tuple(down))

    @staticmethod
    def joinable(idle: Sequence[Gang], tp: int) -> tuple[Gang, ...]:
        """Idle narrower views of one placement group whose ranks add up to `tp` exactly (the
        widest first), or (): a join never spans two pgs (their bundles were placed apart)."""
        by_pg: dict[int, list[Gang]] = {}
        for g in idle:
            if g.tp < tp and len(g.infos) == g.tp and g.pg_size >= tp:
                by_pg.setdefault(id(g.pg), []).append(g)
        for views in by_pg.values():
            chosen, ranks = [], 0
            for g in sorted(views, key=lambda g: -g.tp):
                if ranks + g.tp <= tp:
                    chosen.append(g)
                    ranks += g.tp
            if ranks == tp:
                return tuple(chosen)
        return ()

    @staticmethod
    def carrier(parts: Sequence[Gang], avoid: str | None) -> Gang:
        """Which gang of a split carries the batch: a retry avoids its first attempt's worker (a
        split gives at least two to choose from)."""
        return next((p for p in parts if p.label != avoid), parts[-1])
