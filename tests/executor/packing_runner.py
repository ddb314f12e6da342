"""A runner for the packing test: no checker, no torch. It records which GPU Ray gave the worker,
the worker's process and when it ran, then passes (tests/executor/test_memory_packing.py)."""

from __future__ import annotations

import json
import os
import time

from backend.result import CaseResult, Status

HOLD_S = 0.4  # long enough that the workers' cases overlap


def run(case, *, rank: int = 0, world_size: int = 1, device=None, **_):
    import ray

    start = time.time()
    time.sleep(HOLD_S)
    gpus = [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", ())]
    line = {"case": case.case_id, "tp": case.tp, "rank": rank, "pid": os.getpid(), "gpus": gpus,
            "start": start, "end": time.time()}
    with open(os.environ["ORCH_PACKING_LOG"], "a") as f:
        f.write(json.dumps(line) + "\n")
    return CaseResult(case_id=case.case_id, status=Status.PASS, requested_mode=case.mode, axes=case.axes)
