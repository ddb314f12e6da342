"""A capture that fails (a host sync in a provider's wrapper: aiter-triton-pa's `.item()`) leaves
nothing behind in the process (backend/graphs/cuda.py `_undo_failed_capture`): its graph memory
pool is given back when the session goes, and the default CUDA generator leaves capture mode. On
an H100 each such failure kept 2-4 GiB reserved for good (38 GiB after nine, 1.7 GiB allocated)
and the next random op of the worker failed. Real CUDA graphs only: the CPU emulation
has no allocator pools."""

from __future__ import annotations

import gc

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/HIP device")

MB = 1 << 20


def test_a_failed_capture_gives_its_pool_and_the_generator_back():
    from backend.graphs.base import GraphCaptureError
    from backend.graphs.cuda import CudaGraphRunner

    dev = torch.device("cuda", torch.cuda.current_device())
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved(dev)
    runner = CudaGraphRunner(dev)
    graph = runner.capture(lambda: torch.ones(64 * MB, device=dev))  # 256 MiB in the runner's pool

    def host_sync():
        torch.ones(64 * MB, device=dev)
        return torch.zeros(1, device=dev).item()  # not permitted while the stream captures

    for _ in range(3):
        with pytest.raises(GraphCaptureError):
            runner.capture(host_sync)
    torch.randn(8, device=dev)  # the default generator is out of capture mode
    assert runner.capture(lambda: torch.ones(MB, device=dev)).replay().shape == (MB,)  # the runner captures again
    del graph, runner
    gc.collect()
    torch.cuda.empty_cache()
    left = torch.cuda.memory_reserved(dev) - base
    assert left < 64 * MB, f"{left / MB:.0f} MiB still reserved after the runner and its graphs are gone"
