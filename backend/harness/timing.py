"""Where a case's time goes: marks between its phases and the spans between them
(CaseResult.timings). On a GPU a mark is a CUDA event, never a host sync."""

from __future__ import annotations

import time

import torch

# Where a case's time goes, beyond capture and the timed steps (CaseResult.timings, seconds).
PHASES = ("session_s", "inputs_s", "snapshot_s", "eager_s", "reference_s", "checks_s")


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
