"""The memory pool every capture of one emulated runner shares, as a CUDA graph pool is shared
(DESIGN.md §4: vLLM captures every size into one pool, largest first).

On a GPU, device memory allocated during a capture comes from the graph's private pool. Memory a
capture frees (its temporaries) goes back to that pool, and a later capture into the same pool
may be handed the same bytes, for its own temporaries or for a tensor it returns. The graphs then
share memory: replaying the earlier graph writes its temporaries over what the later graph
returned, and a read of that tensor after the replay sees the other graph's values. Also, a
capture runs no kernels: memory it allocated holds whatever was there (nothing this step
computed) until the graph is replayed.

The emulation keeps its tensors in their own CPU storages (they must stay resizable, and their
contents are what the op stream computes), and models the pool's addresses beside them: every
storage allocated during a capture gets a block of a virtual address space, placed the way the
caching allocator places blocks (sizes rounded to 512 bytes, a small pool of 2 MiB segments for
blocks up to 1 MiB and a large pool, best fit by size then address, blocks split and coalesced).
A storage's block is freed when nothing outside the recorders holds the storage (the recorders
hold aliases: their own tensor objects on it, counted apart). At replay, a write to a storage whose
block was freed is copied into every storage that now holds an overlapping block (`propagate`),
so shared memory behaves as shared memory. At the end of a capture the storages it allocated are
filled with 0xFF bytes (`poison`): uninitialised memory, NaN for floats.

A model of the allocator, not the allocator: which blocks a real capture shares depends on its
exact request sizes and order; the model gives the same sharing for the same requests in the simple
cases the probes pin (tests/graphs/probes.py: pool_*), and no sharing at all where nothing was freed.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

_ROUND = 512  # kMinBlockSize
_SMALL = 1 << 20  # kSmallSize: up to this, blocks come from the small pool
_SMALL_SEGMENT = 2 << 20  # kSmallBuffer
_LARGE_ROUND = 2 << 20  # large segments are rounded to this (kRoundLarge)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


@dataclass
class Block:
    start: int
    size: int
    small: bool
    segment: int
    key: int = 0  # the storage (StorageImpl address) that holds it; 0: free
    data: torch.Tensor | None = None  # uint8 view of that storage: the pool's own reference
    aliases: list = field(default_factory=list)  # weak references to the recorders' tensors on it
    own: int = 0  # storage references that are the pool's: its uint8 view, the storage's Python object
    capture: int = 0  # which capture allocated it

    @property
    def end(self) -> int:
        return self.start + self.size


class MemoryPool:
    def __init__(self) -> None:
        self._free: list[Block] = []  # free blocks (key 0)
        self._live: dict[int, Block] = {}  # storage key -> its block, while held outside the recorders
        self._freed: dict[int, Block] = {}  # storage key -> its block after it was freed
        self._segments = 0
        self._top = 0
        self.capture = 0  # the current capture's number (begin_capture)

    # ---- capture ---------------------------------------------------------------------------------
    def begin_capture(self) -> None:
        self.capture += 1
        self.sweep()

    def tracks(self, t: torch.Tensor) -> bool:
        key = _storage_key(t)
        return key in self._live or key in self._freed

    def allocate(self, t: torch.Tensor, holders: int = 1) -> None:
        """`t`'s storage was allocated during the current capture: give it a block. `holders`: the
        op's result tensors on it (the caller's, for now)."""
        key = _storage_key(t)
        if key in self._live:
            return
        self.sweep(current_only=True)
        nbytes = t.untyped_storage().nbytes()
        block = self._take(nbytes)
        block.key, block.capture = key, self.capture
        block.data = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
        # What holds the storage besides the results: the view above and, once any code asked a
        # tensor for its untyped_storage(), that Python object, which torch keeps with the storage.
        block.own = torch._C._storage_Use_Count(key) - holders
        self._live[key] = block

    def resized(self, t: torch.Tensor) -> None:
        """A tracked storage grew during the capture (an out= tensor resized): a new block."""
        key = _storage_key(t)
        block = self._live.get(key)
        if block is not None and t.untyped_storage().nbytes() > block.size:
            self._release(block)
            self.allocate(t)

    def alias(self, t: torch.Tensor) -> torch.Tensor:
        """The recorder's own tensor for `t`: the same memory, shape and strides, but a separate
        tensor object that the pool counts apart, so that holding it does not keep `t`'s block."""
        key = _storage_key(t)
        block = self._live.get(key) or self._freed.get(key)
        if block is None:
            return t
        a = t.detach()
        block.aliases.append(weakref.ref(a))
        return a

    def end_capture(self) -> None:
        """Memory allocated by this capture holds no computed values on a GPU until a replay."""
        self.sweep()
        for block in [*self._live.values(), *self._freed.values()]:
            if block.capture == self.capture and block.data is not None:
                block.data.fill_(0xFF)

    # ---- liveness -------------------------------------------------------------------------------
    def _held_outside(self, block: Block) -> bool:
        block.aliases = [r for r in block.aliases if r() is not None]
        # Storage references: the pool's own, the recorders' aliases, everything else.
        return torch._C._storage_Use_Count(block.key) > block.own + len(block.aliases)

    def sweep(self, current_only: bool = False) -> None:
        for key, block in list(self._live.items()):
            if current_only and block.capture != self.capture:
                continue
            if not self._held_outside(block):
                del self._live[key]
                self._release(block)

    def _release(self, block: Block) -> None:
        self._live.pop(block.key, None)
        self._freed[block.key] = block
        if not block.aliases:
            self._freed.pop(block.key, None)  # nobody can write it any more
        free = Block(block.start, block.size, block.small, block.segment)
        self._free.append(free)
        self._coalesce(free)

    def _coalesce(self, block: Block) -> None:
        for other in sorted(self._free, key=lambda b: b.start):
            if other is block or other.segment != block.segment:
                continue
            if other.end == block.start or block.end == other.start:
                self._free.remove(other)
                block.start, block.size = min(block.start, other.start), block.size + other.size

    # ---- placement ------------------------------------------------------------------------------
    def _take(self, nbytes: int) -> Block:
        size = max(_ROUND, -(-nbytes // _ROUND) * _ROUND)
        small = size <= _SMALL
        fits = [b for b in self._free if b.small == small and b.size >= size]
        if not fits:
            seg = _SMALL_SEGMENT if small else -(-size // _LARGE_ROUND) * _LARGE_ROUND
            block = Block(self._top, seg, small, self._segments)
            self._segments += 1
            self._top += seg
        else:
            block = min(fits, key=lambda b: (b.size, b.start))
            self._free.remove(block)
        rest = block.size - size
        if rest >= (_ROUND if small else _SMALL + 1):  # the allocator's split rule
            remainder = Block(block.start + size, rest, small, block.segment)
            self._free.append(remainder)
            block = Block(block.start, size, small, block.segment)
        return block

    # ---- replay ---------------------------------------------------------------------------------
    def propagate(self, key: int) -> None:
        """Storage `key` was just written by a replay. If its block was freed, the bytes it wrote
        are also the bytes of whatever holds an overlapping block now."""
        block = self._freed.get(key)
        if block is None or block.data is None:
            return
        for other in self._live.values():
            if other.start >= block.end or block.start >= other.end or other.data is None:
                continue
            lo, hi = max(block.start, other.start), min(block.end, other.end)
            src_lo, dst_lo = lo - block.start, lo - other.start
            n = min(hi - lo, block.data.numel() - src_lo, other.data.numel() - dst_lo)
            if n > 0:
                other.data[dst_lo : dst_lo + n].copy_(block.data[src_lo : src_lo + n])

    def keys_of(self, tensors: list[torch.Tensor]) -> tuple[int, ...]:
        """The pool storages among `tensors` (what a recorded op writes), for propagate."""
        keys = []
        for t in tensors:
            key = _storage_key(t)
            if (key in self._live or key in self._freed) and key not in keys:
                keys.append(key)
        return tuple(keys)
