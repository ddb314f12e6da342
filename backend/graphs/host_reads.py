"""Host reads the dispatcher does not see, refused during a capture as a GPU refuses them (DESIGN.md
§4): `tolist()`/`numpy()` read memory directly, below the dispatcher, and `cpu()`/`to("cpu")` of a
CPU tensor return it without dispatching, so the recorder cannot see a device->host copy. While a
capture runs these Tensor methods are wrapped; host memory (backend/graphs/host.py) passes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from backend.graphs.base import GraphCaptureError
from backend.graphs.host import is_host


def _refuse_host_read(what: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def refuse(self: torch.Tensor, *a: Any, **k: Any) -> Any:
        if is_host(self):
            return original(self, *a, **k)
        if what == "cpu":
            raise GraphCaptureError("host sync during graph capture: Tensor.cpu() copies device->host")
        raise GraphCaptureError(f"host sync during graph capture: `.{what}()`: a host read of a device tensor")

    return refuse


def _to_host_target(a: tuple, k: dict) -> str | None:
    """What a Tensor.to(...) call names as host memory: "cpu" (a cpu device given as a string,
    a torch.device or device=), "a host tensor" (to(other) with other host memory), else None."""
    other = a[0] if a and isinstance(a[0], torch.Tensor) else k.get("other")
    if isinstance(other, torch.Tensor):
        return "a host tensor" if is_host(other) else None
    # torch's own parser of to()'s overloads (Module.to uses it); it takes no `copy`, which does
    # not change the target: drop it (a kwarg, or the bool after non_blocking).
    k = {n: v for n, v in k.items() if n != "copy"}
    if len(a) >= 2 and isinstance(a[-1], bool) and isinstance(a[-2], bool):
        a = a[:-1]
    device = torch._C._nn._parse_to(*a, **k)[0]
    return "cpu" if device is not None and device.type == "cpu" else None


def _refuse_to_host(original: Callable[..., Any]) -> Callable[..., Any]:
    # On a GPU, x.to("cpu") of a device tensor is a device->host copy (a capture error); on CPU it
    # returns x without dispatching. Under the emulation a same-device x.to(x.device) names the cpu
    # device as well and cannot be told apart: it is refused too (conservative, never a silent pass).
    def to(self: torch.Tensor, *a: Any, **k: Any) -> Any:
        target = None if is_host(self) else _to_host_target(a, k)
        if target == "cpu":
            raise GraphCaptureError(
                "host sync during graph capture: Tensor.to(cpu) copies device->host (under the emulation "
                "a same-device .to(x.device) names cpu too and is refused with it; drop it, on a GPU it "
                "is a no-op)"
            )
        if target is not None:
            raise GraphCaptureError(f"host sync during graph capture: Tensor.to({target}) copies device->host")
        return original(self, *a, **k)

    return to


@contextlib.contextmanager
def no_host_reads() -> Iterator[None]:
    patched = {name: torch.Tensor.__dict__.get(name) for name in ("tolist", "numpy", "cpu", "to")}
    for name, original in patched.items():
        original = original or getattr(torch.Tensor, name)
        wrapper = _refuse_to_host(original) if name == "to" else _refuse_host_read(name, original)
        setattr(torch.Tensor, name, wrapper)
    try:
        yield
    finally:
        for name, original in patched.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)
