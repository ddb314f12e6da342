"""Memory a captured graph reads but does not own: who keeps it alive, where it was
allocated, and what a replay reads once nothing does.

A real graph's kernels hold raw addresses. Memory that existed before the capture (persistent
buffers, weights, the KV cache, and whatever a backend cached) must outlive the graph; if the last
tensor on it goes (an `lru_cache` evicting its entry on a call with other shapes: AITER's
`mla_decode_fwd` split indptr, ROCm/aiter#5193), the allocator hands the block to the next
allocation and every replay reads that. The emulation used to keep every captured tensor alive, so
it never saw this. Now the recorder holds its own aliases of such memory (tensor objects on the
same storage, counted apart, as pool.py does for memory allocated in the capture), and before
each replay a storage that nothing but those aliases holds is freed memory: it is filled with the
poison pattern (the bytes a reused block is least likely to hold correctly: NaN for floats, far out
of range for ints) and the graph notes the read, naming where the memory was allocated.

Allocation sites: the runner's warm-up (one eager run just before each capture, where a per-call
cache is filled on a miss) records, per new storage, the first frame outside torch and the graph
runners; memory allocated elsewhere (at import, in an earlier eager step) is named by where the
capture read it.

Per-call caches: on a GPU the checker evicts them before every replay by running the model on
other shapes (backend/harness/churn.py). The emulation runs nothing again; it models that: memory
the graph reads that its warm-up allocated and that nothing but bounded `functools.lru_cache`s
holds is evicted from those caches when the capture ends (`cache_clear`: a busy engine's calls with
other shapes evict a bounded cache's entries; an unbounded cache never does), so it is freed memory
at every replay, whatever ran in between. A cache of another kind (a module-level dict) is not
recognised: there only a GPU's churn sees it.
"""

from __future__ import annotations

import functools
import gc
import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from backend.graphs.leaves import leaves

# 0x7FFF as little-endian 16-bit words: NaN as bf16, fp16, fp32 and fp64 (every exponent bit set,
# mantissa non-zero), 32767 / 2147450879 / ~9.2e18 as int16 / int32 / int64 (an index out of any
# range), NaN as fp8 e4m3fn (0x7F, 0xFF). The GPU harness poisons freed device memory with it too.
POISON_WORD = 0x7FFF


def poison(t: torch.Tensor) -> None:
    """Fill the whole storage under `t` with the poison pattern."""
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
    words = raw[: raw.numel() // 2 * 2].view(torch.int16)
    words.fill_(POISON_WORD)
    if raw.numel() % 2:
        raw[-1:].fill_(0xFF)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


_SKIP = ("/torch/", "/backend/graphs/", "/contextlib.py", "/functools.py")


def caller_site(depth: int = 2) -> str:
    """file.py:line of the first frame above this one outside torch and the graph runners."""
    frame = sys._getframe(depth)
    while frame is not None and any(s in frame.f_code.co_filename for s in _SKIP):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"


class AllocationSites(TorchDispatchMode):
    """During a warm-up: the allocation site of each storage its ops return new (key -> (site, a
    weak reference to the storage: an address reused after it was freed is not the same storage))."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as the recorder (emulated.py): no torch._dynamo import per op

    def __init__(self) -> None:
        super().__init__()
        self.sites: dict[int, tuple[str, StorageWeakRef]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage_key(t) for t in leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in leaves(out):
            if isinstance(t, torch.Tensor):
                key = _storage_key(t)
                if key not in inputs:
                    self.sites[key] = (caller_site(), StorageWeakRef(t.untyped_storage()))
        return out


@dataclass
class _External:
    key: int
    what: str  # "[4] float32"
    site: str  # where it was allocated, or where the capture read it
    aliases: list = field(default_factory=list)  # weak references to the recorder's aliases on it
    freed: bool = False
    origin: Any = None  # a weak reference to a tensor the warm-up allocated on it (the caller's)

    def held_outside(self) -> bool:
        self.aliases = [r for r in self.aliases if r() is not None]
        # Storage references: the recorder's aliases, the storage's Python object (created when the
        # key was taken; torch keeps it with the storage), everything else.
        return torch._C._storage_Use_Count(self.key) > len(self.aliases) + 1


# Every external storage any recorder of this process aliased, by storage key: the aliases of all
# graphs count as the graphs' own (a graph does not keep memory alive for another, on a GPU
# neither). An entry whose aliases are all gone (its graphs dropped) is forgotten on the next look.
_REGISTRY: dict[int, _External] = {}
_PRUNE_AT = [4096]


def _prune() -> None:
    if len(_REGISTRY) >= _PRUNE_AT[0]:
        for key in [k for k, e in _REGISTRY.items() if not any(r() is not None for r in e.aliases)]:
            del _REGISTRY[key]
        _PRUNE_AT[0] = max(4096, 2 * len(_REGISTRY))


class ExternalMemory:
    """Per capture: the storages that existed before it which its recorded ops read or write."""

    def __init__(self, sites: dict[int, tuple[str, StorageWeakRef]] | None = None) -> None:
        self._sites = sites or {}
        self._keys: list[int] = []
        self._aliases: dict[int, tuple[Any, torch.Tensor]] = {}  # id(tensor) -> (weakref, alias)

    def alias(self, t: torch.Tensor) -> torch.Tensor:
        """The recorder's own tensor for `t` (same storage, shape and strides; a separate object)."""
        hit = self._aliases.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        key = _storage_key(t)
        entry = _REGISTRY.get(key)
        if entry is not None and not any(r() is not None for r in entry.aliases):
            entry = None  # a storage at a reused address: a new one
        if entry is None:
            site, ref = self._sites.get(key, (None, None))
            warmup = ref is not None and not ref.expired()
            where = (
                f"allocated at {site} (in the warm-up before the capture)"
                if warmup
                else f"allocated before the capture, read at {caller_site()}"
            )
            shape = ", ".join(map(str, t.shape))
            _prune()
            entry = _REGISTRY[key] = _External(
                key,
                f"[{shape}] {str(t.dtype).removeprefix('torch.')}",
                where,
                origin=weakref.ref(t) if warmup else None,
            )
        if key not in self._keys:
            self._keys.append(key)
        a = t.detach()
        entry.aliases.append(weakref.ref(a))
        self._aliases[id(t)] = (weakref.ref(t), a)
        return a

    def entries(self) -> list[_External]:
        return [_REGISTRY[k] for k in self._keys]

    def evict_per_call(self) -> None:
        """After the capture: what a busy engine's per-call caches would evict (module doc)."""
        for entry in self.entries():
            t = entry.origin() if entry.origin is not None else None
            if t is None:
                continue
            entry.origin = None
            caches = _bounded_caches_only(t)
            del t
            for cache in caches:
                cache.cache_clear()
            if caches:
                entry.site += (
                    f", held only by the lru_cache of {caches[0].__qualname__}: evicted, as a busy "
                    "engine's calls with other shapes evict it"
                )


def _bounded_caches_only(t: torch.Tensor) -> list:
    """The bounded functools.lru_cache wrappers holding `t`, if they are all that holds it (the
    cache's own dict counts as the cache); [] otherwise. gc.get_referrers walks every object: only
    for tensors a warm-up allocated and a graph reads, which correct backends keep elsewhere."""
    caches: list = []
    for holder in gc.get_referrers(t):
        if isinstance(holder, types.FrameType):  # a caller's local, gone when it returns
            continue
        if isinstance(holder, dict):
            owners = [o for o in gc.get_referrers(holder) if isinstance(o, functools._lru_cache_wrapper)]
            if not owners:
                return []
            holder = owners[0]
        if not isinstance(holder, functools._lru_cache_wrapper) or holder.cache_parameters()["maxsize"] is None:
            return []
        if holder not in caches:
            caches.append(holder)
    return caches


def freed_reads(entries: list[_External]) -> list[str]:
    """Before a replay: the entries nothing outside the recorders holds any more are freed memory,
    poisoned now (on a GPU the block may have been handed out again at any time since, so each
    replay reads it anew); their notes."""
    notes = []
    for e in entries:
        if e.freed or not e.held_outside():
            alive = next((r() for r in e.aliases if r() is not None), None)
            if alive is None:
                continue
            e.freed = True
            poison(alive)
            notes.append(freed_note(e))
    return notes


def freed_note(entry: _External) -> str:
    return (
        f"reads memory nothing kept alive after the capture: a {entry.what} tensor {entry.site}; a real "
        "graph reads whatever the allocator put there since (ROCm/aiter#5193)"
    )
