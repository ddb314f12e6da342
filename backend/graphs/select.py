"""Which graph runner a device gets. Its own module so that base.py (the interface) never imports
its implementations: cuda.py and emulated.py import base, this module imports them."""

from __future__ import annotations

import torch

from backend.graphs.base import GraphRunner


def make_graph_runner(device: torch.device | str) -> GraphRunner:
    """Real graphs on a CUDA/HIP device (hip when torch is a ROCm build), emulation elsewhere."""
    device = torch.device(device)
    if device.type == "cuda":
        from backend.graphs.cuda import CudaGraphRunner

        return CudaGraphRunner(device)
    from backend.graphs.emulated import EmulatedGraphRunner

    return EmulatedGraphRunner()
