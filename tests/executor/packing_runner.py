"""A runner for the packing test: no checker, no torch. It records which GPU Ray gave the worker,
its share of it, the worker's process and when it ran, then passes; a case named in
ORCH_PACKING_OOM runs out of memory (as the checker reports it: ERROR kind `oom`) on any worker
of less than a whole GPU; one named in ORCH_PACKING_KEPT runs out of memory on the first worker
it meets, which could not give its memory back (the checker's `unreleased`), and passes on the next
(tests/executor/test_memory_packing.py)."""

from __future__ import annotations

import json
import os
import sys
import time

from backend.result import CaseResult, Status

HOLD_S = 0.4  # long enough that the workers' cases overlap


def run(case, *, rank: int = 0, world_size: int = 1, device=None, **_):
    import ray

    start = time.time()
    time.sleep(HOLD_S)
    ctx = ray.get_runtime_context()
    gpus = [str(g) for g in ctx.get_accelerator_ids().get("GPU", ())]
    share = ctx.get_assigned_resources().get("GPU", 0.0)
    torch = sys.modules.get("torch")  # preloaded by Ray's workers in the threads test only
    line = {
        "case": case.case_id,
        "tp": case.tp,
        "rank": rank,
        "pid": os.getpid(),
        "gpus": gpus,
        "share": share,
        "start": start,
        "end": time.time(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
    }
    with open(os.environ["ORCH_PACKING_LOG"], "a") as f:
        f.write(json.dumps(line) + "\n")
    if case.case_id in os.environ.get("ORCH_PACKING_KEPT", "").split(","):
        with open(os.environ["ORCH_PACKING_LOG"]) as f:
            if sum(json.loads(line)["case"] == case.case_id for line in f) == 1:  # its first worker
                reason = "OutOfMemoryError: CUDA out of memory; the worker could not give back 6.00 GiB: recycled"
                return _oom(case, reason, memory={"unreleased": 6 << 30})
    if case.case_id in os.environ.get("ORCH_PACKING_OOM", "").split(",") and share < 1.0:
        return _oom(case, f"out of memory when alone: needs at least 30.00 GiB of a {share:g} GPU")
    return CaseResult(case_id=case.case_id, status=Status.PASS, requested_mode=case.mode, axes=case.axes)


def _oom(case, reason: str, memory: dict | None = None) -> CaseResult:
    """The checker's out-of-memory verdict (ERROR kind `oom`)."""
    return CaseResult(
        case_id=case.case_id,
        status=Status.ERROR,
        requested_mode=case.mode,
        axes=case.axes,
        error_kind="oom",
        reason=reason,
        memory=memory or {},
    )
