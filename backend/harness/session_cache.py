"""A worker's sessions, least recently used first out, kept within its memory budget; evicting
gives their device memory back at once (docs/EXECUTION.md "GPU memory")."""

from __future__ import annotations

import functools
import gc
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

import torch

from backend.harness.memory import gib

if TYPE_CHECKING:
    from backend.harness.session import Session


class SessionTooLarge(Exception):
    """A session that cannot fit the worker's memory budget even alone: refused before it is built
    (the case is ERROR kind `oom`, naming both figures)."""

    def __init__(self, need: int, budget: int):
        super().__init__(
            f"out of memory budget: the session needs {gib(need)} (KV caches and their snapshot), "
            f"the worker's budget is {gib(budget)} (--gpu-memory-utilization x its share of the device)"
        )
        self.need, self.budget = need, budget


class SessionCache:
    """Per process: sessions keyed by (backend, model shape, tp, rank, kv dtype, capture sizes,
    device), least recently used first out, kept by their measured bytes against the worker's
    memory `budget` (bytes; None: no budget, e.g. host memory) and at most `capacity` of them.

    The capacity should cover the groups a worker alternates between (backends x kv dtypes of a
    matrix), or it rebuilds sessions all run long. The budget is what keeps a worker inside its
    share of the device: cached sessions (KV caches plus graph pools) otherwise grow until the
    backends' cases fail out of memory. Evicting frees a session's graph pool and the allocator's
    cached blocks at once (_release), checked with torch.cuda.memory_reserved."""

    def __init__(self, capacity: int = 8, budget: int | None = None):
        self.capacity = capacity
        self.budget = budget
        self._sessions: OrderedDict[Hashable, Session] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.last_release: tuple[int, int] | None = None  # (bytes expected freed, bytes memory_reserved fell)
        # The most one case allocated above what the worker held when it started (its transient:
        # step inputs, the snapshot, the reference, a provider's temporaries), learned case by case:
        # the budget keeps that much free beside the sessions (note_transient).
        self.transient = 0
        # The process's other caches (step inputs, references): their bytes, and how to drop them
        # when nothing else is left to evict (set by the checker: session.py cannot import them).
        self.others: tuple[Callable[[], int], Callable[[], None]] = (lambda: 0, lambda: None)
        # What the next case was measured to need in an earlier run (bytes; 0: not known), set by
        # the worker before the case (expect) and used by its get(): the transient learned so far
        # is a smaller case's until this worker has run a case like it.
        self.expected = 0
        # What the process has allocated on the device (bytes; None: the allocator's own figure on
        # a CUDA device, nothing elsewhere). Set by tests: a CPU has no allocator to ask.
        self.allocated: Callable[[], int] | None = None

    def expect(self, need: int) -> None:
        """The next get() makes room for a case recorded as needing `need` bytes (its session and
        what it allocated above it). Several workers per GPU: a worker's first decode_200 after
        small cases otherwise ran out of its share mid-case beside sessions it still cached (the
        H100's torch slice: 2 of 280 cases at 2 per GPU, 14 at 4), and each out-of-memory cost a
        recycled worker and a rerun on a whole GPU."""
        self.expected = max(0, int(need))

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._sessions

    def held_bytes(self) -> int:
        return sum(s.memory_total() for s in self._sessions.values())

    def get(self, key: Hashable, factory, device: torch.device | None = None, estimate: int = 0) -> Session:
        """The session for `key`, built by factory() on a miss, after making room for `estimate`
        bytes (estimate_bytes) within the budget; raises SessionTooLarge when that alone is over
        the budget. `device`: the session's device (a CUDA one also checks free device memory,
        which other processes on the device share)."""
        cuda = device if device is not None and torch.device(device).type == "cuda" else None
        expected, self.expected = self.expected, 0
        if key in self._sessions:
            self._sessions.move_to_end(key)
            self.hits += 1
            # Room for the case's transient beside the others: the learned one, or what the case
            # was recorded to need above its session when that is more.
            extra = max(0, expected - self._sessions[key].memory_total() - self.transient)
            self._make_room(extra, cuda, keep=key)
            return self._sessions[key]
        self.misses += 1
        if self.budget is not None and estimate > self.budget:
            raise SessionTooLarge(estimate, self.budget)
        self._make_room(max(estimate, expected - self.transient), cuda)
        before = torch.cuda.memory_allocated(cuda) if cuda is not None else 0
        session = factory()
        if cuda is not None:
            session.built_bytes = torch.cuda.memory_allocated(cuda) - before
        self._sessions[key] = session
        if len(self._sessions) > self.capacity:
            while len(self._sessions) > self.capacity:
                self._evict()
            self._release(cuda)
        return session

    def note_transient(self, nbytes: int) -> None:
        self.transient = max(self.transient, int(nbytes))

    def _untracked(self, device: torch.device | None) -> int:
        """Bytes the process holds beyond its sessions and step caches: the step's snapshot of the
        caches (one per process), the sessions' eager sides and graph sides, the allocator's
        workspaces. Counted as they are now: the H100's torch slice at 2 per GPU ran out of a
        worker's share 2 times in 280 cases (6 in the families' 535) with these 5-10 GiB beside
        sessions the budget counted as fitting."""
        measure = self.allocated
        if measure is None:
            if device is None:
                return 0
            measure = functools.partial(torch.cuda.memory_allocated, device)
        return max(0, measure() - self.held_bytes() - self.others[0]())

    def _over(self, need: int, device: torch.device | None, untracked: int = 0) -> bool:
        if (
            self.budget is not None
            and self.held_bytes() + self.others[0]() + untracked + need + self.transient > self.budget
        ):
            return True
        # Free memory of the device: on a shared device (several workers per GPU, another job) the
        # budget alone does not say that the bytes are there.
        return device is not None and need > 0 and torch.cuda.mem_get_info(device)[0] + _reclaimable(device) < need

    def _make_room(self, need: int, device: torch.device | None, keep: Hashable | None = None) -> None:
        """Evict least recently used sessions (never `keep`) until `need` bytes and the learned
        transient fit beside what is kept; then, if still over, drop the process's other caches."""
        evicted = False
        # Measured once: what an evicted session frees shows in the allocator only after _release.
        untracked = self._untracked(device) if self.budget is not None else 0
        while any(k != keep for k in self._sessions) and self._over(need, device, untracked):
            self._evict(keep)
            evicted = True
        if self.budget is not None and self._over(need, device, untracked) and self.others[0]():
            self.others[1]()
            evicted = True
        if evicted:
            self._release(device)

    def _evict(self, keep: Hashable | None = None) -> None:
        oldest = next(k for k in self._sessions if k != keep)
        del self._sessions[oldest]
        self.evictions += 1

    def _release(self, device: torch.device | None) -> None:
        if device is None:
            return
        reserved = torch.cuda.memory_reserved(device)
        _release(device)
        self.last_release = (reserved, reserved - torch.cuda.memory_reserved(device))
        # The worker's log (its stdout): what eviction gave back, against what the cache still holds.
        print(
            f"[orch] sessions evicted ({self.evictions} so far): memory_reserved {gib(reserved)} -> "
            f"{gib(reserved - self.last_release[1])}, {len(self)} kept holding {gib(self.held_bytes())}",
            flush=True,
        )

    def drop(self, key: Hashable) -> None:
        """Forget a session whose state is suspect (an error mid-case)."""
        self._sessions.pop(key, None)

    def clear(self) -> None:
        self._sessions.clear()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            _release(torch.device("cuda"))


def _release(device: torch.device | None) -> None:
    """Free the device memory dropped sessions held (`device` a CUDA device; None: nothing to do).
    A session is a reference cycle (its graphs' captured callables close over it), so dropping the
    last reference frees nothing until the cyclic collector runs, which CPython does rarely for
    its oldest generation when many objects live long."""
    if device is None:  # host memory: the collector's own pace is enough (a full collection per
        return  # eviction is paid by every CPU case that builds a session)
    gc.collect()
    torch.cuda.empty_cache()


def _reclaimable(device: torch.device) -> int:
    """Memory the caching allocator holds but does not use (free for a new session)."""
    return torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
