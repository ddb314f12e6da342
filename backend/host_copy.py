"""Host -> device copies that do not stop the host.

A plain `tensor.to("cuda")` or `cuda_buffer.copy_(cpu_tensor)` from pageable memory synchronises
the stream: the host waits for every kernel queued before it. The checker issues a few of these per
step (metadata, inputs, scales), and each one drained the GPU before the host could queue the
next work. Through pinned memory with non_blocking the copy is queued in stream order like a
kernel; torch's pinned allocator keeps the staging block until the copy has run, so the source
may be dropped at once. On the CPU these are the plain operations.
"""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` (any device) on `device`; a host tensor goes to a GPU without a host sync."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """dst.copy_(src); a host `src` into a GPU `dst` without a host sync."""
    if dst.device.type == "cuda" and src.device.type == "cpu":
        return dst.copy_(src.pin_memory(), non_blocking=True)
    return dst.copy_(src)
