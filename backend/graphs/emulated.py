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
existed before it (persistent buffers, KV cache, a collective's tensor) is restored afterwards,
also when an op resized them (`out=`); memory allocated during the capture comes from the runner's
one pool (pool.py: blocks freed by one capture are reused by the next, so graphs of a pool share
memory, as vLLM's do) and holds 0xFF bytes after the capture (nothing computed until a replay).
The flex_attention higher-order op is recorded through torch's dense implementation
(_register_hop_rules). Host syncs raise GraphCaptureError as they fail a real capture (syncs.py:
`.item()`/`bool()`/`int()`, `nonzero`, boolean-mask indexing, `masked_select`, `unique*`, `equal`,
`repeat_interleave` without output_size, torch.linalg's error checks; host_reads.py: `tolist()`/
`numpy()` and device->host copies: `.cpu()`, `.to("cpu")` in any of its forms, `.to(host_tensor)`,
`copy_` into host memory, a blocking host->device copy). `x[mask] = scalar` is recorded as the
`masked_fill_` a GPU runs (syncs.masked_fill_form). Host memory is what backend/graphs/host.py marks
(every view of a marked storage), found without marks by how it is made (provenance.py, active in
warm-up and capture); everything else on CPU counts as device memory, so a same-device
`.to(x.device)` is refused like `.to("cpu")` (both name cpu here). Host work runs once, at capture.
A ctypes call on a device tensor's raw pointer is recorded and replayed like the kernel a graph
captures; a pointer that leaves the dispatcher otherwise makes the graph `unverifiable` (opaque.py).
Memory that existed before the capture is recorded through aliases of the recorder's own, so the
graph keeps none of it alive: at a replay, what nothing else holds any more is freed memory,
poisoned and noted with where it was allocated (freed.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from backend.graphs.base import CapturedGraph, GraphCaptureError, GraphRunner, capturing
from backend.graphs.freed import AllocationSites, ExternalMemory, freed_reads
from backend.graphs.host import is_host, is_pinned_host, mark_host
from backend.graphs.host_reads import no_host_reads
from backend.graphs.leaves import leaves, map_leaves
from backend.graphs.opaque import OpaqueCalls, watching
from backend.graphs.pool import MemoryPool
from backend.graphs.provenance import BUILTIN_NAMESPACES, custom_op_body, host_scope, making_host
from backend.graphs.syncs import host_sync_reason, masked_fill_form

_EMPTY_OPS = frozenset(
    {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided"}
)


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in leaves(tree) if isinstance(x, torch.Tensor)]


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _storage_key(t: torch.Tensor) -> int:
    """The storage itself (its StorageImpl), also when it holds no bytes (data_ptr 0) or was
    reallocated by a resize."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return 0


def _written_args(
    func: torch._ops.OpOverload, args: tuple, kwargs: dict, tensors: list[torch.Tensor] | None = None
) -> list[torch.Tensor]:
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
    kind: str  # "run" | "skip" | "c10d" | "functional" | "opaque"
    writes: tuple[int, ...] = ()  # the pool storages it writes (pool.propagate at replay)


def _wait_all(tree: Any) -> None:
    for x in leaves(tree):
        if not isinstance(x, torch.Tensor) and hasattr(x, "wait"):
            x.wait()


def _copy_leaves(recorded: list, fresh: list) -> None:
    """Each fresh result into its recorded output object, unless the op wrote in place."""
    for rec, new in zip(recorded, fresh):
        if isinstance(rec, torch.Tensor) and isinstance(new, torch.Tensor) and rec is not new:
            if rec.numel() and rec.data_ptr() == new.data_ptr() and _storage_ptr(rec) == _storage_ptr(new):
                continue  # the op wrote in place and returned (a view of) its argument
            rec.copy_(new)


@dataclass
class _Snapshot:
    """A tensor's bytes before the capture first wrote it, and where they were: restored into that
    storage region also when the op resized the tensor (an `out=` argument)."""

    tensor: torch.Tensor
    saved: torch.Tensor
    key: int
    nbytes: int
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    def restore(self) -> None:
        t = self.tensor
        storage = t.untyped_storage()
        if storage._cdata != self.key:
            return  # set_ to other memory during the capture: the old storage was not written
        need = (self.offset + sum((s - 1) * st for s, st in zip(self.size, self.stride)) + 1) * t.element_size()
        if self.saved.numel() and storage.nbytes() >= need:
            torch.empty(0, dtype=t.dtype).set_(storage, self.offset, self.size, self.stride).copy_(self.saved)
        if storage.nbytes() > self.nbytes:
            # grown by a resize: on a GPU new memory from the graph's pool, the old bytes copied
            # into it and nothing computed after them
            torch.empty(0, dtype=torch.uint8).set_(storage)[self.nbytes :].fill_(0xFF)


class _Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps a subclass's __torch_dispatch__ in torch._disable_dynamo unless
        # this says no; the wrapper imports torch._dynamo on the first op (seconds per worker
        # process, paid by every rank of every gang: docs/BENCHMARKS.md) and adds a frame per
        # op. Nothing here runs under torch.compile, so there is no Dynamo to keep out.
        return False

    def __init__(self, pool: MemoryPool, sites: dict | None = None) -> None:
        super().__init__()
        self.pool = pool
        # Memory that existed before the capture, held through aliases of its own (freed.py).
        self.external = ExternalMemory(sites)
        self._owned: set[int] = set()  # storages only the graph holds: frozen copies of host scalars
        self.ops: list[_Op] = []
        self.fresh_storages: set[int] = set()  # storages allocated during capture (_storage_key)
        self.snapshots: list[_Snapshot] = []  # pre-capture contents
        self._snapshotted: set[int] = set()
        self._aliases: dict[int, tuple[Any, torch.Tensor]] = {}  # id(tensor) -> (weakref, the pool's alias)
        self.opaque = OpaqueCalls(self._record_opaque)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace not in BUILTIN_NAMESPACES:
            return self._custom_op(func, args, kwargs)
        if making_host() or func._schema.name == "aten::lift_fresh":
            # Host work a GPU runs once, at capture: a host factory (backend/graphs/provenance.py),
            # or python data lifted into a tensor, which is host memory on a GPU.
            out = func(*args, **kwargs)
            for t in _tensors(out):
                mark_host(t)
            return out
        rewritten = masked_fill_form(func, args, kwargs)
        if rewritten is not None:
            func, args, kwargs = rewritten
        # The arguments flattened once per op (capture's cost is this Python per op).
        flat = leaves((args, kwargs))
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        host = [t for t in tensors if is_host(t)]
        if host:
            args, kwargs, done, out = self._host_tensors(func, args, kwargs, host)
            if done:
                return out
            flat = leaves((args, kwargs))  # host scalars may have been swapped for frozen copies
            tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        reason = host_sync_reason(func, args, kwargs, flat)
        if reason is not None:
            raise GraphCaptureError(f"host sync during graph capture: {reason}")
        written = _written_args(func, args, kwargs, tensors)
        sizes = [t.untyped_storage().nbytes() for t in written]
        self._snapshot(written)
        out = func(*args, **kwargs)
        for t, before in zip(written, sizes):
            if t.untyped_storage().nbytes() > before:
                self.pool.resized(t)  # an out= argument grew: a new block of the pool
        kind = self._classify(func, args, kwargs, out, tensors)
        self._append(_Op(func, args, kwargs, out, kind), written + (_tensors(out) if kind != "skip" else []))
        return out

    def _snapshot(self, written: list[torch.Tensor]) -> None:
        for t in written:
            # Snapshot tensors that outlive the capture before their first write (see module doc).
            if id(t) not in self._snapshotted and _storage_key(t) not in self.fresh_storages:
                self._snapshotted.add(id(t))
                self.snapshots.append(
                    _Snapshot(
                        t,
                        t.detach().clone(),
                        _storage_key(t),
                        t.untyped_storage().nbytes(),
                        t.storage_offset(),
                        tuple(t.shape),
                        tuple(t.stride()),
                    )
                )

    def _alias(self, x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        hit = self._aliases.get(id(x))
        if hit is not None and hit[0]() is x:
            return hit[1]
        if not self.pool.tracks(x):
            key = _storage_key(x)
            if key and key not in self.fresh_storages and key not in self._owned and x.untyped_storage().nbytes():
                return self.external.alias(x)
            return x
        a = self.pool.alias(x)
        if a is not x:
            self._aliases[id(x)] = (weakref.ref(x), a)
        return a

    def _append(self, op: _Op, writes: list[torch.Tensor]) -> None:
        """Record an op on the recorder's own aliases of pool memory (pool.py: holding the
        caller's tensor objects would keep their blocks from ever being freed)."""
        op.args, op.kwargs, op.out = (
            map_leaves(self._alias, op.args),
            map_leaves(self._alias, op.kwargs),
            map_leaves(self._alias, op.out),
        )
        op.writes = self.pool.keys_of(writes)
        self.ops.append(op)

    def _record_opaque(self, call: Callable[[], Any], tensors: list[torch.Tensor]) -> None:
        """A ctypes launch on device memory (backend/graphs/opaque.py): restored like any write."""
        self._snapshot(tensors)
        # The op holds the tensors (their memory must outlive the graph: the call's pointers are raw)
        self._append(_Op(call, (), {}, tuple(tensors), "opaque"), tensors)

    def _custom_op(self, func, args, kwargs):
        # A custom op is one opaque op to the dispatcher: recorded as such, its Python body would
        # re-run at replay with live host state (a global, a forward context) where a graph
        # replays the kernels the body launched at capture. So record through the body.
        body = custom_op_body(func)
        if body is None:
            raise GraphCaptureError(
                f"cannot emulate: custom op {func} has no Python body to record through "
                "(registered without torch.library.custom_op); its host reads would not be frozen"
            )
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
                if not non_blocking:
                    raise GraphCaptureError(
                        f"host sync during graph capture: {func} blocking host->device copy (the copy waits "
                        "for the stream; a graph captures only non_blocking host->device copies)"
                    )
                if not is_pinned_host(src):
                    # Recorded on an H100 (torch 2.11, tests/graphs/golden_cuda.json): capture
                    # fails. pytorch/pytorch#166765 had it captured and replaying the buffer's
                    # current values on older releases; the recording is what we hold to.
                    raise GraphCaptureError(
                        f"graph capture failed: {func} non_blocking host->device copy from pageable "
                        "(unpinned) host memory"
                    )
                # non_blocking from pinned memory: the graph's copy node reads the buffer at replay
                return args, kwargs, False, None
        if len(host) == len(_tensors((args, kwargs))):
            out = func(*args, **kwargs)
            for t in _tensors(out):
                if not is_host(t):  # an in-place result keeps its mark (and pinned flag)
                    mark_host(t)
            return args, kwargs, True, out
        if all(t.dim() == 0 for t in host):
            # A CPU scalar tensor in a device op is passed by value: frozen at capture.
            frozen = {id(t): t.clone() for t in host}
            self._owned.update(_storage_key(c) for c in frozen.values())
            swap = lambda x: frozen.get(id(x), x) if isinstance(x, torch.Tensor) else x
            return map_leaves(swap, args), map_leaves(swap, kwargs), False, None
        raise GraphCaptureError(
            f"graph capture failed: {func} mixes host tensors with device tensors "
            f"(host shape {tuple(host[0].shape)}; a GPU op refuses CPU tensors)"
        )

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
        results = _tensors(out)
        keys = [_storage_key(t) for t in results]
        for t, key in zip(results, keys):
            if key and key not in self.fresh_storages:
                self.fresh_storages.add(key)
                self.pool.allocate(t, holders=keys.count(key))

    def restore(self) -> None:
        """Undo the capture's writes to memory that existed before it."""
        # Reverse order: the oldest snapshot of overlapping views wins.
        with torch.no_grad():
            for snap in reversed(self.snapshots):
                snap.restore()
        self.snapshots.clear()


def _register_hop_rules() -> None:
    """Higher-order operators reach a dispatch mode whole; a graph records the kernels they
    launch. flex_attention (vLLM's FLEX_ATTENTION backend run eagerly on CPU) is recorded through
    torch's own dense implementation, so its aten ops, with every host value they take, are what
    replays. Any other HOP under capture is refused by torch with a clear error."""
    try:
        from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
        from torch._higher_order_ops.flex_attention import sdpa_dense
    except ImportError:  # a torch without flex attention
        return

    @flex_hop.py_impl(_Recorder)
    def _flex_recorded(mode, *args, **kwargs):
        with mode:
            return sdpa_dense(*args, **kwargs)

    @flex_hop.py_impl(AllocationSites)  # the warm-up's mode: the same ops, their outputs' sites noted
    def _flex_warmup(mode, *args, **kwargs):
        with mode:
            return sdpa_dense(*args, **kwargs)


_register_hop_rules()


class EmulatedCapturedGraph(CapturedGraph):
    def __init__(
        self,
        ops: list[_Op],
        outputs: object,
        pool: MemoryPool | None = None,
        unverifiable: tuple[str, ...] = (),
        external: list | None = None,
    ):
        self._ops = ops
        self.outputs = outputs
        self._pool = pool or MemoryPool()
        # Memory the graph reads that existed before its capture (freed.py); what replays found
        # freed, noted: a real graph reads whatever was put there since.
        self._external = external or []
        self._freed: list[str] = []
        # What the emulation could not follow in this capture (opaque.py): the case's verdict then
        # says `emulation: unverifiable — ...` instead of a pass.
        self.unverifiable = unverifiable
        # What replay needs per op, worked out once (the recorded objects never change): the
        # callable, and the recorded output's leaves, or None for ops whose result is not copied.
        # A replay of the small CPU model is ~100 ops; flattening the recorded output of every op
        # on every replay was a third of the replay's Python time.
        self._plan = [
            (
                getattr(op.func, "_op", op.func),
                op.args,
                op.kwargs,
                op.kind,
                None if op.kind in ("skip", "c10d", "opaque") else leaves(op.out),
                op.writes,
            )
            for op in ops
        ]

    @property
    def num_ops(self) -> int:
        return len(self._ops)

    def op_names(self) -> list[str]:
        return [str(op.func) for op in self._ops]

    @property
    def freed_reads(self) -> tuple[str, ...]:
        return tuple(self._freed)

    def replay(self) -> object:
        propagate = self._pool.propagate
        for note in freed_reads(self._external):
            if note not in self._freed:
                self._freed.append(note)
        with torch.no_grad():
            for call, args, kwargs, kind, recorded, writes in self._plan:
                if kind == "skip":
                    continue
                result = call(*args, **kwargs)
                if kind == "c10d":
                    _wait_all(result)  # else the next op reads the unreduced tensor
                elif kind != "opaque":
                    if kind == "functional":
                        for t in _tensors(result):
                            torch.ops._c10d_functional.wait_tensor(t)
                    _copy_leaves(recorded, [result] if isinstance(result, torch.Tensor) else leaves(result))
                for key in writes:  # memory another graph of the pool may hold now (pool.py)
                    propagate(key)
        return self.outputs


class EmulatedGraphRunner(GraphRunner):
    kind = "emulated"

    def __init__(self) -> None:
        self.pool = MemoryPool()  # every capture of this runner shares it, as a CUDA graph pool
        self._sites: dict = {}  # where the last warm-up allocated (freed.py)

    def warmup(self, fn: Callable[[], object], iters: int = 2) -> None:
        with host_scope(), AllocationSites() as sites:
            for _ in range(iters):
                fn()
        self._sites = sites.sites

    def capture(self, fn: Callable[[], object]) -> EmulatedCapturedGraph:
        recorder = _Recorder(self.pool, self._sites)
        self._sites = {}
        self.pool.begin_capture()
        try:
            with capturing(), no_host_reads(), host_scope(), watching(recorder.opaque), recorder:
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
            self.pool.end_capture()
        recorder.external.evict_per_call()
        return EmulatedCapturedGraph(
            recorder.ops, outputs, self.pool, tuple(recorder.opaque.notes()), recorder.external.entries()
        )
