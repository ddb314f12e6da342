"""Discrete-event simulation of a dispatch policy: the same dispatcher objects the executor uses,
driven by a heap of completion events instead of Ray.

The simulated executor behaves as the real one must: whenever a node has free GPUs it asks the
dispatcher, taking tasks until told None; after any completion it asks again for the finishing
node and for every node that was told None (a decline can be lifted by a completion elsewhere).
Static dispatchers (`node_local = True`) only change their answer for a node when that node's own
tasks finish, so only that node is asked; that keeps 20k-case runs fast.
It does not credit graph reuse (same-group tasks run no faster): the comparison is about packing.
Work shared within a config (its cudagraph modes' eager steps and reference) is modelled when the
tasks carry a config and `alone` durations are given: the dispatcher's `siblings` run right after
the task they follow on the same GPUs at their `true` (cheap) duration; a config task that runs
without its config's first before it on that worker costs its `alone` duration.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.scheduling.cost import LATER_MODE_FACTOR
from orchestrator.scheduling.policy import Task, hold, make_dispatcher

# Share of cases per tp size in the synthetic matrix (most cases are tp1; gangs are the minority
# but, at tp x duration, a large share of GPU-seconds).
TP_MIX = ((1, 0.55), (2, 0.20), (4, 0.15), (8, 0.10))
MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
# Estimated seconds: lognormal (median ~2 s, sigma 1: the longest of 20k cases is ~50x the median),
# times a mild gang-startup factor.
EST_MEDIAN_S = 2.0
EST_SIGMA = 1.0


@dataclass(frozen=True)
class SimResult:
    policy: str
    makespan: float
    lower_bound: float
    ratio: float  # makespan / lower_bound, >= 1
    gpu_utilisation: float  # busy GPU-seconds / (makespan * GPUs)

    def to_dict(self) -> dict[str, float]:
        return {
            "makespan": self.makespan,
            "lower_bound": self.lower_bound,
            "ratio": self.ratio,
            "gpu_utilisation": self.gpu_utilisation,
        }


def lower_bound(tasks: Sequence[Task], nodes: Sequence[int], durations: Mapping[str, float]) -> float:
    """No schedule can beat any of:
    - total GPU-seconds / total GPUs (area);
    - the longest single task;
    - per node at most one task with tp > G/2 runs at a time (two would need > G GPUs), so the
      durations of such "wide" tasks summed over nodes that can hold them, divided by that count.
    """
    if not tasks:
        return 0.0
    area = sum(durations[t.id] * t.tp for t in tasks) / sum(nodes)
    longest = max(durations[t.id] for t in tasks)
    wide = 0.0
    for tp in sorted({t.tp for t in tasks}):
        # Nodes where a tp-task is "wide" (cannot share with another task of tp >= this one).
        holders = [g for g in nodes if tp <= g < 2 * tp]
        if holders and all(g < 2 * tp for g in nodes if g >= tp):
            total = sum(durations[t.id] for t in tasks if t.tp >= tp)
            wide = max(wide, total / len(holders))
    return max(area, longest, wide)


def simulate(
    tasks: Sequence[Task],
    nodes: Sequence[int],
    policy: str,
    true_durations: Mapping[str, float],
    alone: Mapping[str, float] | None = None,
    group: bool = True,
) -> SimResult:
    """Run `policy` over `tasks` on `nodes` (GPUs per node); tasks take `true_durations[id]`.
    `alone`: what a config's task costs when it does not follow another of its config on its
    worker (config_workload); `group` False: the config's siblings are not taken together."""
    dispatcher = make_dispatcher(policy, tasks, nodes)
    alone = alone or {}
    node_local = getattr(dispatcher, "node_local", False)
    free = list(nodes)
    warm: list[tuple[str, ...]] = [()] * len(nodes)  # a node's groups, latest first (its workers' sessions)
    events: list[tuple[float, int, int, list[Task]]] = []
    seq = 0
    waiting: set[int] = set()  # nodes with free GPUs that were last told None
    busy_gpu_s = 0.0
    now = 0.0

    def fill(node: int) -> None:
        nonlocal seq, busy_gpu_s
        while free[node] > 0:
            t = dispatcher.next_for(node, free[node], warm[node], now=now)
            if t is None:
                waiting.add(node)
                return
            if t.tp > free[node]:
                raise AssertionError(f"{policy} gave {t.id} (tp={t.tp}) to node {node} with {free[node]} free")
            free[node] -= t.tp
            warm[node] = hold(warm[node], t.group)
            job = [t, *(dispatcher.siblings(t, node, now=now) if group and t.config else ())]
            d = alone.get(t.id, true_durations[t.id]) + sum(true_durations[s.id] for s in job[1:])
            busy_gpu_s += d * t.tp
            heapq.heappush(events, (now + d, seq, node, job))
            seq += 1
        waiting.discard(node)

    for n in range(len(nodes)):
        fill(n)
    makespan = 0.0
    while events:
        now, _, node, job = heapq.heappop(events)
        makespan = now
        free[node] += job[0].tp
        for t in job:
            dispatcher.done(t, true_durations[t.id])
        fill(node)
        if not node_local and dispatcher.remaining():
            for n in sorted(waiting):
                fill(n)
    if dispatcher.remaining():
        raise AssertionError(f"{policy} left {dispatcher.remaining()} tasks undispatched with every GPU idle")
    lb = lower_bound(tasks, nodes, _best_case(tasks, true_durations, alone))
    util = busy_gpu_s / (makespan * sum(nodes)) if makespan > 0 else 0.0
    return SimResult(policy, makespan, lb, makespan / lb if lb > 0 else 1.0, util)


def synthetic_workload(
    n_cases: int, seed: int = 0, sigma: float = 0.5, max_tp: int = 8
) -> tuple[list[Task], dict[str, float]]:
    """A matrix-like workload: tp mix TP_MIX (sizes above max_tp dropped, as a matrix for smaller
    nodes would), heavy-tailed lognormal estimates, and true durations = estimate x
    lognormal(0, sigma) (sigma 0: the estimates are exact). Deterministic in seed."""
    rng = random.Random(seed)
    mix = [(tp, w) for tp, w in TP_MIX if tp <= max_tp] or [(1, 1.0)]
    tps = [tp for tp, _ in mix]
    weights = [w for _, w in mix]
    tasks: list[Task] = []
    true: dict[str, float] = {}
    mu = math.log(EST_MEDIAN_S)
    for i in range(n_cases):
        tp = rng.choices(tps, weights)[0]
        mode = rng.choice(MODES)
        kv = rng.choice(("auto", "fp8"))
        est = rng.lognormvariate(mu, EST_SIGMA) * (1.0 + 0.25 * math.log2(tp))
        t = Task(id=f"c{i:06d}-tp{tp}-{mode}-{kv}", tp=tp, est_s=est, group=f"torch-tp{tp}-{mode}-{kv}")
        tasks.append(t)
        true[t.id] = est * (rng.lognormvariate(0.0, sigma) if sigma > 0 else 1.0)
    return tasks, true


def _best_case(tasks: Sequence[Task], true: Mapping[str, float], alone: Mapping[str, float]) -> dict[str, float]:
    """Durations no schedule can beat: every config's first task alone, its others shared."""
    out = dict(true)
    firsts: dict[str, Task] = {}
    for t in tasks:
        if t.config and t.id in alone:
            best = firsts.get(t.config)
            if best is None or alone[t.id] - true[t.id] < alone[best.id] - true[best.id]:
                firsts[t.config] = t
    for t in firsts.values():
        out[t.id] = alone[t.id]
    return out


def config_workload(
    n_configs: int,
    modes: int,
    seed: int = 0,
    sigma: float = 0.5,
    max_tp: int = 8,
    later_factor: float = LATER_MODE_FACTOR,
) -> tuple[list[Task], dict[str, float], dict[str, float]]:
    """synthetic_workload's configs, each as `modes` cudagraph modes of one estimate: a mode that
    follows another of its config on the same worker takes `later_factor` of its duration (the
    memoised eager steps and reference), one that runs first or alone all of it. Returns (tasks,
    true durations when shared, durations alone); the estimates are grouped as the executor's
    (cost.grouped_estimates: the first mode full, the others `later_factor`)."""
    base, base_true = synthetic_workload(n_configs, seed, sigma, max_tp)
    tasks: list[Task] = []
    true: dict[str, float] = {}
    alone: dict[str, float] = {}
    for b in base:
        for m in range(modes):
            factor = 1.0 if m == 0 else later_factor
            t = Task(id=f"{b.id}-m{m}", tp=b.tp, est_s=b.est_s * factor, group=b.group, config=b.id)
            tasks.append(t)
            alone[t.id] = base_true[b.id]
            true[t.id] = base_true[b.id] * later_factor
    return tasks, true, alone
