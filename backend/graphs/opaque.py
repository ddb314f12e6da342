"""Calls that bypass PyTorch's dispatcher under the CPU emulation.

A kernel launched by a C extension, Triton or ctypes on a tensor's raw pointer never reaches a
TorchDispatchMode, but a real graph captures it like any kernel on the capturing stream and
replays it. Such a launch first takes the pointer (`Tensor.data_ptr()`), which is Python: during a
capture the emulation watches it. A device tensor's pointer that leaves the dispatcher is an
escape. A ctypes foreign call (every `ctypes._CFuncPtr` subclass, so every CDLL function and
CFUNCTYPE) given an escaped device pointer is the CPU's kernel launch: it runs now and is recorded
with its arguments as they were (pointers and sizes frozen, as a graph's kernel node freezes
them), and replay calls it again, so its writes are fresh as on a GPU. A foreign call given only
host memory is host work: it runs once. A device pointer that escaped and no recorded call took is
one the emulation cannot follow (a C extension's own launch): the graph says so, and the case's
verdict reads `emulation: unverifiable — ...` instead of a pass or a stale replay it cannot vouch for.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from backend.graphs.host import is_host


@dataclass
class Escape:
    lo: int
    hi: int
    tensor: torch.Tensor  # keeps the memory alive for the recorded call, as a graph needs it
    where: str
    taken: bool = False


@dataclass
class OpaqueCalls:
    """Per capture: escaped device pointers and the foreign calls that took them."""

    record: Callable[[Callable[[], Any], list[torch.Tensor]], None]  # the recorder's hook
    escapes: list[Escape] = field(default_factory=list)
    _thread: int = field(default_factory=threading.get_ident)

    def escaped(self, t: torch.Tensor) -> None:
        if threading.get_ident() != self._thread or t.device.type != "cpu" or is_host(t):
            return
        storage = t.untyped_storage()
        lo = storage.data_ptr()
        if any(e.lo == lo for e in self.escapes):
            return
        frame = next((f for f in reversed(traceback.extract_stack()) if "backend/graphs/" not in f.filename), None)
        where = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}" if frame else "?"
        self.escapes.append(Escape(lo, lo + storage.nbytes(), t, where))

    def foreign_call(self, original: Callable, fn: Any, args: tuple) -> Any:
        if threading.get_ident() != self._thread:
            return original(fn, *args)
        hit = [e for e in self.escapes if any(e.lo <= p < max(e.hi, e.lo + 1) for p in _pointers(args))]
        if not hit:
            return original(fn, *args)  # host work: runs once, at capture
        for e in hit:
            e.taken = True
        self.record(lambda: original(fn, *args), [e.tensor for e in hit])
        return original(fn, *args)

    def notes(self) -> list[str]:
        places = list(dict.fromkeys(e.where for e in self.escapes if not e.taken))
        if not places:
            return []
        return [
            f"a device tensor's raw pointer left the dispatcher during capture (Tensor.data_ptr() at "
            f"{', '.join(places)}) and no ctypes call the emulation records took it: a real graph "
            "captures a kernel a C extension launches on it, the emulation cannot replay one"
        ]


def _pointers(args: tuple) -> Iterator[int]:
    for a in args:
        if isinstance(a, bool):
            continue
        if isinstance(a, int):
            yield a
        elif isinstance(a, ctypes._SimpleCData) and isinstance(a.value, int):
            yield a.value


def _func_classes() -> list[type]:
    out, todo = [], list(ctypes._CFuncPtr.__subclasses__())
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


@contextlib.contextmanager
def watching(calls: OpaqueCalls) -> Iterator[None]:
    """Tensor.data_ptr and every ctypes foreign function, watched for one capture."""
    data_ptr = torch.Tensor.__dict__.get("data_ptr")

    def watched_data_ptr(self: torch.Tensor) -> int:
        calls.escaped(self)
        return torch._C.TensorBase.data_ptr(self)

    patched: list[tuple[type, Any]] = []
    for cls in _func_classes():
        own = cls.__dict__.get("__call__")
        original = own or ctypes._CFuncPtr.__call__

        def call(fn, *args, _original=original):
            return calls.foreign_call(_original, fn, args)

        cls.__call__ = call
        patched.append((cls, own))
    torch.Tensor.data_ptr = watched_data_ptr
    try:
        yield
    finally:
        if data_ptr is None:
            del torch.Tensor.data_ptr
        else:
            torch.Tensor.data_ptr = data_ptr
        for cls, own in patched:
            if own is None:
                del cls.__call__
            else:
                cls.__call__ = own
