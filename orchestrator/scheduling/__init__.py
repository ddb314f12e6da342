"""Scheduling: the cost model, the Ray-free dispatch policy and its discrete-event simulator.

Nothing in this package imports Ray, so the exact policy the executor uses can be simulated at
512+ GPUs on a laptop (`orch simulate`).
"""
