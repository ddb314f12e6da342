"""Sharing one Ray cluster with other drivers: tell waiting from impossible, say so, hold nothing idle.

Ray grants a gang's placement group only whole, so drivers never hold part of a gang; what they can
do is wait on each other. A placement Ray reports as NO_RESOURCES while someone holds its bundles is
waited for (its deadline pushed back) and said so; INFEASIBLE still times out into NOT_RUN; and
while a placement of ours waits the executor gives back its idle gangs, or two drivers each keeping
a worker idle while waiting for a gang would wait on each other forever (docs/EXECUTION.md "Many
drivers, one cluster", DESIGN §12).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.executor import gangs
from orchestrator.executor.cluster import ClusterInfo, held_by_others

CHECK_EVERY_S = 2.0  # Ray state queries are GCS calls: not every loop turn


class SharedCluster:
    def __init__(self, cluster: ClusterInfo, config: Any, on_notice: Callable[[str], None], unit: str):
        self.cluster = cluster
        self.config = config  # ExecConfig: wait_notice_s, wait_repeat_s
        self.on_notice = on_notice
        self.unit = unit
        self.waiting_since: float | None = None  # since when other jobs' resources held us up
        self._said = 0.0
        self._checked = 0.0
        self._graced: set[int] = set()  # placements given one more deadline with nothing held

    def waits(self, pg: Any, ours: float) -> tuple[float, float] | None:
        """(held by other jobs, cluster total) when `pg` waits for resources in use (Ray says
        NO_RESOURCES), None when it is placed or can never be (INFEASIBLE, or unknown)."""
        if gangs.placement_state(pg) != "NO_RESOURCES":
            return None
        return held_by_others(self.cluster, ours)

    def keep_waiting(self, pg: Any, ours: float) -> bool:
        """At a placement deadline: wait on (True) or give up (NOT_RUN). Waiting is right while
        someone holds what it needs, another job or our own busy gangs; with nothing held by
        anyone it gets one more deadline (what was just freed may be granted in a moment)."""
        held = self.waits(pg, ours)
        if held is None:
            return False
        if held[0] > 0 or ours > 0:
            return True
        if id(pg) in self._graced:
            return False
        self._graced.add(id(pg))
        return True

    def tick(self, placing: Sequence[tuple[int, float, Any]], ours: Callable[[], float]) -> bool:
        """`placing`: (tp, started, pg) of our pending placements. True: a placement waits for
        resources in use, give back idle gangs (ours may be what it waits for)."""
        now = time.monotonic()
        if self.waiting_since is not None and not placing:
            # Said on the first turn with nothing left to place, not at the next state query: a
            # run whose last gang got in may end before then (2 s), and the notice was lost.
            self.on_notice(f"placement: got the {self.unit}s after waiting {now - self.waiting_since:.0f}s")
            self.waiting_since = None
            return False
        if now - self._checked < CHECK_EVERY_S:
            return False
        self._checked = now
        late = [(tp, pg) for tp, started, pg in placing if now - started >= self.config.wait_notice_s]
        waiting = [(tp, held) for tp, held in ((tp, self.waits(pg, ours())) for tp, pg in late) if held is not None]
        if not waiting:
            return False
        others = [(tp, held) for tp, held in waiting if held[0] > 0]
        if others:
            if self.waiting_since is None:
                self.waiting_since = now
            if now - self._said >= self.config.wait_repeat_s:
                self._said = now
                need, held = max(others, key=lambda x: x[0])
                self.on_notice(
                    f"waiting for {need} {self.unit}(s) on one node: {held[0]:g} of {held[1]:g} held by "
                    f"other jobs on this cluster ({now - self.waiting_since:.0f}s so far)"
                )
        return True
