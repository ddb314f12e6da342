"""CPU emulation of CUDA graphs (DESIGN.md §4): record the aten op stream of one capture run,
then replay it on the same tensor objects.

What it freezes is what a real graph freezes: the op sequence, every shape and every host scalar
in the op arguments (python ints/floats, branches taken in Python). Tensor contents are read
live at replay. Replay rules per recorded op:
- views (the result shares an input's storage: schema-marked views, `_unsafe_view`, a `to` or
  `reshape` that did not copy): nothing, the recorded view object still aliases its base; a
  may-alias op that copied (`to` with a new dtype, inside a custom op's body) is re-run;
- `empty*` factories: nothing (a graph leaves such memory as it is);
- c10d collectives (gloo/NCCL through torch.distributed; the schema of e.g. `c10d.allreduce_`
  is not marked mutable and returns (tensors, Work)): re-issued in recorded order, which is the
  same order on every rank, and every returned Work is waited on before the next op;
- functional collectives (`_c10d_functional.*`): re-issued, waited, copied into the recorded output;
- everything else (out-of-place, in-place, `out=`): re-run on the recorded args (the same tensor
  objects, so current contents are read); fresh results are copied into the recorded outputs.
Random ops draw new numbers at each replay, like a graph-safe generator advancing its offset.

Capture on a GPU records without executing. To match, state the capture wrote into tensors that
existed before it (persistent buffers, KV cache, a collective's tensor) is restored afterwards;
tensors created during capture keep their values. The flex_attention higher-order op is recorded
through torch's dense implementation (_register_hop_rules). Host syncs raise GraphCaptureError as they
fail a real capture: `.item()`/`bool()`/`int()` (`_local_scalar_dense`, `is_nonzero`),
`nonzero`, boolean-mask indexing, `masked_select`, `unique*`, `equal`, `repeat_interleave`
without output_size, `tolist()`/`numpy()`, and device->host copies (`.cpu()`, `.to("cpu")` in any
of its forms, `.to(host_tensor)`, `copy_` into host memory). Host memory is what
backend/graphs/host.py marks (every view of a marked storage); everything else on CPU counts as
device memory, so a same-device `.to(x.device)` is refused like `.to("cpu")` (both name cpu here).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch._library.custom_ops import _maybe_get_opdef
from torch.utils._pytree import tree_flatten, tree_map

from backend.graphs.base import CapturedGraph, GraphCaptureError, GraphRunner, capturing
from backend.graphs.host import is_host, is_pinned_host, mark_host

# Ops whose result depends on tensor data on the host (a device->host sync on a GPU).
_HOST_SYNC_OPS = frozenset({
    "aten::_local_scalar_dense", "aten::is_nonzero", "aten::nonzero", "aten::masked_select",
    "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
    "aten::unique_dim_consecutive", "aten::equal", "aten::bincount", "aten::argwhere",
    "aten::allclose", "aten::item",  # aten::item is seen when dispatched inside an op's body
})
# Namespaces of ops with a kernel in torch; any other namespace is a custom op (torch.library).
_BUILTIN_NAMESPACES = frozenset({"aten", "prims", "c10d", "_c10d_functional", "rngprims", "profiler"})
_BOOL_INDEX_OPS = frozenset({"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"})
_EMPTY_OPS = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
                        "aten::new_empty_strided"})


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _host_sync_reason(func: torch._ops.OpOverload, args: tuple, kwargs: dict, flat: list | None = None) -> str | None:
    name = func._schema.name
    if name in _HOST_SYNC_OPS:
        return f"{func} (reads tensor data on the host)"
    if name == "aten::histc":
        lo = args[2] if len(args) > 2 else kwargs.get("min", 0)
        hi = args[3] if len(args) > 3 else kwargs.get("max", 0)
        if lo == hi:
            return f"{func} with min == max (the range is read from the data on the host)"
    if any(isinstance(x, torch.Generator) for x in (tree_flatten((args, kwargs))[0] if flat is None else flat)):
        return (f"{func} with an explicit torch.Generator (a CUDA graph refuses a generator it was "
                "not given through register_generator_state)")
    if name == "aten::repeat_interleave" and func._overloadname in ("Tensor", "self_Tensor") \
            and kwargs.get("output_size") is None:
        return f"{func} without output_size (output shape depends on tensor data)"
    if name in _BOOL_INDEX_OPS:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        for ix in indices or ():
            if isinstance(ix, torch.Tensor) and ix.dtype in (torch.bool, torch.uint8):
                return f"{func} with a boolean mask (output shape depends on tensor data)"
    return None


def _written_args(func: torch._ops.OpOverload, args: tuple, kwargs: dict,
                  tensors: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    if func.namespace == "c10d":  # not marked mutable, but writes its tensor arguments
        return _tensors((args, kwargs)) if tensors is None else list(tensors)
    written = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = kwargs.get(arg.name, args[i] if i < len(args) and not arg.kwarg_only else None)
            written += _tensors(value)
    return written


@dataclass
class _Op:
    func: torch._ops.OpOverload
    args: tuple
    kwargs: dict
    out: Any
    kind: str  # "run" | "skip" | "c10d" | "functional"


def _wait_all(tree: Any) -> None:
    for x in tree_flatten(tree)[0]:
        if not isinstance(x, torch.Tensor) and hasattr(x, "wait"):
            x.wait()


def _copy_leaves(recorded: list, fresh: list) -> None:
    """Each fresh result into its recorded output object, unless the op wrote in place."""
    for rec, new in zip(recorded, fresh):
        if isinstance(rec, torch.Tensor) and isinstance(new, torch.Tensor) and rec is not new:
            if rec.numel() and rec.data_ptr() == new.data_ptr() and _storage_ptr(rec) == _storage_ptr(new):
                continue  # the op wrote in place and returned (a view of) its argument
            rec.copy_(new)


class _Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps a subclass's __torch_dispatch__ in torch._disable_dynamo unless
        # this says no; the wrapper imports torch._dynamo on the first op (1.5-4.4 s per worker
        # process on the 2-core machine, paid by every rank of every gang) and adds a frame per
        # op. Nothing here runs under torch.compile, so there is no Dynamo to keep out (#13).
        return False

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[_Op] = []
        self.fresh_storages: set[int] = set()  # storages allocated during capture
        self.snapshots: list[tuple[torch.Tensor, torch.Tensor]] = []  # pre-capture contents
        self._snapshotted: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace not in _BUILTIN_NAMESPACES:
            return self._custom_op(func, args, kwargs)
        # The arguments flattened once per op (capture's cost is this Python per op, #13).
        flat = tree_flatten((args, kwargs))[0]
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        host = [t for t in tensors if is_host(t)]
        if host:
            args, kwargs, done, out = self._host_tensors(func, args, kwargs, host)
            if done:
                return out
            flat = tree_flatten((args, kwargs))[0]  # host scalars may have been swapped for frozen copies
            tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        reason = _host_sync_reason(func, args, kwargs, flat)
        if reason is not None:
            raise GraphCaptureError(f"host sync during graph capture: {reason}")
        for t in _written_args(func, args, kwargs, tensors):
            # Snapshot tensors that outlive the capture before their first write (see module doc).
            if id(t) not in self._snapshotted and _storage_ptr(t) not in self.fresh_storages:
                self._snapshotted.add(id(t))
                self.snapshots.append((t, t.detach().clone()))
        out = func(*args, **kwargs)
        self.ops.append(_Op(func, args, kwargs, out, self._classify(func, args, kwargs, out, tensors)))
        return out

    def _custom_op(self, func, args, kwargs):
        # A custom op is one opaque op to the dispatcher: recorded as such, its Python body would
        # re-run at replay with live host state (a global, a forward context) where a graph
        # replays the kernels the body launched at capture. So record through the body.
        opdef = _maybe_get_opdef(func)
        body = None
        if opdef is not None:
            body = opdef._backend_fns.get("cpu") or opdef._backend_fns.get(None) or opdef._init_fn
        if body is None:
            raise GraphCaptureError(
                f"cannot emulate: custom op {func} has no Python body to record through "
                "(registered without torch.library.custom_op); its host reads would not be frozen")
        with self:
            return body(*args, **kwargs)

    def _host_tensors(self, func, args, kwargs, host):
        """Host memory in an op. Returns (args, kwargs, done, out); done means the op ran on the
        host now and is not part of the graph (a GPU runs host work during capture, once)."""
        name = func._schema.name
        if name == "aten::copy_":
            dst, src = args[0], args[1]
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            if is_host(dst) and not is_host(src):
                raise GraphCaptureError(f"host sync during graph capture: {func} device->host copy")
            if not is_host(dst):
                if not (non_blocking and is_pinned_host(src)):
                    raise GraphCaptureError(
                        f"host sync during graph capture: {func} host->device copy that is blocking "
                        "or from pageable memory (a graph copies only from pinned memory, non_blocking)")
                return args, kwargs, False, None  # replay re-reads the pinned buffer, as a graph does
        if len(host) == len(_tensors((args, kwargs))):
            out = func(*args, **kwargs)
            for t in _tensors(out):
                if not is_host(t):  # an in-place result keeps its mark (and pinned flag)
                    mark_host(t)
            return args, kwargs, True, out
        if all(t.dim() == 0 for t in host):
            # A CPU scalar tensor in a device op is passed by value: frozen at capture.
            frozen = {id(t): t.clone() for t in host}
            swap = lambda x: frozen.get(id(x), x) if isinstance(x, torch.Tensor) else x  # noqa: E731
            return tree_map(swap, args), tree_map(swap, kwargs), False, None
        raise GraphCaptureError(
            f"graph capture failed: {func} mixes host tensors with device tensors "
            f"(host shape {tuple(host[0].shape)}; a GPU op refuses CPU tensors)")

    def _classify(self, func, args, kwargs, out, tensors: list[torch.Tensor] | None = None) -> str:
        if func.namespace == "c10d":
            return "c10d"
        if func.namespace == "_c10d_functional" and func._schema.name != "_c10d_functional::wait_tensor":
            self._note_fresh(out)
            return "functional"
        schema = func._schema
        mutable = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        if not mutable:
            if schema.name in _EMPTY_OPS:
                self._note_fresh(out)
                return "skip"
            # A view (marked in the schema or not, e.g. _unsafe_view): the recorded object aliases
            # its base. Decided by the result, not the schema: `to`, `reshape`, `contiguous` are
            # marked as may-alias but copy when they convert; composite ops like these reach the
            # recorder as such inside a custom op's body (below autograd), and a copy taken for a
            # view would be frozen at its capture value.
            inputs = {_storage_ptr(t) for t in (_tensors((args, kwargs)) if tensors is None else tensors)} - {0}
            if any(_storage_ptr(t) in inputs for t in _tensors(out)):
                return "skip"
            self._note_fresh(out)
        return "run"

    def _note_fresh(self, out: Any) -> None:
        self.fresh_storages.update(p for p in map(_storage_ptr, _tensors(out)) if p)

    def restore(self) -> None:
        # Reverse order: the oldest snapshot of overlapping views wins.
        with torch.no_grad():
            for t, saved in reversed(self.snapshots):
                t.copy_(saved)
        self.snapshots.clear()


def _register_hop_rules() -> None:
    """Higher-order operators reach a dispatch mode whole; a graph records the kernels they
    launch. flex_attention (vLLM's FLEX_ATTENTION backend run eagerly on CPU) is recorded through
    torch's own dense implementation, so its aten ops, with every host value they take, are what
    replays. Any other HOP under capture is refused by torch with a clear error."""
    try:
        from torch._higher_order_ops.flex_attention import flex_attention as flex_hop, sdpa_dense
    except ImportError:  # a torch without flex attention
        return

    @flex_hop.py_impl(_Recorder)
    def _flex_recorded(mode, *args, **kwargs):
        with mode:
            return sdpa_dense(*args, **kwargs)


_register_hop_rules()


def _refuse_host_read(what: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def refuse(self: torch.Tensor, *a: Any, **k: Any) -> Any:
        if is_host(self):
            return original(self, *a, **k)
        if what == "cpu":
            raise GraphCaptureError("host sync during graph capture: Tensor.cpu() copies device->host")
        raise GraphCaptureError(f"host sync during graph capture: Tensor.{what}() reads tensor data on the host")
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
                "is a no-op)")
        if target is not None:
            raise GraphCaptureError(f"host sync during graph capture: Tensor.to({target}) copies device->host")
        return original(self, *a, **k)
    return to


@contextlib.contextmanager
def _no_host_reads() -> Iterator[None]:
    # tolist()/numpy() read memory directly, below the dispatcher, so the mode cannot see them;
    # cpu() and to("cpu") of a CPU tensor return it without dispatching, so the mode cannot see
    # a D2H copy.
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


class EmulatedCapturedGraph(CapturedGraph):
    def __init__(self, ops: list[_Op], outputs: object):
        self._ops = ops
        self.outputs = outputs
        # What replay needs per op, worked out once (the recorded objects never change): the
        # callable, and the recorded output's leaves, or None for ops whose result is not copied.
        # A replay of the small CPU model is ~100 ops; flattening the recorded output of every op
        # on every replay was a third of the replay's Python time (#13).
        self._plan = [(getattr(op.func, "_op", op.func), op.args, op.kwargs, op.kind,
                       None if op.kind in ("skip", "c10d") else tree_flatten(op.out)[0]) for op in ops]

    @property
    def num_ops(self) -> int:
        return len(self._ops)

    def op_names(self) -> list[str]:
        return [str(op.func) for op in self._ops]

    def replay(self) -> object:
        with torch.no_grad():
            for call, args, kwargs, kind, recorded in self._plan:
                if kind == "skip":
                    continue
                result = call(*args, **kwargs)
                if kind == "c10d":
                    _wait_all(result)  # else the next op reads the unreduced tensor
                    continue
                if kind == "functional":
                    for t in _tensors(result):
                        torch.ops._c10d_functional.wait_tensor(t)
                _copy_leaves(recorded, [result] if isinstance(result, torch.Tensor) else tree_flatten(result)[0])
        return self.outputs


class EmulatedGraphRunner(GraphRunner):
    kind = "emulated"

    def warmup(self, fn: Callable[[], object], iters: int = 2) -> None:
        for _ in range(iters):
            fn()

    def capture(self, fn: Callable[[], object]) -> EmulatedCapturedGraph:
        recorder = _Recorder()
        try:
            with capturing(), _no_host_reads(), recorder:
                outputs = fn()
        except GraphCaptureError:
            raise
        except Exception as e:  # a real capture fails the same way: nothing usable is left
            cause = e.__cause__ if isinstance(e.__cause__, GraphCaptureError) else None
            if cause is not None:
                raise cause from e
            raise GraphCaptureError(f"graph capture failed: {type(e).__name__}: {e}".splitlines()[0]) from e
        finally:
            recorder.restore()
        return EmulatedCapturedGraph(recorder.ops, outputs)
