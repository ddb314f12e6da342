"""Memory that moves between capture and replay. A graph reading memory it does not own
(a device tensor a per-call cache evicted: ROCm/aiter#5193) and a kernel leaving rows of its output
unwritten were green: orch replayed right after capturing, and the CPU emulation kept every
captured tensor alive. Now the emulation poisons memory nothing kept alive and names where it was
allocated, and the checker fills the static outputs with NaN before every replay (a GPU also
churns and poisons the allocator's free blocks: backend/harness/churn.py)."""

from __future__ import annotations

import functools

import pytest
import torch

from backend.graphs import make_graph_runner
from backend.harness.checker import SessionCache, run_case
from backend.result import Status
from tests.checker.conftest import CPU, DECODE, DEVICES, MIXED, make_case

# On a GPU the same verdicts come from real graphs, the churn and the poisoned free blocks instead
# of the emulation's model.
MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
# Where a FULL graph replays: FULL for every batch, the split modes for decode batches only.
FULL_GRAPH = {("decode", m) for m in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")} | {("mixed", "FULL")}


@pytest.fixture(scope="module")
def own_sessions() -> SessionCache:
    return SessionCache(capacity=8)  # the mutants' cases in this order only, not the suite's


# (backend, batch, mode) -> (status, failing check)
def _lru_expected(backend: str, kind: str, mode: str):
    return (Status.FAIL, "replay") if backend == "Backend" and (kind, mode) in FULL_GRAPH else (Status.PASS, None)


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize("backend", ["Backend", "Fixed"])
@pytest.mark.parametrize("batch", [DECODE, MIXED], ids=["decode", "mixed"])
def test_a_scratch_kept_in_an_lru_cache_is_red_where_a_graph_holds_it_and_the_fix_is_green(
    backend, batch, device, own_sessions
):
    for mode in MODES:
        r = run_case(
            make_case(f"tests.mutants.lru_scratch:{backend}", mode, "auto", batch), device=device, sessions=own_sessions
        )
        status, check = _lru_expected(backend, batch.kind, mode)
        assert r.status == status, (mode, r.reason)
        if check:
            # red from the first replay, whatever ran before in the session (NONE and PIECEWISE
            # first here): on a GPU the churn evicts the entry and the poison reaches its block on
            # the capture stream, which the warm-up allocated it from (churn.poison_free_memory
            # takes every stream's free blocks); on the CPU the emulation evicts and poisons it
            assert r.reason.startswith(f"{check} check failed at step 0"), (mode, r.reason)
        if check and device.type == "cpu":
            # the read is named where the cached tensor was allocated (the warm-up's cache miss)
            assert "reads memory nothing kept alive after the capture: a [" in r.reason
            assert "allocated at lru_scratch.py:" in r.reason and "(in the warm-up before the capture)" in r.reason
            assert "held only by the lru_cache of _row_scale: evicted" in r.reason


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize("batch", [DECODE, MIXED], ids=["decode", "mixed"])
def test_real_rows_a_kernel_leaves_unwritten_read_nan_at_every_replay(batch, device, own_sessions):
    """The mutant's graphs write decode rows only: a FULL mixed graph's prefill rows keep what the
    static output held, which is finite (and was right wherever a replay of the same batch wrote
    it); NaN since the checker poisons the real rows before each replay, so `finite` sees them."""
    for mode in MODES:
        r = run_case(
            make_case("tests.mutants.rows_unwritten:Backend", mode, "auto", batch), device=device, sessions=own_sessions
        )
        if (batch.kind, mode) == ("mixed", "FULL"):
            assert r.status == Status.FAIL, (mode, r.reason)
            finite = next(c for c in r.checks if c.name == "finite")
            assert not finite.passed and finite.step == 0 and finite.detail.endswith("graph"), finite.summary()
        else:
            assert r.status == Status.PASS, (mode, r.reason)


@functools.lru_cache(maxsize=4)
def _cached(n: int) -> torch.Tensor:
    return torch.full((n,), 2.0, device=CPU)  # a torch.device: device memory under the emulation


@functools.cache
def _cached_forever(n: int) -> torch.Tensor:
    return torch.full((n,), 2.0, device=CPU)


# What a graph reads -> what happens to it after the capture
READS = {
    "a buffer its owner keeps": "kept",
    "a bounded lru_cache's entry (a busy engine evicts it)": "evicted",
    "an unbounded cache's entry (nothing evicts it)": "forever",
    "a tensor dropped after the capture": "dropped",
}


@pytest.mark.parametrize("name", READS)
def test_the_emulation_poisons_what_nothing_keeps_alive_and_names_its_allocation(name):
    how = READS[name]
    runner = make_graph_runner("cpu")
    x = torch.arange(4.0)
    state = {"buf": torch.full((4,), 2.0)}

    _cached.cache_clear(), _cached_forever.cache_clear()

    def fn():
        scale = {"evicted": _cached, "forever": _cached_forever}.get(how, lambda n: state["buf"])(4)
        return x * scale

    runner.warmup(fn, 1)
    graph = runner.capture(fn)
    if how == "dropped":
        state.clear()
    out = graph.replay()
    if how in ("kept", "forever"):
        assert torch.equal(out, x * 2) and graph.freed_reads == ()
    else:
        assert torch.isnan(out).all(), out  # the poison pattern: NaN as float32
        (note,) = graph.freed_reads
        assert note.startswith("reads memory nothing kept alive after the capture: a [4] float32 tensor")
        site = "allocated at test_memory_moves.py:" if how == "evicted" else "read at test_memory_moves.py:"
        assert site in note, note


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the allocator's free blocks: CUDA only")
def test_free_device_memory_holds_the_poison_pattern_after_poison_free_memory():
    from backend.graphs.freed import POISON_WORD
    from backend.harness.churn import poison_free_memory

    dev = torch.device("cuda", 0)
    t = torch.ones(3000, dtype=torch.float32, device=dev)
    del t  # a free block of the caching allocator now
    assert poison_free_memory(dev) > 0
    again = torch.empty(3000, dtype=torch.float32, device=dev)  # the same block, best fit
    assert torch.isnan(again).all()
    assert int(again.view(torch.int16)[0]) == POISON_WORD


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the allocator's free blocks: CUDA only")
def test_a_block_freed_on_the_capture_stream_holds_the_poison_too():
    """What a warm-up allocated (on the runner's capture stream) and a cache evicted later is a
    free block of that stream, which the current stream is never given: poisoned all the same."""
    from backend.harness.churn import poison_free_memory

    dev = torch.device("cuda", 0)
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        t = torch.ones(5000, dtype=torch.float32, device=dev)
        del t  # a free block of the side stream: the current stream is never given it
    torch.cuda.synchronize(dev)
    poison_free_memory(dev)
    torch.cuda.synchronize(dev)
    with torch.cuda.stream(side):
        again = torch.empty(5000, dtype=torch.float32, device=dev)  # a free block of the side stream
    torch.cuda.synchronize(dev)
    assert torch.isnan(again).all()  # every free block of every stream holds the poison
