"""The runner of the shared-cluster tests (ORCH_RUNNER): GPU-less, deterministic, slow enough that
drivers overlap on the cluster's (fake) GPUs.

Every case holds its worker for HOLD_S, then passes, except FULL cases with an fp8 KV cache,
which fail with a replay-check message: a matrix's gate is known in advance from its filter.
"""

from __future__ import annotations

import os
import time

from backend.case import Case
from backend.result import CaseResult, CheckOutcome, Status

HOLD_S = float(os.environ.get("ORCH_TEST_HOLD_S", "0.3"))


def fails(case: Case) -> bool:
    return case.mode == "FULL" and case.kv_cache_dtype == "fp8"


def _device(device) -> str:
    """What the checker would record: "cpu", or a model name for the cluster's fake GPUs."""
    return "cpu" if device is None or str(device) == "cpu" else f"Fake GPU 80GB ({device})"


def shared_runner(case: Case, *, rank: int = 0, world_size: int = 1, device=None, sessions=None) -> CaseResult:
    time.sleep(HOLD_S)
    bad = fails(case)
    check = CheckOutcome("replay", not bad, step=1, max_abs_err=0.5 if bad else 0.0)
    return CaseResult(
        case.case_id,
        Status.FAIL if bad else Status.PASS,
        reason="replay: graph replay differs from eager at step 1" if bad else "",
        checks=(check,),
        requested_mode=case.mode,
        resolved_mode=case.mode,
        axes=case.axes,
        device=_device(device),
        timings={"total_s": HOLD_S},
        repro=case.repro_command(),
    )
