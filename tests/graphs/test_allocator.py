"""Freed-memory poisoning aimed at what a graph may read (backend/graphs/allocator.py): the ranges
allocated when the graph was captured, free at its replay. The range arithmetic on every machine;
the allocator and a real graph on a GPU."""

from __future__ import annotations

import pytest
import torch

from backend.graphs.allocator import merge, overlap


@pytest.mark.parametrize(
    ("ranges", "merged"),
    [
        ([], ()),
        ([(10, 20)], ((10, 20),)),
        ([(15, 30), (10, 20)], ((10, 30),)),  # unsorted, overlapping
        ([(10, 20), (20, 25)], ((10, 25),)),  # adjacent blocks: one range
        ([(10, 20), (21, 25)], ((10, 20), (21, 25))),
        ([(5, 5), (7, 9)], ((7, 9),)),  # empty ranges dropped
        ([(0, 100), (10, 20)], ((0, 100),)),  # contained
    ],
)
def test_merge(ranges, merged):
    assert merge(ranges) == merged


RANGES = ((10, 30), (40, 60))


@pytest.mark.parametrize(
    ("start", "end", "parts"),
    [
        (0, 100, [(10, 30), (40, 60)]),
        (25, 45, [(25, 30), (40, 45)]),
        (30, 40, []),  # the gap between two ranges
        (60, 70, []),  # right after the last
        (0, 10, []),  # right before the first
        (12, 13, [(12, 13)]),
        (45, 46, [(45, 46)]),  # inside the second range
    ],
)
def test_overlap(start, end, parts):
    assert overlap(start, end, RANGES) == parts


SNAPSHOT = [
    {
        "device": 0,
        "address": 1000,
        "stream": 7,
        "segment_pool_id": (0, 0),
        "blocks": [
            {"size": 100, "state": "active_allocated"},
            {"size": 50, "state": "inactive"},
            {"size": 30, "state": "active_pending_free"},  # not free yet: its stream uses are pending
            {"size": 20, "state": "inactive"},
        ],
    },
    {
        "device": 0,
        "address": 5000,
        "stream": 0,
        "segment_pool_id": (0, 0),
        "blocks": [
            {"address": 5000, "size": 64, "state": "inactive"},
            {"address": 5064, "size": 64, "state": "active_allocated"},
        ],
    },
    {
        "device": 0,
        "address": 9000,
        "stream": 0,
        "segment_pool_id": (1, 2),
        "blocks": [  # a graph's pool
            {"size": 10, "state": "inactive"},
        ],
    },
    {
        "device": 1,
        "address": 20000,
        "stream": 0,
        "segment_pool_id": (0, 0),
        "blocks": [  # another GPU
            {"size": 10, "state": "inactive"},
        ],
    },
]


def test_segments_and_live_ranges_read_the_snapshot(monkeypatch):
    """Block addresses follow from the segment's and the sizes before them when the snapshot has
    none; only `inactive` blocks are free; graph pools and other devices are left out."""
    from backend.graphs import allocator

    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: SNAPSHOT)
    dev = torch.device("cuda", 0)
    assert allocator.segments(dev) == [
        allocator.Segment(7, 1000, 200, ((1100, 1150), (1180, 1200))),
        allocator.Segment(0, 5000, 128, ((5000, 5064),)),
    ]
    assert allocator.live_ranges(dev) == ((1000, 1100), (1150, 1180), (5064, 5128))


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="the caching allocator: CUDA only")


@cuda
def test_only_the_free_memory_inside_the_reads_is_poisoned():
    from backend.graphs.allocator import live_ranges
    from backend.harness.churn import poison_free_memory

    dev = torch.device("cuda", torch.cuda.current_device())
    read = torch.full((3 << 18,), 1.0, device=dev)  # 3 MiB
    ptr = read.data_ptr()
    assert any(lo <= ptr < hi for lo, hi in live_ranges(dev)), "a live tensor is in the live ranges"
    del read
    other = torch.full((1 << 26,), 2.0, device=dev)  # 256 MiB, freed too: outside the reads
    del other
    filled = poison_free_memory(dev, ((ptr, ptr + (3 << 20)),))
    assert filled == 3 << 20  # the read range, freed: all of it, and nothing else
    assert poison_free_memory(dev, ()) == 0  # no reads: nothing filled
    assert poison_free_memory(dev) >= (3 << 20) + (1 << 28)  # unknown reads: every free block


@cuda
def test_a_graph_reading_a_tensor_freed_after_capture_replays_the_poison():
    """An lru-style cache entry filled in the warm-up, evicted after the capture (AITER's
    mla_decode_fwd indptr, ROCm/aiter#5193): the graph's reads name it, the poisoning reaches it."""
    from backend.graphs.cuda import CudaGraphRunner
    from backend.harness.churn import poison_free_memory

    dev = torch.device("cuda", torch.cuda.current_device())
    runner = CudaGraphRunner(dev)
    x = torch.arange(1024.0, device=dev)
    cache: dict[str, torch.Tensor] = {}

    def fn():
        if "scale" not in cache:
            cache["scale"] = torch.full((1024,), 2.0, device=dev)
        return x * cache["scale"]

    runner.warmup(fn, 1)
    graph = runner.capture(fn)
    assert graph.reads and any(lo <= cache["scale"].data_ptr() < hi for lo, hi in graph.reads)
    assert torch.equal(graph.replay(), x * 2)
    cache.clear()  # evicted: a free block the graph still reads
    noise = torch.randn(1 << 26, device=dev)  # 256 MiB of other free memory, outside the reads
    del noise
    assert poison_free_memory(dev, graph.reads) < 1 << 26  # not the other free memory
    assert torch.isnan(graph.replay()).all()
