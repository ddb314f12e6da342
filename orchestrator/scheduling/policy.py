"""Which case runs next where: the dispatch policy, pure Python, shared by the Ray executor and
the simulator (so what `orch simulate` measures is the code that runs).

A task of tp t needs t GPUs of one node for its whole duration. The executor owns the truth about
GPUs: whenever a node has free GPUs it asks `next_for(node, free_gpus, warm)`; a None is not
permanent (a node may be held back for a gang), so it asks again after any `done`/`requeue`.
Policies (`make_dispatcher`): "ours" (`Dispatcher`), and the static anchors it is measured
against, "hash" (pytest-shard style) and "static-duration" (pytest-split style): docs/SCHEDULING.md.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.errors import InputError

POLICIES = ("ours", "hash", "static-duration")

# Two priorities within this fraction of each other count as a tie, and a task of a group the
# node's idle workers hold (same session: KV cache and captured graphs) wins the tie.
GROUP_TIE = 0.5
# The groups a worker holds: the sessions its SessionCache keeps (the actors build it with this
# capacity), most recently used first. Past it the oldest session is gone.
WARM_GROUPS = 8


def hold(warm: tuple[str, ...], group: str) -> tuple[str, ...]:
    """`warm` after a case of `group` ran: it first, the oldest past WARM_GROUPS gone (an LRU, as
    the SessionCache keeps them); a task of no group changes nothing."""
    return (group, *(g for g in warm if g != group))[:WARM_GROUPS] if group else warm


@dataclass(frozen=True)
class Task:
    id: str
    tp: int
    est_s: float
    group: str = ""  # cases sharing captured graphs (backend/model/mode/kv dtype/tp)
    # Dispatched only while no task of a lower tier is waiting that fits (the executor puts cases
    # whose kernels a warm-up is still compiling in tier 1); longest first within a tier.
    tier: int = 0
    # Cases that share eager steps and the reference on one worker (a config's cudagraph modes:
    # the harness memoises them per session): Dispatcher.siblings hands them out together.
    config: str = ""


def _validate(tasks: Sequence[Task], nodes: Sequence[int]) -> None:
    if not nodes or any(g <= 0 for g in nodes):
        raise InputError(f"nodes must be a non-empty list of positive GPU counts, got {list(nodes)}")
    biggest = max(nodes)
    seen: set[str] = set()
    for t in tasks:
        if t.id in seen:
            raise InputError(f"task {t.id!r} appears twice")
        seen.add(t.id)
        if t.tp <= 0:
            raise InputError(f"task {t.id!r}: tp must be >= 1, got {t.tp}")
        if t.tp > biggest:
            raise InputError(f"task {t.id!r} needs tp={t.tp} GPUs on one node; the largest node has {biggest}")
        if not t.est_s >= 0:  # also rejects NaN
            raise InputError(f"task {t.id!r}: est_s must be >= 0, got {t.est_s}")


class _Ranked:
    """Waiting tasks of one kind, longest estimate first, as a fixed sorted array with skip
    pointers: the longest alive task, or the longest with est_s <= a limit (backfill), in
    amortised near-constant time. Dead entries (dispatched) are skipped lazily via `alive`."""

    def __init__(self, tasks: Sequence[Task], alive):
        self.tasks = sorted(tasks, key=lambda t: (-t.est_s, t.id))
        self.keys = [-t.est_s for t in self.tasks]  # ascending, for bisect
        self.nxt = list(range(len(self.tasks) + 1))  # union-find "next candidate at or after i"
        self.alive = alive

    def first(self, start: int = 0) -> Task | None:
        nxt, end = self.nxt, len(self.tasks)
        i = start
        while True:
            root = i
            while nxt[root] != root:
                root = nxt[root]
            while nxt[i] != root:  # path compression
                nxt[i], i = root, nxt[i]
            if root == end:
                return None
            if self.alive(self.tasks[root]):
                return self.tasks[root]
            nxt[root] = root + 1
            i = root + 1

    def first_at_most(self, limit_s: float) -> Task | None:
        return self.first(bisect.bisect_left(self.keys, -limit_s))


class Dispatcher:
    """ "ours": longest-expected-first dynamic dispatch (list scheduling), gang-aware.

    Longest expected first, because a long case started late sets the makespan; a node gets the
    longest waiting task that fits its free GPUs, so small cases backfill what a waiting gang
    cannot use. A node that keeps being backfilled never has a gang's GPUs free at once, so an
    urgent gang that fits nowhere gets a node reserved (EASY backfilling: that node only takes
    tasks expected to end by the gang's "shadow" start, or that fit GPUs it will not need). Ties
    within GROUP_TIE go to a group the node's idle workers hold (sessions reused); tiers rank before all
    of it. Details and measurements: docs/SCHEDULING.md.

    Time: `now` defaults to time.monotonic(); the simulator passes its clock. Only differences
    between `now` values matter (start + est_s = expected end).
    """

    node_local = False
    reserve = True  # the starvation guard; off only to measure what it buys (benchmarks)
    urgency = 1.0  # reserve for a gang once est_s * urgency >= waiting GPU-seconds per GPU

    def __init__(self, tasks: Sequence[Task], nodes: Sequence[int]):
        _validate(tasks, nodes)
        self.nodes = list(nodes)
        # id -> 0 (waiting in the sorted arrays) or k > 0 (waiting, requeued with token k).
        self._live: dict[str, int] = {t.id: 0 for t in tasks}
        alive = lambda t: self._live.get(t.id) == 0
        by_kind: dict[tuple[int, int], list[Task]] = {}
        by_group: dict[tuple[int, str], list[Task]] = {}
        for t in tasks:
            by_kind.setdefault((t.tier, t.tp), []).append(t)
            if t.group:
                by_group.setdefault((t.tp, t.group), []).append(t)
        self._tps = sorted({tp for _, tp in by_kind})
        self._tiers = sorted({tier for tier, _ in by_kind}) or [0]
        self._flat = False  # lift_tiers() was called: every task ranks as tier 0
        self._ranked = {k: _Ranked(ts, alive) for k, ts in by_kind.items()}  # (tier, tp) -> waiting
        self._groups = {k: _Ranked(ts, alive) for k, ts in by_group.items()}
        self._configs: dict[str, list[Task]] = {}  # config -> its tasks, longest first
        for t in sorted(tasks, key=lambda t: (-t.est_s, t.id)):
            if t.config:
                self._configs.setdefault(t.config, []).append(t)
        # Requeued tasks (retries, and the executor giving back what did not suit a batch): a
        # max-heap per (tier, tp), entries (-est, token, task), live while _live[id] == token.
        self._requeued: dict[tuple[int, int], list[tuple[float, int, Task]]] = {}
        self._tokens = itertools.count(1)
        self._untried: set[str] = set()  # requeued by give_back: handed out but never started
        self._running: list[dict[str, tuple[float, int]]] = [{} for _ in self.nodes]  # id -> (end, tp)
        self._where: dict[str, int] = {}
        self._busy = [0] * len(self.nodes)
        self._reserved: tuple[int, Task] | None = None  # (node, gang)
        # Expected GPU-seconds still waiting, for "is this gang at risk of starting last".
        self._waiting_gpu_s = sum(t.est_s * t.tp for t in tasks)
        self._gpus = sum(self.nodes)

    # -- queue -----------------------------------------------------------------------------------
    def _requeued_best(self, tier: int, max_tp: int, limit_s: float = math.inf) -> Task | None:
        best: Task | None = None
        for (t_tier, tp), heap in self._requeued.items():
            if t_tier != tier or tp > max_tp:
                continue
            while heap and self._live.get(heap[0][2].id) != heap[0][1]:
                heapq.heappop(heap)  # stale: dispatched again, or requeued once more
            if not heap:
                continue
            t: Task | None
            if limit_s == math.inf:
                t = heap[0][2]
            else:  # EASY backfill on a reserved node only: a linear look is fine
                fits = [e[2] for e in heap if self._live.get(e[2].id) == e[1] and e[2].est_s <= limit_s]
                t = max(fits, key=lambda t: t.est_s, default=None)
            if t is not None and (best is None or t.est_s > best.est_s):
                best = t
        return best

    def _best(self, max_tp: int, limit_s: float = math.inf) -> Task | None:
        """The longest waiting task of the lowest tier that has one fitting max_tp (and limit_s)."""
        for tier in self._tiers:
            best = self._requeued_best(tier, max_tp, limit_s)
            for tp in self._tps:
                if tp > max_tp:
                    break
                r = self._ranked.get((tier, tp))
                t = None if r is None else (r.first() if limit_s == math.inf else r.first_at_most(limit_s))
                if t is not None and (best is None or t.est_s > best.est_s):
                    best = t
            if best is not None:
                return best
        return None

    def _pick(self, free: int, warm: tuple[str, ...], limit_s: float = math.inf) -> Task | None:
        """The longest waiting task, unless a group in `warm` has one within GROUP_TIE of it (of
        the same tier): then the longest of the first such group. Most recent first: a worker
        that stays on its latest group leaves the groups other workers are on to them."""
        best = self._best(free, limit_s)
        if best is None or not warm:
            return best
        floor = best.est_s * (1.0 - GROUP_TIE)
        for group in warm:
            chosen = None
            for tp in self._tps:
                if tp > free:
                    break
                r = self._groups.get((tp, group))
                g = None if r is None else (r.first() if limit_s == math.inf else r.first_at_most(limit_s))
                if g is None or self._tier(g) != self._tier(best) or g.est_s < floor:
                    continue
                if chosen is None or g.est_s > chosen.est_s:
                    chosen = g
            if chosen is not None:
                return chosen
        return best

    # -- reservation -----------------------------------------------------------------------------
    def _shadow(self, node: int, need: int, free: int, now: float) -> float:
        """Expected time `need` GPUs are free on `node` (overrunning tasks: any moment now)."""
        if free >= need:
            return now
        for end, tp in sorted(self._running[node].values()):
            free += tp
            if free >= need:
                return max(end, now)
        return math.inf  # GPUs held by work we did not dispatch: never, as far as we know

    def _urgent(self, gang: Task) -> bool:
        """Starving a gang costs nothing while there is plenty of other work: when it finally
        starts, the rest of the cluster still has work. It becomes a risk once the gang is
        longer than URGENCY x the waiting work per GPU, i.e. it would run past everything else."""
        return gang.est_s * self.urgency >= self._waiting_gpu_s / self._gpus

    def _reserve(self, head: Task, now: float) -> None:
        best, best_at = None, math.inf
        for n, g in enumerate(self.nodes):
            if g >= head.tp:
                at = self._shadow(n, head.tp, g - self._busy[n], now)
                if at < best_at:
                    best, best_at = n, at
        if best is not None:
            self._reserved = (best, head)

    # -- executor API ----------------------------------------------------------------------------
    def next_for(self, node: int, free_gpus: int, warm: tuple[str, ...] = (), now: float | None = None) -> Task | None:
        """Pick and remove a task that fits `free_gpus` on `node`, or None (ask again later).
        `warm`: the groups whose sessions the node's idle workers hold, most recent first."""
        if free_gpus <= 0:
            return None
        now = time.monotonic() if now is None else now
        head = self._best(max(self.nodes))
        if head is None:
            return None
        if self._reserved is not None and self._live.get(self._reserved[1].id) is None:
            self._reserved = None  # the gang started (here or elsewhere)
        if (
            self.reserve
            and self._reserved is None
            and head.tp > 1
            and head.tp > free_gpus
            and self._urgent(head)
            and all(g - b < head.tp for g, b in zip(self.nodes, self._busy))
        ):
            self._reserve(head, now)
        if self._reserved is not None and self._reserved[0] == node:
            gang = self._reserved[1]
            if free_gpus >= gang.tp:
                self._reserved = None
                return self._take(gang, node, now)
            shadow = self._shadow(node, gang.tp, free_gpus, now)
            spare = free_gpus + sum(tp for end, tp in self._running[node].values() if end <= shadow) - gang.tp
            # EASY: a backfill either ends by the shadow time or uses GPUs the gang will not need.
            t = self._pick(free_gpus, warm, limit_s=shadow - now)
            if t is None and spare > 0:
                t = self._pick(min(spare, free_gpus), warm)
            return self._take(t, node, now) if t is not None else None
        t = self._pick(free_gpus, warm)
        return self._take(t, node, now) if t is not None else None

    def siblings(self, task: Task, node: int, now: float | None = None) -> list[Task]:
        """Take the waiting tasks of `task`'s config that fit where it runs (same tp; not a
        requeued retry, which goes wherever it may, but a task given back untried), longest first,
        for the same worker: the first of them paid the config's eager steps and reference, the
        others reuse them (the cost model prices them so: cost.grouped_estimates). [] for a task
        of no config."""
        if not task.config:
            return []
        now = time.monotonic() if now is None else now
        out = []
        for t in self._configs.get(task.config, ()):
            if t.id == task.id or t.tp != task.tp or t.id not in self._live:
                continue
            if self._live[t.id] == 0 or t.id in self._untried:
                out.append(self._take(t, node, now))
        return out

    def _take(self, t: Task, node: int, now: float) -> Task:
        del self._live[t.id]
        self._untried.discard(t.id)
        self._waiting_gpu_s -= t.est_s * t.tp
        self._where[t.id] = node
        self._busy[node] += t.tp
        self._running[node][t.id] = (now + t.est_s, t.tp)
        return t

    def _release(self, task: Task) -> None:
        node = self._where.pop(task.id, None)
        if node is not None:
            self._busy[node] -= self._running[node].pop(task.id)[1]  # the width it was handed out with

    def requeue(self, task: Task, as_task: Task | None = None) -> None:
        """Put a dispatched task back (retry elsewhere, node lost); its GPUs count as free.
        `as_task`: the same task (same id) to wait from now on in its place, e.g. wider."""
        if task.id not in self._where:
            raise ValueError(f"requeue of {task.id!r}, which is not running")
        self._release(task)
        self._untried.discard(task.id)
        task = as_task if as_task is not None else task
        token = next(self._tokens)
        self._live[task.id] = token
        self._waiting_gpu_s += task.est_s * task.tp
        tier = self._tier(task)
        if tier not in self._tiers:
            self._tiers = sorted(self._tiers + [tier])
        heapq.heappush(self._requeued.setdefault((tier, task.tp), []), (-task.est_s, token, task))

    def give_back(self, task: Task) -> None:
        """Put back a task handed out that did not start (it did not suit the batch being filled):
        waiting as requeued, it still goes with its config (siblings). Requeued as a retry is, a
        config's mode given back from a batch's fill ran apart from its config and paid the
        config's eager steps, reference and capture again."""
        self.requeue(task)
        self._untried.add(task.id)

    def _tier(self, task: Task) -> int:
        return 0 if self._flat else task.tier

    def lift_tiers(self) -> None:
        """From now on every task ranks as tier 0 (the warm-up the tiers waited for is over):
        the waiting tasks are ranked again, longest first, as one kind per tp."""
        if self._flat:
            return
        self._flat = True
        alive = lambda t: self._live.get(t.id) == 0
        by_tp: dict[int, list[Task]] = {}
        for r in self._ranked.values():
            for t in r.tasks:
                if alive(t):
                    by_tp.setdefault(t.tp, []).append(t)
        self._ranked = {(0, tp): _Ranked(ts, alive) for tp, ts in by_tp.items()}
        requeued: dict[tuple[int, int], list[tuple[float, int, Task]]] = {}
        for (_, tp), heap in self._requeued.items():
            requeued.setdefault((0, tp), []).extend(heap)
        for heap in requeued.values():
            heapq.heapify(heap)
        self._requeued = requeued
        self._tiers = [0]

    def done(self, task: Task, duration_s: float) -> None:
        self._release(task)

    def remaining(self) -> int:
        """Tasks not yet dispatched."""
        return len(self._live)


class _StaticDispatcher:
    """Shared engine of the static anchors: each GPU runs its own list in a fixed global order.

    A gang is listed on each of its tp GPUs (aligned consecutive GPUs of one node) and starts when
    it heads all of those lists and they are idle; the global order keeps that deadlock-free. No
    rebalancing: an idle GPU with an empty list stays idle, as a finished CI shard does.
    """

    node_local = True  # an answer for node n changes only when node n's own tasks finish

    def __init__(self, tasks: Sequence[Task], nodes: Sequence[int]):
        _validate(tasks, nodes)
        self.nodes = list(nodes)
        self._queues: list[list[list[Task]]] = [[[] for _ in range(g)] for g in self.nodes]
        self._heads: list[list[int]] = [[0] * g for g in self.nodes]  # next index per GPU queue
        self._idle: list[list[bool]] = [[True] * g for g in self.nodes]
        self._where: dict[str, tuple[int, int]] = {}  # task id -> (node, first gpu)
        self._home: dict[str, tuple[int, int]] = {}
        self._retry: list[list[Task]] = [[] for _ in self.nodes]
        self._left = len(tasks)
        for t, (node, gpu) in self._assign(tasks):
            self._home[t.id] = (node, gpu)
            for g in range(gpu, gpu + t.tp):
                self._queues[node][g].append(t)

    def _assign(self, tasks: Sequence[Task]) -> list[tuple[Task, tuple[int, int]]]:
        raise NotImplementedError

    def siblings(self, task: Task, node: int, now: float | None = None) -> list[Task]:
        """The anchors decide every task's GPU up front: nothing moves with its config."""
        return []

    def _slots(self) -> list[tuple[int, int]]:
        return [(n, g) for n, count in enumerate(self.nodes) for g in range(count)]

    @staticmethod
    def _align(gpu: int, tp: int, count: int) -> int:
        start = (gpu // tp) * tp
        return min(start, count - tp)  # nodes whose GPU count is not a multiple of tp

    def next_for(self, node: int, free_gpus: int, warm: tuple[str, ...] = (), now: float | None = None) -> Task | None:
        if free_gpus <= 0:
            return None
        idle = self._idle[node]
        for i, t in enumerate(self._retry[node]):  # requeued: run again on its own GPUs first
            _, gpu = self._home[t.id]
            if t.tp <= free_gpus and all(idle[gpu : gpu + t.tp]):
                del self._retry[node][i]
                return self._start(t, node, gpu, advance=False)
        for g, q in enumerate(self._queues[node]):
            h = self._heads[node][g]
            if h >= len(q) or not idle[g]:
                continue
            t = q[h]
            _, gpu = self._home[t.id]
            if gpu != g or t.tp > free_gpus:
                continue  # a gang starts from its first GPU's list
            span = range(gpu, gpu + t.tp)
            if all(idle[x] and self._queues[node][x][self._heads[node][x]] is t for x in span):
                return self._start(t, node, gpu, advance=True)
        return None

    def _start(self, t: Task, node: int, gpu: int, advance: bool) -> Task:
        for x in range(gpu, gpu + t.tp):
            self._idle[node][x] = False
            if advance:
                self._heads[node][x] += 1
        self._where[t.id] = (node, gpu)
        self._left -= 1
        return t

    def _release(self, task: Task) -> None:
        node, gpu = self._where.pop(task.id)
        for x in range(gpu, gpu + task.tp):
            self._idle[node][x] = True

    def requeue(self, task: Task, as_task: Task | None = None) -> None:
        """Static means static: the task runs again on its own GPUs, ahead of their lists."""
        self._release(task)
        self._retry[self._home[task.id][0]].append(as_task if as_task is not None else task)
        self._left += 1

    def give_back(self, task: Task) -> None:
        self.requeue(task)  # no config moves here (siblings): back to its own GPUs as any requeue

    def done(self, task: Task, duration_s: float) -> None:
        self._release(task)

    def remaining(self) -> int:
        return self._left


def _stable_hash(s: str) -> int:
    # Python's hash() is salted per process; CI shards must agree across machines.
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")


class HashDispatcher(_StaticDispatcher):
    """vLLM-CI/pytest-shard style: slot = hash(id) mod number of GPU slots; order = input order."""

    def _assign(self, tasks):
        # Per tp, the slots of nodes big enough for it (mixed clusters: a tp8 never hashes onto
        # a 4-GPU node).
        slots = {tp: [s for s in self._slots() if self.nodes[s[0]] >= tp] for tp in {t.tp for t in tasks}}
        out = []
        for t in tasks:
            node, gpu = slots[t.tp][_stable_hash(t.id) % len(slots[t.tp])]
            out.append((t, (node, self._align(gpu, t.tp, self.nodes[node]))))
        return out


class StaticDurationDispatcher(_StaticDispatcher):
    """pytest-split style: longest estimate first, each to the least-loaded bin (for a gang: the
    aligned GPU span whose most-loaded GPU is least loaded); each bin then runs in that order."""

    def _assign(self, tasks):
        load = [[0.0] * g for g in self.nodes]
        # Per tp, a heap of (span load, node, first gpu); stale entries are skipped on pop.
        spans: dict[int, list[tuple[float, int, int]]] = {}
        for tp in sorted({t.tp for t in tasks}):
            spans[tp] = [(0.0, n, s) for n, g in enumerate(self.nodes) for s in range(0, g - tp + 1, tp)]
            heapq.heapify(spans[tp])
        out = []
        for t in sorted(tasks, key=lambda t: (-t.est_s, t.id)):
            heap = spans[t.tp]
            while True:
                start_load, n, s = heapq.heappop(heap)
                current = max(load[n][s : s + t.tp])
                if current == start_load:
                    break
                heapq.heappush(heap, (current, n, s))  # stale key: another tp size loaded it
            for x in range(s, s + t.tp):
                load[n][x] = current + t.est_s
            heapq.heappush(heap, (current + t.est_s, n, s))
            out.append((t, (n, s)))
        return out


def make_dispatcher(policy: str, tasks: Sequence[Task], nodes: Sequence[int]):
    """The dispatcher for a policy name in POLICIES."""
    if policy == "ours":
        return Dispatcher(tasks, nodes)
    if policy == "hash":
        return HashDispatcher(tasks, nodes)
    if policy == "static-duration":
        return StaticDurationDispatcher(tasks, nodes)
    raise InputError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
