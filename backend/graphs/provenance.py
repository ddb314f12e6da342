"""Host memory found by how a tensor was made, not by marks (DESIGN.md §4).

Under the CPU emulation the emulated device and the host are one device, and the product's
providers, builders and the vLLM adapter mark none of their host tensors (backend/graphs/host.py).
But code written for a GPU says where it puts memory, and says it the same way here: a tensor made
without a device (`torch.tensor(lens)`, `torch.zeros(n, dtype=...)`, numpy data), one that names
the CPU as a string (`device="cpu"`, `.to("cpu")`, vLLM's CpuGpuBuffer), a pinned one
(`pin_memory=True`, `.pin_memory()`), a `.cpu()` copy, numpy's memory (`torch.from_numpy`,
`torch.frombuffer`: below the dispatcher, wrapped to mark while a scope is on), and whatever host ops
make from host tensors are host memory on a GPU. A tensor made with a `torch.device` object, the session's device, is
device memory. `HostProvenance` is a TorchFunctionMode that marks such tensors as they are made,
so the emulation freezes host work at capture, copies host->device where a GPU would, and refuses
what a GPU refuses, without a mark in any provider.

Where it is active (host_scope): the runner's warm-up and capture, the session's construction of
the builder and Impl and its capture metadata (build_for_capture), every call of the backend's
attention (TPModel.attention: eager steps and the eager attention between piecewise graphs too,
so host memory an Impl makes lazily on an eager call is host memory at a later capture of the
same session), and the probe harness's set-up. Tensors made elsewhere (at import, in an eager
step's build()) are not classified and count as device memory. A `torch.device("cpu")` object always names the emulated device: code that means
the host with it is taken for device code (use the string).

Emulated where the CPU build of torch cannot: `pin_memory=True` and `.pin_memory()` give a pinned
host tensor (marked pinned; CPU torch has no pinned allocator), `.is_pinned()` answers from the
mark; `host.to(device)` is a copy into new device memory (on CPU it would return the host tensor
itself), `device_tensor.cpu()` / `.to("cpu")` a copy into new host memory.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._library.custom_ops import _maybe_get_opdef
from torch.overrides import TorchFunctionMode

from backend.graphs.base import GraphCaptureError, is_capturing
from backend.graphs.host import is_host, mark_host
from backend.graphs.leaves import leaves

_state = threading.local()


def making_host() -> bool:
    """True while a host factory runs on this thread: the capture recorder then runs the op as
    host work (once, not part of the graph) instead of recording it."""
    return getattr(_state, "host", 0) > 0


@contextlib.contextmanager
def _host_allocation() -> Iterator[None]:
    _state.host = getattr(_state, "host", 0) + 1
    try:
        yield
    finally:
        _state.host -= 1


def _names_host(device: Any) -> bool | None:
    """True: `device` names the host (absent, or the CPU as a string); False: the emulated device
    (a torch.device object, an index); None: a device that is not the CPU at all."""
    if device is None:
        return True
    if isinstance(device, str):
        return True if torch.device(device).type == "cpu" else None
    if isinstance(device, torch.device):
        return False if device.type == "cpu" else None
    return False  # an int: a GPU index, device memory


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in leaves(tree) if isinstance(x, torch.Tensor)]


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _mark_new(out: Any, inputs: list[torch.Tensor], pinned: bool = False) -> None:
    """Mark the result tensors that are new memory (not a view of an input) as host memory."""
    shared = {_storage(t) for t in inputs} - {0}
    for t in _tensors(out):
        if t.device.type == "cpu" and (_storage(t) not in shared or pinned):
            mark_host(t, pinned)


def _factory(func: Callable, args: tuple, kwargs: dict) -> Any:
    """torch.zeros/empty/full/arange/tensor/...: host when no device is named or the CPU is named
    as a string; pin_memory=True is emulated (CPU torch has no pinned allocator)."""
    host = _names_host(kwargs.get("device"))
    data = args[0] if args else kwargs.get("data")
    if func in _FROM_DATA and isinstance(data, torch.Tensor):
        return None  # torch.as_tensor(t): t itself or a conversion of it; placement follows t
    pinned = bool(kwargs.get("pin_memory", False))
    if pinned:
        kwargs = {k: v for k, v in kwargs.items() if k != "pin_memory"}
    if host is False and func in _FROM_DATA and is_capturing():
        # torch.tensor(data, device=cuda): the data is put in host memory, then copied with a
        # blocking copy, which a capturing stream refuses.
        raise GraphCaptureError(
            f"host sync during graph capture: {func.__name__}(python data, device=...) "
            "copies host->device with a blocking copy"
        )
    if not host:
        return func(*args, **kwargs) if pinned else None
    with _host_allocation():
        out = func(*args, **kwargs)
    _mark_new(out, [], pinned)
    return out


def _like(func: Callable, args: tuple, kwargs: dict) -> Any:
    """zeros_like(t) / t.new_zeros(...): placement follows t unless a device is named."""
    if "device" not in kwargs and not kwargs.get("pin_memory", False):
        src = args[0] if args else None
        if isinstance(src, torch.Tensor) and is_host(src):
            with _host_allocation():
                out = func(*args, **kwargs)
            _mark_new(out, [])
            return out
        return None
    return _factory(func, args, kwargs)


def _to(func: Callable, args: tuple, kwargs: dict) -> Any:
    self = args[0]
    rest = args[1:]
    other = rest[0] if rest and isinstance(rest[0], torch.Tensor) else kwargs.get("other")
    if isinstance(other, torch.Tensor):
        target_host: bool | None = is_host(other)
        dtype, non_blocking = other.dtype, bool(rest[1] if len(rest) > 1 else kwargs.get("non_blocking", False))
    else:
        k = {n: v for n, v in kwargs.items() if n != "copy"}
        a = rest[:-1] if len(rest) >= 2 and isinstance(rest[-1], bool) and isinstance(rest[-2], bool) else rest
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*a, **k)
        if device is None:
            return None  # a dtype change: derived like any op
        spelled = next((x for x in (*a, kwargs.get("device")) if isinstance(x, (str, torch.device))), None)
        target_host = _names_host(spelled) if spelled is not None else False
        dtype = dtype or self.dtype
    if target_host is None or self.device.type != "cpu":
        return None
    if is_host(self) and target_host is False:
        # host -> device: new device memory (the recorder sees the copy, a GPU's H2D copy)
        out = torch.empty_strided(self.size(), _dense_strides(self), dtype=dtype, device=self.device)
        return out.copy_(self, non_blocking=non_blocking)
    if not is_host(self) and target_host:
        out = func(*args, **kwargs)  # device -> host: a copy into new host memory
        if _storage(out) == _storage(self):
            out = out.clone()
        mark_host(out)
        return out
    return None


def _dense_strides(t: torch.Tensor) -> tuple[int, ...]:
    return t.stride() if t.is_contiguous() else torch.empty(t.shape).stride()


def _cpu(func: Callable, args: tuple, kwargs: dict) -> Any:
    self = args[0]
    if self.device.type != "cpu" or is_host(self):
        return None
    return mark_host(self.clone())  # device -> host: new host memory


def _pin_memory(func: Callable, args: tuple, kwargs: dict) -> Any:
    self = args[0]
    if self.device.type != "cpu":
        return None
    if not is_host(self):
        raise RuntimeError("cannot pin device memory (pin_memory() of a device tensor)")
    with _host_allocation():
        out = self.clone()
    return mark_host(out, pinned=True)


def _is_pinned(func: Callable, args: tuple, kwargs: dict) -> Any:
    from backend.graphs.host import is_pinned_host

    return is_pinned_host(args[0]) if args[0].device.type == "cpu" else None


_FROM_DATA = frozenset({torch.tensor, torch.as_tensor, torch.asarray})
_FACTORIES = (
    torch.tensor,
    torch.as_tensor,
    torch.asarray,
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.full,
    torch.arange,
    torch.linspace,
    torch.logspace,
    torch.eye,
    torch.empty_strided,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.randperm,
    torch.scalar_tensor,
)
_T = torch._C.TensorBase  # the mode is handed these methods, also where torch.Tensor wraps one
_LIKE = (
    torch.zeros_like,
    torch.ones_like,
    torch.empty_like,
    torch.full_like,
    torch.rand_like,
    torch.randn_like,
    torch.randint_like,
    _T.new_zeros,
    _T.new_ones,
    _T.new_empty,
    _T.new_full,
    _T.new_tensor,
    _T.new_empty_strided,
)
_HANDLERS: dict[Callable, Callable[[Callable, tuple, dict], Any]] = {
    **{f: _factory for f in _FACTORIES},
    **{f: _like for f in _LIKE},
    _T.to: _to,
    _T.cpu: _cpu,
    _T.pin_memory: _pin_memory,
    _T.is_pinned: _is_pinned,
}


class HostProvenance(TorchFunctionMode):
    """Marks host memory as it is made (module doc). Results of ops whose tensor inputs are all
    host memory are host memory too (a GPU computes them on the CPU)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is not None:
            out = handler(func, args, kwargs)
            if out is not None:
                return out
        body = custom_op_body(func)
        if body is not None:
            # A custom op's Python body is host code too (vLLM runs attention inside one): torch
            # takes this mode off its stack while it handles a call, so the body's host tensors
            # went unclassified and host work in it was replayed as device work
            # (`cpu_compute_in_capture`, silently fresh where a real graph is stale). The body runs
            # here with the mode on; a capture's recorder records through it all the same.
            with self:
                return body(*args, **kwargs)
        out = func(*args, **kwargs)
        if func is not _T.__setitem__:
            inputs = _tensors((args, kwargs))
            if inputs and all(t.device.type == "cpu" and is_host(t) for t in inputs):
                _mark_new(out, inputs)
        return out


# Namespaces of ops with a kernel in torch; any other is a custom op (torch.library).
BUILTIN_NAMESPACES = frozenset({"aten", "prims", "c10d", "_c10d_functional", "rngprims", "profiler"})


def custom_op_body(func: Any) -> Callable | None:
    """The Python body of a torch.library.custom_op (an OpOverload, or an OpOverloadPacket of one
    overload), or None: a builtin op, or one registered without a Python body (Library.impl, C++)."""
    if isinstance(func, torch._ops.OpOverloadPacket):
        if func._qualified_op_name.split("::")[0] in BUILTIN_NAMESPACES or len(func.overloads()) != 1:
            return None
        func = getattr(func, func.overloads()[0])
    if not isinstance(func, torch._ops.OpOverload) or func.namespace in BUILTIN_NAMESPACES:
        return None
    opdef = _maybe_get_opdef(func)
    if opdef is None:
        return None
    return opdef._backend_fns.get("cpu") or opdef._backend_fns.get(None) or opdef._init_fn


# Host memory made below the dispatcher, which no TorchFunctionMode sees: numpy's memory (vLLM's
# builders keep their host metadata as numpy views and torch.from_numpy them) and raw buffers.
# Always host memory on a GPU; unclassified, the emulation took it for device memory and replayed
# host work on it with live values (fresh where a real graph is stale or cannot capture). torch's
# two functions are wrapped to mark what they return while a scope is on.
_BELOW_DISPATCHER = ("from_numpy", "frombuffer")


def _marking(make: Callable) -> Callable:
    def made(*args: Any, **kwargs: Any) -> torch.Tensor:
        t = make(*args, **kwargs)
        return mark_host(t) if _active() else t

    made._orch_host = True  # type: ignore[attr-defined]
    return made


def _mark_below_dispatcher() -> None:
    """Wrap the functions once, for good: they mark only while a scope is on in the calling thread
    (a patch undone at the scope's end could be undone in the wrong order by two threads)."""
    for name in _BELOW_DISPATCHER:
        make = getattr(torch, name)
        if not getattr(make, "_orch_host", False):
            setattr(torch, name, _marking(make))


@contextlib.contextmanager
def host_scope(device: torch.device | str | None = "cpu") -> Iterator[None]:
    """Classify the host memory made inside (module doc); a no-op on a GPU, where a tensor's
    device says it."""
    if (device is not None and torch.device(device).type != "cpu") or _active():
        yield
        return
    _mark_below_dispatcher()
    with HostProvenance():
        yield


def _active() -> bool:
    """A scope is on already (the capture's, around the backend's forward): one is enough."""
    return any(isinstance(m, HostProvenance) for m in torch.overrides._get_current_function_mode_stack())
