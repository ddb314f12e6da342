"""Scheduling: the cost model, the Ray-free dispatch policy and its discrete-event simulator.

Nothing in this package imports Ray, so the exact policy the executor uses can be simulated at
512+ GPUs on a laptop (`orch simulate`). See docs/SCHEDULING.md.
"""

from orchestrator.scheduling.cost import estimate_all, estimate_seconds
from orchestrator.scheduling.policy import POLICIES, Dispatcher, Task, make_dispatcher

__all__ = ["POLICIES", "Dispatcher", "Task", "estimate_all", "estimate_seconds", "make_dispatcher"]
