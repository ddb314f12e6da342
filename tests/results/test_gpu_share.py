"""The GPUs' busy share in `orch run`'s time line and summary: from the device time the cases
measured (synthetic timings), nothing on CPU."""

from __future__ import annotations

import pytest

from backend.result import CaseResult, Status
from orchestrator.gpu_share import GpuShare, measure
from orchestrator.run_output import time_line


def _r(i: int, **timings: float) -> CaseResult:
    return CaseResult(case_id=f"c{i}", status=Status.PASS, timings={"total_s": 0.2, **timings})


MEASURES = [
    # (name, results, cases_s, gpus, expected line or None)
    (
        "one GPU, a fifth busy",
        [_r(0, device_s=10.0), _r(1, device_s=15.0)],
        125.0,
        1,
        "GPU busy 20% (device time 25.0s of 1 GPU x 125.0s)",
    ),
    (
        "two GPUs and NVML samples",
        [_r(0, device_s=30.0, gpu_util=40.0), _r(1, device_s=30.0, gpu_util=50.0)],
        60.0,
        2,
        "GPU busy 50% (device time 60.0s of 2 GPUs x 60.0s; NVML 45%)",
    ),
    ("never above all of it", [_r(0, device_s=70.0)], 60.0, 1, "GPU busy 100% (device time 70.0s of 1 GPU x 60.0s)"),
    ("CPU workers: no device time, nothing", [_r(0), _r(1)], 60.0, 0, None),
    ("no cases phase: nothing", [_r(0, device_s=1.0)], None, 1, None),
]


@pytest.mark.parametrize("name,results,cases_s,gpus,expected", MEASURES, ids=[m[0] for m in MEASURES])
def test_measure(name, results, cases_s, gpus, expected):
    share = measure(results, cases_s, gpus)
    assert (share.line() if share is not None else None) == expected


def test_time_line_says_the_share_on_gpus_only():
    phases = {"cluster": 1.04, "cases": 124.7}
    assert time_line(phases) == "time: start cluster 1.0s, first to last result 124.7s"
    share = GpuShare(device_s=62.35, cases_s=124.7, gpus=1, sampled=None)
    assert time_line(phases, share) == (
        "time: start cluster 1.0s, first to last result 124.7s; GPU busy 50% (device time 62.4s of 1 GPU x 124.7s)"
    )
