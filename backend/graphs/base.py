"""The graph-runner interface shared by real CUDA/HIP graphs and the CPU emulation.

A runner captures a zero-argument callable that reads and writes static tensors (persistent
buffers) and returns its output tensor(s). Replay re-executes the captured work on the current
contents of those same tensors and refreshes the same output objects: callers copy outputs out
before the next replay. Every host value seen at capture (python ints/floats, shapes, branches
taken) is frozen. Capture sizes are the caller's business (largest first, see backend.harness.modes).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

_capture_state = threading.local()


def is_capturing() -> bool:
    """True while a runner is capturing on this thread (real or emulated). Correct code never
    needs it; it exists so that tests can build code that misbehaves only under capture, the way
    real collectives and kernels have (vLLM #29539)."""
    if getattr(_capture_state, "depth", 0) > 0:
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    _capture_state.depth = getattr(_capture_state, "depth", 0) + 1
    try:
        yield
    finally:
        _capture_state.depth -= 1


class GraphCaptureError(RuntimeError):
    """Capture failed (host sync, unsupported op, CUDA capture error); the message names the cause.
    The runner stays usable for other captures."""


class CapturedGraph:
    outputs: object  # the static output tensor(s) fn returned at capture
    # Address ranges outside its pool the graph may read (backend/graphs/allocator.py: what was
    # allocated when it was captured); None: not known (the CPU emulation tracks reads itself).
    reads: tuple[tuple[int, int], ...] | None = None

    def replay(self) -> object:
        """Re-run the captured work; returns `outputs` (the same objects, refreshed)."""
        raise NotImplementedError


class GraphRunner:
    kind: str  # "cuda" | "hip" | "emulated"

    def warmup(self, fn: Callable[[], object], iters: int = 2) -> None:
        """Eager runs before capture (lazy inits, allocator caching, autotuning)."""
        raise NotImplementedError

    def capture(self, fn: Callable[[], object]) -> CapturedGraph:
        raise NotImplementedError
