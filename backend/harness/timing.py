"""Where a case's time goes: marks between its phases and the spans between them
(CaseResult.timings). On a GPU a mark is a CUDA event, never a host sync."""

from __future__ import annotations

import time

import torch

# Where a case's time goes besides capture_s (CaseResult.timings, seconds): capture_s + these +
# other_s = total_s. plan_s: what the checker decides before the session (backend, layout, plan);
# memory_s: the case's memory accounting (peak reset, figures); prepare_s: the session's scales
# and the checks' set-up around the captures; churn_s: the GPU's dummy step before a replay
# (churn.py; 0 on the CPU and for NONE); replay_s: the graph side's step (a graph replay, or eager
# for NONE); result_s: the verdict and the result built from the checks.
PHASES = (
    "plan_s",
    "memory_s",
    "session_s",
    "prepare_s",
    "churn_s",
    "inputs_s",
    "snapshot_s",
    "eager_s",
    "reference_s",
    "replay_s",
    "checks_s",
    "result_s",
)
NAMED = ("capture_s", *PHASES)  # what other_s is the rest of
# The phases a GPU times with its own events (Clock): their sum, with capture_s, is the case's
# device_s, what `orch run` reports the GPUs' busy share from (orchestrator/gpu_share.py). An
# upper bound on the device's busy time: a span between two events also holds what the device
# waited for the host.
DEVICE_PHASES = ("prepare_s", "churn_s", "inputs_s", "snapshot_s", "eager_s", "reference_s", "replay_s", "checks_s")


class Clock:
    """Marks between a case's phases (CaseResult.timings). On a GPU a mark is a CUDA event recorded
    on the current stream, never a host sync, so the host queues a step's next work while the
    device still runs the last (these marks were 6,564 synchronize calls, 9 s of the 290-case
    tp 1 slice on the H200); a span between two marks is then the device's time between them,
    read when the case's timings are (its checks have synced by then). On the CPU a mark is
    perf_counter and a span its difference."""

    def __init__(self, device: torch.device):
        self.events = device.type == "cuda"

    def now(self) -> float | torch.cuda.Event:
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()


class Span:
    """The time between two marks of a Clock; float() resolves it (waiting for a GPU event's
    completion once) and keeps the seconds."""

    __slots__ = ("_end", "_seconds", "_start")

    def __init__(self, start, end):
        self._start, self._end, self._seconds = start, end, None

    def __float__(self) -> float:
        if self._seconds is None:
            if isinstance(self._start, float):
                self._seconds = self._end - self._start
            else:
                self._end.synchronize()
                self._seconds = self._start.elapsed_time(self._end) / 1e3
            self._start = self._end = None
        return self._seconds


def seconds(spans) -> float:
    return sum(float(s) for s in spans)


def finish_timings(timings: dict[str, float], total_s: float) -> dict[str, float]:
    """`timings` with total_s and other_s: what no named phase (NAMED) covers, the harness's own
    bookkeeping between marks. Never negative: on a GPU the phases are device time between marks
    and can exceed the host's total by a little where the device ran behind it."""
    named = sum(float(timings.get(k, 0.0)) for k in NAMED)
    return {**timings, "total_s": total_s, "other_s": max(0.0, total_s - named)}
