"""Real CUDA/HIP graphs through torch.cuda.CUDAGraph, captured the way vLLM captures them.

- Warm-up runs eagerly on the runner's side stream, the same stream later used for capture.
- Every capture of one runner allocates from one shared memory pool (graph_pool_handle()); the
  caller captures largest-first so smaller graphs reuse what the largest one grew.
- Replay launches on the current stream and returns the same output objects every time.
- On ROCm builds torch.cuda.CUDAGraph is backed by hipGraph (same API, HIP stream capture):
  the runner is the same and reports kind "hip" (graph_kind).
- A failed capture (`.item()` in a wrapper: cudaErrorStreamCaptureInvalidated / "operation not
  permitted when stream is capturing") becomes GraphCaptureError. We drive capture_begin/
  capture_end ourselves instead of `torch.cuda.graph(...)`: when capture_end raises inside that
  context manager's __exit__, the stream context is never exited and the capture stream stays
  current. Here the capture is always ended, the current stream restored, and the graph dropped,
  so the runner stays usable.
- The kernels of a graph hold raw addresses. A tensor made outside the capture and read by it
  (the capture batch's metadata) must outlive the graph: freed, its block goes to the next tensor
  of that size, often the step's own fresh copy, and the replay reads the step's values by luck.
  The caller keeps such tensors (Session._capture_full keeps the capture metadata with the graph),
  not the runner: holding the captured callable would tie the graph to its session in a cycle,
  and a session's device memory is freed by reference counting when it is evicted.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from backend.graphs.allocator import live_ranges
from backend.graphs.base import CapturedGraph, GraphCaptureError, GraphRunner, capturing


def graph_kind(hip_version: str | None, gpu_available: bool) -> str:
    """The graph kind a run gets: "hip" on a ROCm build of torch (torch.version.hip set), "cuda"
    on a CUDA build, "emulated" (the CPU graph emulation) without a GPU."""
    if not gpu_available:
        return "emulated"
    return "hip" if hip_version else "cuda"


class CudaCapturedGraph(CapturedGraph):
    def __init__(self, graph: torch.cuda.CUDAGraph, outputs: object, reads: tuple[tuple[int, int], ...] | None = None):
        self._graph = graph
        self.outputs = outputs
        self.reads = reads

    def replay(self) -> object:
        self._graph.replay()
        return self.outputs


class CudaGraphRunner(GraphRunner):
    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.kind = graph_kind(torch.version.hip, True)
        with torch.cuda.device(self.device):
            self.pool = torch.cuda.graph_pool_handle()
            self.stream = torch.cuda.Stream(self.device)
        self.pools = [self.pool]  # every pool this runner captured into: a session's graph bytes
        # Every graph captured into self.pool, failed ones included, stays referenced for the
        # runner's lifetime: when the last graph of a pool is freed the caching allocator releases
        # the pool, and the next capture_begin on the same handle trips an internal assert
        # ("use_count > 0", seen on torch 2.11 / H200). vLLM likewise keeps its graphs alive.
        self._graphs: list[torch.cuda.CUDAGraph] = []

    def warmup(self, fn: Callable[[], object], iters: int = 2) -> None:
        with torch.cuda.device(self.device):
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                for _ in range(iters):
                    fn()
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            torch.cuda.synchronize(self.device)

    def capture(self, fn: Callable[[], object]) -> CudaCapturedGraph:
        with torch.cuda.device(self.device):
            torch.cuda.synchronize(self.device)
            reads = live_ranges(self.device)  # after the warm-up: what it cached is read by the graph
            graph = torch.cuda.CUDAGraph()
            self._graphs.append(graph)
            error: BaseException | None = None
            outputs: object = None
            with torch.cuda.stream(self.stream):
                graph.capture_begin(self.pool, capture_error_mode="global")
                try:
                    with capturing():
                        outputs = fn()
                except Exception as e:  # noqa: BLE001 - the capture is invalid now; end it below
                    error = e
                try:
                    graph.capture_end()
                except Exception as e:  # noqa: BLE001 - the first error is the one reported
                    error = error or e
            if error is not None:
                # After a failed capture the allocator can still consider the pool "being recorded
                # to" (torch 2.11: the next capture_begin raises "beginAllocateToPool: already
                # recording to mempool_id"): later captures get a fresh pool and stream.
                _undo_failed_capture(graph, self.pool, self.device)
                self.pool = torch.cuda.graph_pool_handle()
                self.pools.append(self.pool)
                self._abandon_stream()
                self._clear_error_state()
                raise GraphCaptureError(_describe(error)) from error
            torch.cuda.synchronize(self.device)
        return CudaCapturedGraph(graph, outputs, reads)

    def _abandon_stream(self) -> None:
        # The stream may still be in capture mode (end failed): never use it again.
        self.stream = torch.cuda.Stream(self.device)

    def _clear_error_state(self) -> None:
        # Capture errors are not sticky; read them off so the next CUDA call does not report them.
        try:
            torch.cuda.synchronize(self.device)
        except RuntimeError:
            pass


def _undo_failed_capture(graph: torch.cuda.CUDAGraph, pool, device: torch.device) -> None:
    """What torch leaves behind when capture_end fails (cudaStreamEndCapture raised before the
    allocator heard the capture was over), undone:

    - the pool: capture_begin counted the graph as a user of it and routed the capture's
      allocations to it; a graph whose capture never ended never gives that count back (its
      reset() releases only an ended capture), so the pool, and every segment of every graph
      captured into it, outlives the session. On an H100 each aiter-triton-pa capture error kept
      2-4 GiB reserved for good: 38 GiB after 9 of them, with 1.7 GiB allocated.
    - the default CUDA generator: capture_begin put its state in capture mode and only
      capture_end takes it out; the next random op of the process then fails with "Offset
      increment outside graph capture encountered unexpectedly" (two FLAKY cases on the H100).
    Nothing is done where the capture did end (graph.pool() answers): its graph releases the pool."""
    try:
        graph.pool()
        return  # the capture ended: the graph's own reset() gives the pool back
    except RuntimeError:
        pass
    index = device.index if device.index is not None else torch.cuda.current_device()
    for undo in ("_cuda_endAllocateToPool", "_cuda_releasePool"):
        fn = getattr(torch._C, undo, None)
        if fn is None:
            continue
        try:
            fn(index, pool)
        except RuntimeError:  # already undone by torch (a failure after the allocator was told)
            pass
    gen = torch.cuda.default_generators[index]
    try:
        gen.graphsafe_set_state(gen.clone_state())  # a fresh state: same seed and offset, not capturing
    except (AttributeError, RuntimeError):  # a torch without graph-safe generator states
        pass


def _describe(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()[0]
    lower = str(error).lower()
    if "capture" in lower and ("not permitted" in lower or "invalidated" in lower or "unsupported" in lower):
        return f"CUDA graph capture failed (a host sync or unsupported call during capture): {text}"
    return f"CUDA graph capture failed: {text}"
