"""What a result records about where it ran: the versions of the code that ran (orch, torch and
the third parties whose kernels a case may run) and the device, named as its driver names it."""

from __future__ import annotations

import functools
import importlib.metadata
import platform

import torch

import backend


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    # orch's version from the code that ran (backend/__init__.py), installed or on PYTHONPATH
    out = {"torch": torch.__version__, "python": platform.python_version(), "orch": backend.__version__}
    for label, dist in (("triton", "triton"), ("aiter", "amd-aiter"), ("ray", "ray"), ("vllm", "vllm")):
        try:
            out[label] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def default_device(rank: int = 0) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"{torch.cuda.get_device_name(index)} ({device.type}:{index})"
    return str(device)
