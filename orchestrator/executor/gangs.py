"""Gangs: tp worker actors in one placement group (STRICT_PACK: one node) sharing a process group.

A tp 1 worker is a gang of one, so the executor handles every worker alike. Nothing here blocks:
each step returns Ray refs and the executor advances the gang's state as Ray answers. A split's
gangs are views over the old gang's actors and placement group, which outlives them all
(`teardown(..., remove_pg=...)`): a pg's bundles stay held while any gang over it lives.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.executor.actors import CaseWorker, WorkerInfo, actor_env
from orchestrator.executor.cluster import DeviceKind
from orchestrator.scheduling.policy import hold

_ids = itertools.count()


class GangState(str, enum.Enum):
    # Waiting on pg.ready(): an impossible group never fails by itself, the executor's deadline does.
    PLACING = "placing"
    STARTING = "starting"  # actors created, waiting on their info() (device, node, rank 0's free port)
    JOINING = "joining"  # tp > 1: the torch.distributed rendezvous on 127.0.0.1 (one node by construction)
    IDLE = "idle"  # reusable for any case of the same tp
    BUSY = "busy"
    # Split: an idle gang of a larger tp becomes gangs of a tp that divides it; every rank leaves
    # the old process group, then each new gang joins on a fresh port. No new processes start.
    LEAVING = "leaving"
    DEAD = "dead"


@dataclass(frozen=True)
class GangSpec:
    tp: int
    device_kind: DeviceKind
    runner: str
    log_dir: str
    cpu_per_worker: float = 0.25
    gpu_share: float = 1.0  # of one GPU per rank (--workers-per-gpu N: 1 / N for a tp 1 worker)
    memory: tuple[tuple[str, object], ...] = ()  # the actors' MemoryBudget items (pool.GangPool.memory)
    threads: int = 1  # torch/OMP threads per rank: its share of the node's cores (threads.worker_threads)

    def bundle(self) -> dict[str, float]:
        return {"GPU": self.gpu_share} if self.device_kind == DeviceKind.GPU else {"CPU": self.cpu_per_worker}


@dataclass
class Gang:
    """Driver-side handle (mutable, never leaves the driver)."""

    spec: GangSpec
    node: int  # dispatcher node index
    node_id: str
    pg: Any
    id: int = field(default_factory=lambda: next(_ids))
    state: GangState = GangState.PLACING
    actors: list[Any] = field(default_factory=list)
    infos: list[WorkerInfo] = field(default_factory=list)
    # The groups whose sessions its workers hold, most recently used first (policy.WARM_GROUPS of
    # them, as their SessionCache keeps): the dispatcher prefers their tasks, the pool this gang
    # for them. A gang re-formed to another tp starts with none (its workers dropped theirs).
    warm: tuple[str, ...] = ()
    pg_size: int = 0  # bundles in pg (the tp it was placed for); 0: spec.tp

    def __post_init__(self) -> None:
        self.pg_size = self.pg_size or self.spec.tp

    @property
    def tp(self) -> int:
        return self.spec.tp

    def ran(self, group: str) -> None:
        """Its workers ran a case of `group`: they hold its session now, as their most recent."""
        self.warm = hold(self.warm, group)

    @property
    def label(self) -> str:
        return "+".join(i.label for i in self.infos) if self.infos else f"gang{self.id}"

    @property
    def log_paths(self) -> list[str]:
        return [i.log_path for i in self.infos]


def place(spec: GangSpec, node: int, node_id: str) -> tuple[Gang, Any]:
    """Ask for the placement group; returns the gang and the ref that resolves when it is placed."""
    from ray.util.placement_group import placement_group

    pg = placement_group([spec.bundle() for _ in range(spec.tp)], strategy="STRICT_PACK", _soft_target_node_id=node_id)
    return Gang(spec=spec, node=node, node_id=node_id, pg=pg), pg.ready()


def placement_state(pg: Any) -> str:
    """Ray's scheduling state of a placement group: NO_RESOURCES (its bundles exist but are in
    use: wait), INFEASIBLE (no node can ever hold it), FINISHED (placed), QUEUED, ... ('' if unknown)."""
    from ray.util.placement_group import placement_group_table

    try:
        return str(placement_group_table(pg).get("stats", {}).get("scheduling_state", ""))
    except Exception:  # noqa: BLE001 - the GCS is unreachable: treat as unknown (the deadline decides)
        return ""


def start_actors(gang: Gang) -> list[Any]:
    """Create one actor per bundle; returns their info() refs."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    spec = gang.spec
    gpu = spec.device_kind == DeviceKind.GPU
    resources = {"num_gpus": spec.gpu_share, "num_cpus": 0} if gpu else {"num_cpus": spec.cpu_per_worker}
    cls = ray.remote(CaseWorker)
    env = actor_env(spec.device_kind, spec.threads)  # applied by the actor itself: no runtime_env (start-up)
    for rank in range(spec.tp):
        label = f"{spec.device_kind}-g{gang.id}r{rank}"
        actor = cls.options(
            **resources,
            max_concurrency=1,
            max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=gang.pg, placement_group_bundle_index=rank
            ),
        ).remote(
            runner=spec.runner,
            device_kind=str(spec.device_kind),
            log_dir=spec.log_dir,
            label=label,
            env=env,
            memory=dict(spec.memory),
        )
        gang.actors.append(actor)
    gang.state = GangState.STARTING
    return [a.info.remote() for a in gang.actors]


def join(gang: Gang, infos: list[WorkerInfo], timeout_s: float) -> list[Any]:
    """tp > 1: every rank joins the process group; rank 0's node offered the port. [] for tp 1."""
    gang.infos = list(infos)
    if gang.tp == 1:
        gang.state = GangState.IDLE
        return []
    gang.state = GangState.JOINING
    port = infos[0].free_port
    return [a.setup_gang.remote(r, gang.tp, "127.0.0.1", port, timeout_s) for r, a in enumerate(gang.actors)]


def run_batch(gang: Gang, case_dicts: list[dict[str, Any]], needs: list[int] | None = None) -> list[Any]:
    """Submit the batch on every rank (`needs`: CaseWorker.run_batch's); one ref per rank."""
    gang.state = GangState.BUSY
    return [a.run_batch.remote(case_dicts, needs) for a in gang.actors]


def splits(gang: Gang, tp: int) -> bool:
    """Can this gang's ranks form gangs of `tp` with none left over?"""
    return gang.tp > tp and gang.tp % tp == 0 and len(gang.infos) == gang.tp


def _leaving(like: Gang, actors: list[Any], infos: list[WorkerInfo]) -> tuple[Gang, list[Any]]:
    """A gang of these ranks over `like`'s node and placement group, its tp their count, LEAVING:
    and the ranks' leave_gang() refs (they resolve to WorkerInfo with a fresh port, rank 0's for
    the rendezvous). reform and merge regroup the same live actors this way."""
    import dataclasses

    gang = Gang(
        spec=dataclasses.replace(like.spec, tp=len(actors)),
        node=like.node,
        node_id=like.node_id,
        pg=like.pg,
        pg_size=like.pg_size,
        state=GangState.LEAVING,
        actors=actors,
        infos=infos,
    )
    return gang, [a.leave_gang.remote() for a in actors]


def reform(gang: Gang, tp: int) -> tuple[list[Gang], list[list[Any]]]:
    """Split an idle gang into gang.tp // tp gangs of `tp` over the same actors and pg (the old
    gang is DEAD, without teardown); every actor leaves the old process group. Returns the new
    gangs (LEAVING) and, per new gang, its ranks' leave_gang() refs."""
    assert splits(gang, tp), (gang.tp, tp)
    parts = [_leaving(gang, gang.actors[i : i + tp], gang.infos[i : i + tp]) for i in range(0, gang.tp, tp)]
    gang.state = GangState.DEAD
    return [g for g, _ in parts], [refs for _, refs in parts]


def merge(parts: Sequence[Gang], tp: int) -> tuple[Gang, list[Any]]:
    """Join idle views of one placement group (a split's gangs) into one gang of `tp` over the
    same actors (the parts are DEAD, without teardown); every actor leaves its part's process
    group. Returns the new gang (LEAVING) and its ranks' leave_gang() refs, as reform does."""
    assert parts and sum(p.tp for p in parts) == tp and len({id(p.pg) for p in parts}) == 1, [p.tp for p in parts]
    gang, refs = _leaving(parts[0], [a for p in parts for a in p.actors], [i for p in parts for i in p.infos])
    for p in parts:
        p.state = GangState.DEAD
    return gang, refs


def teardown(gang: Gang, remove_pg: bool = True) -> None:
    """Kill the actors (a hung sync task cannot be cancelled, only killed) and free the bundles
    (remove_pg False: another live gang still has actors in this pg)."""
    import ray
    from ray.util.placement_group import remove_placement_group

    for a in gang.actors:
        try:
            ray.kill(a, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead
            pass
    if remove_pg:
        try:
            remove_placement_group(gang.pg)
        except Exception:  # noqa: BLE001 - node gone with it
            pass
    gang.state = GangState.DEAD
