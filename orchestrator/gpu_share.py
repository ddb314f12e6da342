"""How busy a run kept its GPUs: the device time its cases measured (CaseResult.timings
`device_s`, the spans a GPU times with its own events: backend/harness/timing.py) over the cases
phase x the GPUs, and the mean of NVML's utilisation as the workers sampled it after each case
(`gpu_util`, where torch.cuda.utilization works). Pure: `orch run`'s `time:` line and summary.md
print it; a CPU run has no device time and prints nothing."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from backend.result import CaseResult


@dataclass(frozen=True)
class GpuShare:
    device_s: float  # summed over cases (a gang's ranks each count)
    cases_s: float  # the run's cases phase (first to last result)
    gpus: int
    sampled: float | None = None  # mean NVML utilisation, percent; None: not sampled

    @property
    def busy(self) -> float:
        """device_s / (cases_s x gpus), at most 1 (the spans can overlap a little: see timing.py)."""
        return min(1.0, self.device_s / (self.cases_s * self.gpus))

    def line(self) -> str:
        """'GPU busy 43% (device time 53.1s of 1 GPU x 124.7s; NVML 38%)'."""
        nvml = f"; NVML {self.sampled:.0f}%" if self.sampled is not None else ""
        return (
            f"GPU busy {self.busy:.0%} (device time {self.device_s:.1f}s of {self.gpus} GPU"
            f"{'s' if self.gpus != 1 else ''} x {self.cases_s:.1f}s{nvml})"
        )


def measure(results: Iterable[CaseResult], cases_s: float | None, gpus: int) -> GpuShare | None:
    """The share, or None where there is nothing to say: no GPU case, no GPUs, no cases phase."""
    device, util = 0.0, []
    seen = False
    for r in results:
        t = r.timings
        if "device_s" in t:
            seen = True
            device += float(t["device_s"])
        if "gpu_util" in t:
            util.append(float(t["gpu_util"]))
    if not seen or gpus <= 0 or not cases_s or cases_s <= 0:
        return None
    return GpuShare(device, cases_s, gpus, statistics.fmean(util) if util else None)
