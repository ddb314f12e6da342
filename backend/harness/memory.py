"""A worker's device memory: its budget, what a session holds, what a case used, and what an
out-of-memory error is (DESIGN.md §10; docs/EXECUTION.md "GPU memory").

The harness's own memory must never turn into a verdict on the backend under test. So a worker
works to a budget (vLLM's `gpu_memory_utilization` of its share of the device), enforced by the
caching allocator itself (`torch.cuda.set_per_process_memory_fraction`: past it an allocation
raises OutOfMemoryError, as a smaller card would); the SessionCache keeps sessions by their
measured bytes against it (backend/harness/session.py); and a case that still runs out of memory
is rerun once on a cleared worker, then reported as ERROR kind `oom` (checker.run_case), which
the gate counts as infrastructure.

Bytes, not GiB, cross every boundary (CaseResult.memory, the store, plan); GiB only in text.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GiB = 1024**3
DEFAULT_UTILIZATION = 0.9
OOM_KIND = "oom"  # CaseResult.error_kind of a case that ran out of memory when alone


@dataclass(frozen=True)
class MemoryBudget:
    """What one worker may use of its device: `utilization` x `share` x the device's memory.

    share: the fraction of the device this worker holds (1 / workers per GPU; a tp > 1 rank holds
    a whole device). device_bytes: the device's size as the run sees it (None: the real one; set
    to emulate a smaller card, e.g. 24 GiB on an 80 GiB H100)."""

    utilization: float = DEFAULT_UTILIZATION
    share: float = 1.0
    device_bytes: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.utilization <= 1.0:
            raise ValueError(f"gpu memory utilization must be in (0, 1], got {self.utilization}")
        if not 0.0 < self.share <= 1.0:
            raise ValueError(f"a worker's share of its device must be in (0, 1], got {self.share}")

    def budget_bytes(self, total_bytes: int) -> int:
        size = min(self.device_bytes, total_bytes) if self.device_bytes else total_bytes
        return int(size * self.share * self.utilization)

    def to_dict(self) -> dict:
        return {"utilization": self.utilization, "share": self.share, "device_bytes": self.device_bytes}

    @classmethod
    def from_dict(cls, d: dict | None) -> MemoryBudget:
        return cls(**(d or {}))


def device_total(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).total_memory


def apply_budget(budget: MemoryBudget, device: torch.device | str) -> int | None:
    """Cap this process's allocator on `device` at the budget; returns it in bytes (None off a GPU:
    host memory is not budgeted). Several workers on one device each cap themselves (Ray's
    fractional GPUs enforce nothing about memory, DESIGN.md §10)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    total = device_total(device)
    limit = budget.budget_bytes(total)
    torch.cuda.set_per_process_memory_fraction(limit / total, device)
    return limit


def expandable_segments() -> str:
    """Turn on the caching allocator's expandable segments for this process (before its first CUDA
    allocation), unless PYTORCH_CUDA_ALLOC_CONF says otherwise; returns what was done.

    A worker's sessions come and go (KV caches of GBs, graph pools), and a freed block of the
    classic allocator is split for later small tensors that then pin the whole segment: on an H100
    the families' tp 1 slice ran out of memory with 58 GiB "reserved but unallocated" and 13 GiB in
    use, which no empty_cache could give back. Expandable segments map and unmap by
    pages. Set through the API, not the environment: torch, which Ray's workers preload, has read
    PYTORCH_CUDA_ALLOC_CONF before an actor can set it."""
    import os

    if "PYTORCH_CUDA_ALLOC_CONF" in os.environ:
        return f"PYTORCH_CUDA_ALLOC_CONF={os.environ['PYTORCH_CUDA_ALLOC_CONF']} (as given)"
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or getattr(
        torch._C, "_cuda_cudaCachingAllocator_set_allocator_settings", None
    )
    if setter is None:
        return "expandable segments unavailable in this torch"
    setter("expandable_segments:True")
    return "expandable_segments:True"


# What a worker may still hold once it has dropped every session and cache (weights cached per
# shape, cuBLAS workspaces): more than this after an out-of-memory means the process cannot give
# its memory back (a leaked graph pool, pinned segments), and only a fresh process is clean.
UNRELEASED_LIMIT = 2 * GiB


def unreleased(device: torch.device) -> int:
    """Bytes the allocator still holds on `device` (call after dropping everything; 0 off a GPU)."""
    device = torch.device(device)
    return torch.cuda.memory_reserved(device) if device.type == "cuda" else 0


def is_oom(e: BaseException | None) -> bool:
    """An out-of-memory error anywhere in the chain (a capture error wraps the allocator's)."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower():
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def tensors_bytes(*groups) -> int:
    """Bytes of the distinct storages among tensors (lists of them, or None): views counted once."""
    seen: dict[int, int] = {}
    for group in groups:
        for t in group or ():
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


_POOLS_NAMED: dict[int, bool] = {}


def pools_measurable(device: torch.device) -> bool:
    """Whether this torch's allocator snapshot names each segment's pool (pool_bytes answers);
    asked once per device index."""
    index = torch.device(device).index or 0
    if index not in _POOLS_NAMED:
        _POOLS_NAMED[index] = pool_bytes((), device) is not None
    return _POOLS_NAMED[index]


def pool_bytes(pools, device: torch.device) -> int | None:
    """Bytes the caching allocator holds in these graph memory pools (segments by pool id), or None
    where the snapshot does not say (an older torch)."""
    wanted = {tuple(p) for p in pools}
    try:
        segments = torch.cuda.memory_snapshot()
    except Exception:  # noqa: BLE001 - a diagnostics API whose form moved between releases
        return None
    index = torch.device(device).index
    total = 0
    for seg in segments:
        pool = seg.get("segment_pool_id")
        if pool is None:
            return None
        if tuple(pool) in wanted and (index is None or seg.get("device", index) == index):
            total += int(seg.get("total_size", 0))
    return total


class CaseMemory:
    """A case's device memory: the allocator's peaks over the case, what the worker held when it
    started, and (filled by the checker) its session's bytes. On a CPU device nothing is measured
    but the session (host memory is not the harness's scarce resource)."""

    def __init__(self, device: torch.device, budget: int | None):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.budget = budget
        self.start_allocated = self.start_reserved = 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_allocated = torch.cuda.memory_allocated(self.device)
            self.start_reserved = torch.cuda.memory_reserved(self.device)

    def figures(self, session_bytes: dict[str, int] | None, built_here: bool) -> dict[str, int]:
        """CaseResult.memory. `needs`: what the case needs alone (its session, plus what the case
        allocated above what the worker held when it started; a session built by this case is
        counted once): what `orch plan` and `--workers-per-gpu auto` size workers by."""
        out: dict[str, int] = {}
        session = sum(session_bytes.values()) if session_bytes else 0
        if session_bytes:
            out.update({f"session_{k}": int(v) for k, v in session_bytes.items()})
            out["session"] = int(session)
        if self.cuda:
            peak_alloc = torch.cuda.max_memory_allocated(self.device)
            out.update(
                peak_allocated=int(peak_alloc),
                peak_reserved=int(torch.cuda.max_memory_reserved(self.device)),
                worker_reserved_at_start=int(self.start_reserved),
                worker_allocated_at_start=int(self.start_allocated),
            )
            above = max(0, peak_alloc - self.start_allocated - (session if built_here else 0))
            out["needs"] = int(session + above)
        if self.budget:
            out["budget"] = int(self.budget)
        return out


def gib(n: int | float | None) -> str:
    return "?" if n is None else f"{n / GiB:.2f} GiB"
