"""The caching allocator's blocks outside graph pools, read from torch.cuda.memory_snapshot().

A captured graph's kernels hold raw addresses. Outside its own pool a graph can read only memory
that existed when it was captured: what was allocated then (the session's buffers, a backend's
per-call cache filled in the warm-up) or, already a bug at capture, what was free then. The first
kind is what freed-memory poisoning (backend/harness/churn.py) has to cover: `live_ranges` at capture,
intersected with the free blocks at a replay, is the memory freed since that the graph may still
read. Poisoning every free block instead filled the worker's whole cache of freed temporaries
(tens of GB on an H100) before every replay.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

Range = tuple[int, int]  # [start, end) addresses


@dataclass(frozen=True)
class Segment:
    """One segment of the caching allocator outside graph pools (for an expandable segment, one
    mapped range of it): its stream, and its free blocks as address ranges."""

    stream: int
    address: int
    size: int
    free: tuple[Range, ...]


def _outside_pools(device: torch.device) -> list[dict]:
    index = device.index
    return [
        seg
        for seg in torch.cuda.memory_snapshot()
        if seg.get("device") == index and tuple(seg.get("segment_pool_id", (0, 0))) == (0, 0)
    ]


def _blocks(seg: dict) -> list[tuple[int, int, bool]]:
    """(start, end, free) of each block of a snapshot segment. A plain loop over the snapshot's
    dicts, no object per block: it runs before every replay and capture, over thousands of them."""
    out = []
    address = int(seg.get("address", 0))
    for block in seg.get("blocks", ()):
        address = block.get("address", address)
        end = address + block["size"]
        out.append((address, end, block.get("state") == "inactive"))
        address = end
    return out


def segments(device: torch.device) -> list[Segment]:
    """`device`'s segments outside graph pools (a graph's private pool is its own), with their free
    blocks."""
    out = []
    for seg in _outside_pools(device):
        blocks = _blocks(seg)
        start = int(seg.get("address", 0))
        end = blocks[-1][1] if blocks else start
        out.append(
            Segment(int(seg.get("stream", 0)), start, end - start, tuple((a, b) for a, b, free in blocks if free))
        )
    return out


def merge(ranges: Sequence[Range]) -> tuple[Range, ...]:
    """Sorted, disjoint, adjacent ranges joined."""
    out: list[list[int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return tuple((s, e) for s, e in out)


def live_ranges(device: torch.device) -> tuple[Range, ...]:
    """The address ranges allocated now outside graph pools on `device` (merged)."""
    return merge([(a, b) for seg in _outside_pools(device) for a, b, free in _blocks(seg) if not free])


def overlap(start: int, end: int, ranges: Sequence[Range]) -> list[Range]:
    """The parts of [start, end) inside `ranges` (sorted, disjoint)."""
    i = max(0, bisect.bisect_right(ranges, (start, float("inf"))) - 1)
    parts = []
    for lo, hi in ranges[i:]:
        if lo >= end:
            break
        a, b = max(lo, start), min(hi, end)
        if a < b:
            parts.append((a, b))
    return parts
