"""Expected wall time of a set of cases on a number of workers: the dispatch policy the executor
uses, simulated (simulate.py) with the cost model's estimates as durations.

The sum of the estimates is what the cases cost in worker-seconds; the makespan is what a user
waits. Gang ranks wider than the ranks that run at once (a tp 8 gang on 2 cores) occupy the whole
machine, as the executor runs them alone. The cost model charges every gang case its gang's
start-up (it orders and batches by that), but a run starts a gang once and reuses it, so
`case_durations` charges it once per tp (docs/SCHEDULING.md). Not modelled: batching several
cases per call, graph reuse between cases of a group, worker start-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from backend.case import Case
from orchestrator.scheduling.cost import calibration_factor, estimate_all, gang_startup_seconds
from orchestrator.scheduling.policy import Task
from orchestrator.scheduling.simulate import simulate


def case_durations(cases: Sequence[Case], history: Mapping[str, float] | None = None) -> dict[str, float]:
    """Expected seconds of each case in a run: the cost model calibrated by `history` (what the
    executor orders by), less the gang start-up for every gang case but the first of its tp (the
    estimates charge it to each, history or not: cost.gang_startup_seconds)."""
    est = estimate_all(cases, history)
    scale = calibration_factor(cases, history)
    started: set[int] = set()
    out: dict[str, float] = {}
    for c in cases:
        d = est[c.case_id]
        if c.tp > 1:
            if c.tp in started:
                d = max(d - gang_startup_seconds(c) * scale, 0.0)
            started.add(c.tp)
        out[c.case_id] = d
    return out


def expected_wall(cases: Sequence[Case], estimates: Mapping[str, float], parallel: int, workers: int) -> float | None:
    """Makespan of `cases` with `parallel` ranks running at once out of `workers`; cases wider
    than `workers` are left out (the executor skips them). None when there is no worker."""
    if parallel < 1 or workers < 1:
        return None
    tasks = [
        Task(c.case_id, min(c.tp, parallel), estimates[c.case_id], f"{c.backend}|tp{c.tp}|{c.kv_cache_dtype}")
        for c in cases
        if c.tp <= workers
    ]
    if not tasks:
        return 0.0
    return simulate(tasks, [parallel], "ours", estimates).makespan
