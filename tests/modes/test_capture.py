"""The capture procedure as vLLM does it (DESIGN.md §4a), each rule pinned to its source:

- dummy batch: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._dummy_run (V1) and
  vllm/v1/worker/gpu/cudagraph_utils.py CudaGraphManager.capture_graph / prepare_inputs_to_capture
  (V2): mixed graphs host max_query_len = N over min(N, max_num_seqs) requests; uniform-decode
  graphs min(cdiv(N, q), max_num_seqs) requests of q with max_query_len = q.
- seq_lens: V1 max_model_len; V2 device seq_lens = query len, host max_seq_len = max_model_len,
  block-table rows on the null block.
- sizes: vllm/config/vllm.py _set_cudagraph_sizes (min(2 * max_num_seqs * q, 512) capped at
  max_num_batched_tokens; adjust_cudagraph_sizes_for_spec_decode rounds up to multiples of q).
- one eager warm-up before each capture (cudagraph_num_of_warmups = 1; V2 warms up in NONE mode).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from backend.attention.builder import PersistentMetadataBuilder
from backend.attention.interface import AttentionConfig
from backend.attention.registry import get_backend
from backend.harness.checker import SessionCache, run_case
from backend.harness.modes import vllm_capture_sizes
from backend.harness.session import GraphKey, Session
from backend.result import Status
from tests.checker.conftest import DECODE, MIXED, TINY, make_case


def config(max_num_seqs: int = 8, max_model_len: int = 64) -> AttentionConfig:
    return AttentionConfig(
        num_heads=2,
        num_kv_heads=1,
        head_size=8,
        block_size=16,
        num_blocks=max_num_seqs * 4 + 1,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_tokens=512,
        dtype=torch.float32,
        kv_cache_dtype="auto",
        device=torch.device("cpu"),
        scale=8**-0.5,
    )


# (style, num_tokens, uniform q or 0) -> (query_lens, device seq_lens, host max_query_len, host max_seq_len)
# with max_num_seqs 8, max_model_len 64.
DUMMY = {
    # mixed graph of 4 tokens: 4 requests of 1, but host max_query_len = 4 (the #22721 value)
    ("v1", 4, 0): ([1] * 4, [64] * 4, 4, 64),
    ("v2", 4, 0): ([1] * 4, [1] * 4, 4, 64),
    # mixed graph above max_num_seqs: 20 tokens over 8 requests, the last takes the remainder
    ("v1", 20, 0): ([2] * 7 + [6], [64] * 8, 20, 64),
    ("v2", 20, 0): ([2] * 7 + [6], [2] * 7 + [6], 20, 64),
    ("v1", 1, 0): ([1], [64], 1, 64),
    # uniform decode q = 1: N requests of 1
    ("v1", 4, 1): ([1] * 4, [64] * 4, 1, 64),
    ("v2", 4, 1): ([1] * 4, [1] * 4, 1, 64),
    # uniform decode q = 1 + k = 3 (k = 2): 12 tokens -> 4 requests of 3
    ("v1", 12, 3): ([3] * 4, [64] * 4, 3, 64),
    ("v2", 12, 3): ([3] * 4, [3] * 4, 3, 64),
    ("v2", 24, 3): ([3] * 8, [3] * 8, 3, 64),
}


@pytest.mark.parametrize("key", DUMMY, ids=lambda k: f"{k[0]}-N{k[1]}-q{k[2]}")
def test_capture_dummy_batch(key):
    style, n, q = key
    builder = PersistentMetadataBuilder(config())
    md = builder.build_for_capture(n, q, style)
    qlens, seqs, host_q, host_s = DUMMY[key]
    assert md.for_capture and md.num_padded_tokens == n and md.num_reqs == len(qlens)
    assert md.query_lens.tolist() == qlens and md.seq_lens.tolist() == seqs
    assert (md.max_query_len, md.max_seq_len) == (host_q, host_s)
    assert (md.slot_mapping == -1).all(), "capture writes nothing"
    if style == "v2":
        assert (md.block_table == 0).all(), "V2: dummy block-table rows on the null block"
    else:
        assert (md.block_table >= 1).all()


def test_unknown_capture_style_is_refused():
    with pytest.raises(ValueError, match="capture style 'v3'"):
        PersistentMetadataBuilder(config()).build_for_capture(4, 0, "v3")
    with pytest.raises(ValueError, match="capture_style 'v3'"):
        dataclasses.replace(TINY, capture_style="v3")


# (max_num_seqs, max_num_batched_tokens, k) -> sizes (vllm/config/vllm.py _set_cudagraph_sizes)
SIZES = {
    (4, 8192, 0): (1, 2, 4, 8),  # 2 * 4 = 8
    (12, 8192, 0): (1, 2, 4, 8, 16, 24),
    (256, 8192, 0): (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)),  # capped at 512
    (256, 100, 0): (1, 2, 4, *range(8, 97, 8), 100),  # capped at, and appended, the token budget
    # k widens the grid (max = 2 * max_num_seqs * (1 + k)); the rounding to multiples of 1 + k is
    # resolution's (resolve_capture_sizes), not the configured sizes'
    (4, 8192, 1): (1, 2, 4, 8, 16),  # max = 2 * 4 * 2 = 16
    (4, 8192, 2): (1, 2, 4, 8, 16, 24),  # max 24
    (256, 8192, 2): (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)),  # 1536 capped at 512
}


@pytest.mark.parametrize("key", SIZES, ids=lambda k: f"seqs{k[0]}-tok{k[1]}-k{k[2]}")
def test_default_capture_sizes(key):
    assert vllm_capture_sizes(*key) == SIZES[key]


class _CountingRunner:
    """Wraps the emulated runner to see what the session does around each capture."""

    def __init__(self, inner):
        self.inner, self.kind, self.warmups = inner, inner.kind, []

    def warmup(self, fn, iters):
        self.warmups.append(iters)
        return self.inner.warmup(fn, iters)

    def capture(self, fn):
        return self.inner.capture(fn)


def test_one_eager_warmup_precedes_each_capture():
    from backend.graphs import make_graph_runner

    runner = None

    def factory(device):
        nonlocal runner
        runner = _CountingRunner(make_graph_runner(device))
        return runner

    s = Session(get_backend("torch"), TINY, 1, 0, "auto", (1, 2, 4, 8), torch.device("cpu"), runner_factory=factory)
    s.ensure_graphs({GraphKey("FULL", 8, False), GraphKey("FULL", 4, True)})
    assert runner.warmups == [1, 1]


@pytest.fixture(scope="module")
def sessions() -> SessionCache:
    return SessionCache(capacity=16)


# The seed bug (#22721) reproduced under each runner generation's capture, and its fix (#25104).
SEED = {
    # (style, backend, mode, batch) -> status
    ("v1", "Backend", "FULL", "mixed"): Status.FAIL,
    ("v2", "Backend", "FULL", "mixed"): Status.FAIL,
    # FULL replays decode through mixed graphs, captured on the prefill branch, whose decode kernel
    # reads live buffers: right, as vLLM 0.10.2's is (docs/VLLM.md "Where the model differed").
    ("v2", "Backend", "FULL", "decode"): Status.PASS,
    ("v2", "Backend", "FULL_AND_PIECEWISE", "mixed"): Status.PASS,
    ("v2", "Backend", "FULL_AND_PIECEWISE", "decode"): Status.PASS,  # decode branch, persistent buffers
    ("v1", "FixedBackend", "FULL", "mixed"): Status.PASS,
    ("v2", "FixedBackend", "FULL", "mixed"): Status.PASS,
    ("v2", "FixedBackend", "FULL", "decode"): Status.PASS,
}


@pytest.mark.parametrize("key", SEED, ids=lambda k: "-".join(k))
def test_seed_red_in_full_mixed_graphs_green_after_25104(key, sessions):
    style, cls, mode, kind = key
    model = dataclasses.replace(TINY, capture_style=style)
    r = run_case(
        make_case(
            f"tests.mutants.seed_aiter_fa:{cls}", mode, "auto", MIXED if kind == "mixed" else DECODE, model=model
        ),
        sessions=sessions,
    )
    assert r.status == SEED[key], r.reason
    if r.status == Status.FAIL:
        assert r.reason.startswith("replay check failed")
    if cls == "FixedBackend" and mode == "FULL":
        assert r.resolved_mode == "FULL_AND_PIECEWISE" and r.downgraded


def test_a_full_graph_keeps_its_capture_metadata_alive():
    # A real graph reads the capture batch's tensors at their addresses. Freed after capture, the
    # seed's per-step cu_seq_lens block went to the step's fresh copy, and the seed passed FULL
    # mixed batches on an H100 (backend/graphs/cuda.py). The session must hold the metadata as
    # long as the graph (both builds of it: the one the capture was handed and the last one, which
    # a backend reading a forward context reads); the emulation now reads freed memory as poison,
    # but this holds the session to it directly.
    import gc
    import weakref

    s = Session(
        get_backend("tests.mutants.seed_aiter_fa:Backend"), TINY, 1, 0, "auto", (1, 2, 4, 8), torch.device("cpu")
    )
    key = GraphKey("FULL", 8, False)
    s.ensure_graphs({key})
    first, last = s.graphs[key].capture_metadata
    assert all(md.for_capture and md.max_query_len == 8 for md in (first, last))
    assert first.cu_seq_lens is not None and last.cu_seq_lens is not None  # the seed's fresh tensors
    held = [weakref.ref(md.cu_seq_lens) for md in (first, last)]
    del first, last
    gc.collect()
    assert all(h() is not None for h in held)
    s.graphs.clear()
    gc.collect()
    assert all(h() is None for h in held)  # held by the graph entry, nothing else
