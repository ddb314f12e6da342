"""A graph session: one rank's model, KV caches, metadata builder, graph runner and the graphs
captured so far, reused by every case with the same key (cases differ in batch and seed).

Capture follows vLLM: for each needed (runtime mode, size, uniform decode) key, warm up eagerly,
then capture, largest first into the runner's one pool (modes.capture_plan order). Only the sizes
a case's steps dispatch to are captured, and they stay for later cases, which may add others
(vLLM captures all up front; each graph's frozen host values are the same either way).

FULL: the whole forward on static_in[:N] with build_for_capture metadata (vLLM's dummy batch for
the key: DESIGN.md §4a, ModelShape.capture_style v1 | v2) in the builder's
persistent buffers; a replay rewrites those buffers with build(batch, N, capture reqs).
PIECEWISE: num_layers + 1 dense pieces per size, chained on each other's output objects and on
static attention buffers; attention runs eagerly between replays with unpadded metadata.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from backend.attention import padding
from backend.attention.interface import AttentionConfig, BatchDescription
from backend.attention.kv_cache import allocate_kv_cache
from backend.case import ModelShape
from backend.families.contract import family as family_of
from backend.families.contract import layer_metadata
from backend.graphs.allocator import merge
from backend.graphs.base import GraphCaptureError, GraphRunner
from backend.graphs.provenance import host_scope
from backend.harness.lru import LRU
from backend.harness.memory import pool_bytes, pools_measurable, tensors_bytes
from backend.harness.model import TPLayout, TPModel, make_weights
from backend.host_copy import copy_into

__all__ = ["LRU", "CaptureFailed", "GraphKey", "Session", "StepOutput", "attention_config", "estimate_bytes"]

WARMUP_ITERS = 1
# Steps whose eager side a session keeps (a few MB each at GPU shapes): enough for every step of
# a few batches, as the dispatcher runs a group's cases back to back.
EAGER_MEMO_STEPS = 48


class CaptureFailed(Exception):
    """Wraps an error raised between capture begin and end (the runner's GraphCaptureError):
    error_kind "capture". Warm-up and the syncs around a capture are ordinary steps: a device fault
    there propagates as itself, so the worker is recycled instead of the next case blamed."""


@dataclass(frozen=True)
class GraphKey:
    runtime_mode: str  # "FULL" | "PIECEWISE"
    size: int
    uniform_decode: bool
    query_len: int = 1  # of every request of a uniform-decode graph: 1 + k (spec decode)


@dataclass
class _Full:
    graph: Any
    padded_reqs: int
    attention: list = field(default_factory=list)  # per layer: the attention result the graph refreshes
    # The capture batch's metadata, alive as long as the graph: a backend that builds a fresh
    # tensor per step (the seed's cu_seq_lens) must replay the capture-time one, as in a busy
    # engine. Dropped, the allocator would give its block to the step's fresh copy and a stale
    # replay could pass on a GPU (backend/graphs/cuda.py), where the emulation holds it anyway.
    capture_metadata: Any = None


@dataclass(frozen=True)
class StepOutput:
    """One run's model output [T, hidden] and its attention outputs [num_layers, T, Hl, D], copies."""

    out: torch.Tensor
    attention: torch.Tensor


@dataclass
class _Piecewise:
    graphs: list = field(default_factory=list)


def attention_config(
    shape: ModelShape, layout: TPLayout, kv_cache_dtype: str, capture_sizes, device, spec_tokens: int = 0
) -> AttentionConfig:
    fam = family_of(shape.attention)
    return AttentionConfig(
        num_heads=layout.local_heads,
        num_kv_heads=layout.local_kv_heads,
        head_size=shape.head_size,
        block_size=shape.block_size,
        num_blocks=shape.total_blocks,
        max_model_len=shape.max_model_len,
        max_num_seqs=shape.max_num_seqs,
        # eager batches can exceed the largest capture size; requests x length bounds them
        max_num_tokens=max(max(capture_sizes, default=1), shape.max_num_seqs * shape.max_model_len),
        dtype=getattr(torch, shape.dtype),
        kv_cache_dtype=kv_cache_dtype,
        device=torch.device(device),
        scale=fam.scale(shape),
        spec_tokens=spec_tokens,
        attention=shape.attention,
        dims=fam.config_dims(shape),
        max_capture_size=max(capture_sizes, default=0),
    )


class Session:
    def __init__(
        self,
        backend_cls,
        shape: ModelShape,
        tp: int,
        rank: int,
        kv_cache_dtype: str,
        capture_sizes: tuple[int, ...],
        device: torch.device,
        runner_factory=None,
        max_tokens: int = 0,
        spec_tokens: int = 0,
        cg_padding: tuple[int, int] | None = None,
    ):
        """max_tokens: the largest graph this session may capture, when above max(capture_sizes):
        a split-mode decode graph of min(cdiv(s, q), max_num_seqs) requests has requests * q
        tokens, up to q - 1 above the size s it came from (modes.decode_capture_sizes).
        spec_tokens: the case's k, for a backend with `sizes_by_spec_tokens` (else 0).
        cg_padding: the (seq_len, block-table) values padded requests get; None: what the builders
        declare (backend/attention/padding.py)."""
        self.backend_cls, self.shape, self.device = backend_cls, shape, torch.device(device)
        self.family = family_of(shape.attention)
        self.layout = TPLayout(tp, rank, shape.num_heads, shape.num_kv_heads, shape.head_size)
        self.config = attention_config(shape, self.layout, kv_cache_dtype, capture_sizes, self.device, spec_tokens)
        with host_scope(self.device):  # the CPU emulation: their host tensors are host memory
            self.builder = self.family.make_builder(backend_cls, self.config, shape)
            self.impl = backend_cls.impl_cls(self.config)
        self.cg_padding = cg_padding or padding.consolidated(self.builder)
        padding.apply(self.builder, self.cg_padding)
        own = getattr(backend_cls, "allocate_kv_cache", None)
        caches = self.family.allocate_caches(backend_cls, self.config, shape)  # layers of several kinds
        if caches is not None:
            pass  # the family's
        elif own is not None:  # a backend with its own layout (backend/adapters/vllm/), seen as ours
            caches = [own(self.config) for _ in range(shape.num_layers)]
        else:
            cache_shape = backend_cls.kv_cache_shape(
                self.config.num_blocks, shape.block_size, self.layout.local_kv_heads, shape.head_size
            )
            caches = [allocate_kv_cache(self.config, tuple(cache_shape)) for _ in range(shape.num_layers)]
        _fill_garbage(caches, self.family, self.config.dtype, shape)
        self.model = TPModel(
            shape, self.layout, self.impl, caches, self.device, all_reduce=getattr(backend_cls, "tp_all_reduce", None)
        )
        self.capture_sizes = tuple(capture_sizes)  # as resolved for the case's mode and k
        self.max_static = max(max(capture_sizes, default=1), max_tokens)
        dtype = self.model.dtype
        # Static buffers replays read: never rebound, values copied in [:n].
        self.static_in = torch.zeros(self.max_static, shape.hidden_size, dtype=dtype, device=self.device)
        self.static_attn = torch.zeros(
            shape.num_layers,
            self.max_static,
            self.layout.local_heads,
            self.family.out_head_size(shape),
            dtype=dtype,
            device=self.device,
        )
        self._runner_factory = runner_factory
        self._runner: GraphRunner | None = None
        self.graphs: dict[GraphKey, _Full | _Piecewise] = {}
        # The eager side of recent steps (sides.EagerStep), shared by the cudagraph modes of one
        # (batch, seed): keyed by (batch spec, seed, steps, tolerance, step index, gang), LRU-bounded;
        # each carries the graph sides of the modes that replayed the step (sides.GraphStep).
        self.eager_memo = LRU(EAGER_MEMO_STEPS)
        # Cases this session ran: one that comes again (the executor's retry on a one-worker
        # machine, a repeated repro) runs its graph side again instead of reusing one (a retry
        # exists to see a different outcome).
        self.cases_run: set[str] = set()
        # What making a graph wrote to the KV cache (scratch.capture_checked), by key: steps replaying it fail.
        self.capture_writes: dict[GraphKey, str] = {}
        self.replays = 0  # graph replays so far: each gets fresh padded input rows (sides.pad_seed)
        # Device bytes (backend/harness/memory.py): what building the session allocated (set by
        # SessionCache on a GPU) and what its graph pool holds (after each capture).
        self.built_bytes = 0
        self.graph_bytes = 0
        # The metadata of the last run (eager, replay or piecewise): a family's state check reads its
        # contract (backend/attention/gdn.py request_buffer_problems).
        self.last_metadata = None

    @property
    def runner(self):
        if self._runner is None:
            from backend.graphs import make_graph_runner

            self._runner = (self._runner_factory or make_graph_runner)(self.device)
        return self._runner

    @property
    def reference_weights(self) -> tuple:
        """The full fp32 weights on the session's device, for the reference forward (shared by
        every session of the process)."""
        return tuple(make_weights(self.shape, device=str(self.device)))

    @property
    def kv_caches(self) -> list[torch.Tensor]:
        return self.model.kv_caches

    # ---- capture ------------------------------------------------------------------------------
    def ensure_graphs(self, keys: set[GraphKey]) -> float:
        """Capture the missing keys; returns the seconds spent (0 if all were cached)."""
        missing = sorted(
            (k for k in keys if k not in self.graphs), key=lambda k: (k.uniform_decode, -k.size, k.runtime_mode)
        )
        if not missing:
            return 0.0
        t0 = time.perf_counter()
        reserved = 0
        if self.device.type == "cuda" and not pools_measurable(self.device):
            # A torch whose snapshot names no pool: the graphs' bytes are the growth of the reserved
            # memory, from an emptied cache (not cached blocks of the general pool). Where the pools
            # are named no cache is emptied: every step after it mapped its GBs of temporaries anew.
            torch.cuda.empty_cache()
            reserved = torch.cuda.memory_reserved(self.device)
        for key in missing:
            try:
                self.graphs[key] = (
                    self._capture_full(key) if key.runtime_mode == "FULL" else self._capture_piecewise(key)
                )
            except GraphCaptureError as e:
                raise CaptureFailed(f"{key.runtime_mode} size {key.size}: {type(e).__name__}: {e}") from e
        self._sync()
        self._measure_graphs(reserved)
        return time.perf_counter() - t0

    def _measure_graphs(self, reserved_before: int) -> None:
        """The graph pools' bytes: their segments in the allocator's snapshot, or what the captures
        grew the reserved memory by (a torch whose snapshot names no pool)."""
        if self.device.type != "cuda":
            return
        measured = pool_bytes(getattr(self._runner, "pools", ()), self.device)
        if measured is not None:
            self.graph_bytes = measured
        else:
            self.graph_bytes += max(0, torch.cuda.memory_reserved(self.device) - reserved_before)

    def memory_bytes(self) -> dict[str, int]:
        """What this session holds: its KV caches, the rest of what building it allocated (static
        buffers, the builder's persistent buffers, weights), its graph pool. On a CPU device the
        KV caches and static buffers by their sizes."""
        kv = tensors_bytes(self.kv_caches)
        if self.device.type == "cuda" and self.built_bytes:
            return {"kv": kv, "other": max(0, self.built_bytes - kv), "graphs": self.graph_bytes}
        return {"kv": kv, "other": tensors_bytes([self.static_in, self.static_attn]), "graphs": self.graph_bytes}

    def memory_total(self) -> int:
        """The bytes a budget counts for this session while it is kept (the step's snapshot of its
        caches is one scratch copy per process: counted in the estimate of the session that needs
        it, estimate_bytes)."""
        return sum(self.memory_bytes().values())

    def _capture_full(self, key: GraphKey) -> _Full:
        n = key.size
        # vLLM's dummy batch for this key (builder.build_for_capture): decode graphs with q per
        # request, mixed graphs with host max_query_len = n; seq_lens per the model's capture_style.
        q = key.query_len if key.uniform_decode else 0
        style = self.shape.capture_style
        with host_scope(self.device):
            md = self.builder.build_for_capture(n, q, style)
        x, attn = self.static_in[:n], self.static_attn[:, :n]
        results: list[torch.Tensor] = []

        def fn():
            results.clear()  # keep the attention results of the last call: the captured one
            return self.model.forward(x, md, attn, results)

        # One eager warm-up on the same dummy batch (vLLM: cudagraph_num_of_warmups = 1 in V1,
        # one NONE-mode forward before each capture in V2 CudaGraphManager.capture_graph).
        self.runner.warmup(fn, WARMUP_ITERS)
        with host_scope(self.device):
            again = self.builder.build_for_capture(n, q, style)  # the warm-up may not leave the buffers as captured
        # Both builds' metadata live with the graph: a backend may read the latest build's (a
        # forward context: customop_seed) rather than the argument's.
        return _Full(self.runner.capture(fn), md.num_padded_reqs, results, capture_metadata=(md, again))

    def _capture_piecewise(self, key: GraphKey) -> _Piecewise:
        n = key.size
        x = self.static_in[:n]
        attn = [self.static_attn[i, :n] for i in range(self.shape.num_layers)]
        entry = _Piecewise()
        prev_x = x
        for i in range(self.model.num_pieces):

            def fn(i=i, xin=prev_x):
                return self.model.piece(i, xin, attn[i - 1] if i > 0 else None)

            self.runner.warmup(fn, WARMUP_ITERS)
            graph = self.runner.capture(fn)
            entry.graphs.append(graph)
            if i < self.shape.num_layers:
                prev_x = graph.outputs[-1]  # (*attention inputs, x)
        return entry

    def unverifiable(self, keys) -> tuple[str, ...]:
        """What the CPU emulation could not follow in these keys' graphs (a kernel launched behind
        the dispatcher: backend/graphs/opaque.py); empty for real graphs."""
        return self._graph_notes(keys, "unverifiable")

    def freed_reads(self, keys) -> tuple[str, ...]:
        """Memory these keys' graphs read at a replay that nothing kept alive after their capture
        (the CPU emulation: backend/graphs/freed.py); empty for real graphs."""
        return self._graph_notes(keys, "freed_reads")

    def _graph_notes(self, keys, attr: str) -> tuple[str, ...]:
        notes: list[str] = []
        for graph in self._captured(keys):
            notes += [n for n in getattr(graph, attr, ()) if n not in notes]
        return tuple(notes)

    def outside_reads(self, keys) -> tuple[tuple[int, int], ...] | None:
        """The address ranges outside their pool that these keys' graphs may read (allocated when
        each was captured: backend/graphs/allocator.py), merged; None where a graph does not know."""
        ranges: list[tuple[int, int]] = []
        for graph in self._captured(keys):
            if graph.reads is None:
                return None
            ranges += graph.reads
        return merge(ranges)

    def _captured(self, keys) -> list:
        graphs: list = []
        for key in keys:
            entry = self.graphs.get(key)
            graphs += [entry.graph] if isinstance(entry, _Full) else getattr(entry, "graphs", [])
        return graphs

    # ---- runs ---------------------------------------------------------------------------------
    def run_eager(self, x: torch.Tensor, batch: BatchDescription) -> torch.Tensor:
        return self.run_eager_step(x, batch).out

    def run_eager_step(self, x: torch.Tensor, batch: BatchDescription | tuple[BatchDescription, ...]) -> StepOutput:
        with host_scope(self.device):  # host memory a build() makes is host memory at a later capture
            md = self.last_metadata = self.builder.build(batch)
        attn = torch.empty(
            self.shape.num_layers,
            x.shape[0],
            self.layout.local_heads,
            self.family.out_head_size(self.shape),
            dtype=self.model.dtype,
            device=self.device,
        )
        results: list[torch.Tensor] = []
        out = self.model.forward(x.to(self.device), md, attn, results)
        return StepOutput(out.clone(), _stack(results, x.shape[0]))

    def run_graph(self, key: GraphKey, x: torch.Tensor, batch: BatchDescription, pad_seed: int = 0) -> torch.Tensor:
        return self.run_graph_step(key, x, batch, pad_seed).out

    def run_graph_step(
        self, key: GraphKey, x: torch.Tensor, batch: BatchDescription | tuple[BatchDescription, ...], pad_seed: int = 0
    ) -> StepOutput:
        """Replay the graph of `key` on the real batch; its output and attention outputs on the
        real rows (FULL: the attention results the graph refreshed; PIECEWISE: attention's own
        results between the pieces)."""
        n, size = x.shape[0], key.size
        self.static_in[:n].copy_(x)
        # Padded rows hold fresh non-zero values each step (vLLM leaves stale inputs there): a
        # padded token whose K/V leaks into the cache must change bytes to be seen, even when an
        # earlier case leaked into the same slot.
        if size > n:
            gen = torch.Generator().manual_seed(pad_seed)
            pad = torch.randn(size - n, self.shape.hidden_size, generator=gen)
            copy_into(self.static_in[n:size], pad.to(self.static_in.dtype))
        entry = self.graphs[key]
        if isinstance(entry, _Full):
            with host_scope(self.device):
                self.last_metadata = self.builder.build(
                    batch, num_padded_tokens=size, num_padded_reqs=entry.padded_reqs
                )
            out = entry.graph.replay()
            # Copies: the next replay overwrites the graph's outputs.
            return StepOutput(out[:n].clone(), _stack(entry.attention, n))
        with host_scope(self.device):
            md = self.last_metadata = self.builder.build(batch)  # attention between pieces: unpadded, real rows only
        outs = None
        results = []
        for i, graph in enumerate(entry.graphs):
            outs = graph.replay()
            if i < self.shape.num_layers:
                *inputs, _ = outs
                results.append(
                    self.model.attention(i, [t[:n] for t in inputs], layer_metadata(md, i), self.static_attn[i, :n])
                )
        assert outs is not None, "a piecewise entry holds one graph per piece"
        return StepOutput(outs[:n].clone(), _stack(results, n))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _stack(attention: list[torch.Tensor], n: int) -> torch.Tensor:
    """Per-layer attention results [>= n, Hl, D] -> a copy [num_layers, n, Hl, D]."""
    return torch.stack([a[:n] for a in attention])


def _fill_garbage(caches: list[torch.Tensor], family, dtype: torch.dtype, shape: ModelShape) -> None:
    """Seeded non-zero cache contents: a zero cache hides reads and writes of wrong slots. Drawn
    into the family's garbage_views (the planes, or a byte format's typed parts)."""
    for cache in caches:
        # Drawn on the device, in the model dtype (no fp32 temporary of GBs), view by view
        # (AttentionFamily.garbage_views: [num_blocks, block_size, ...]) in chunks of blocks that bound
        # the temporary an fp8 cache needs for its cast.
        gen = torch.Generator(device=cache.device).manual_seed(7)
        for plane in family.garbage_views(cache, shape):
            for start in range(0, plane.shape[0], 8192):
                part = plane[start : start + 8192]
                part.copy_(torch.randn(part.shape, generator=gen, device=cache.device, dtype=dtype).to(plane.dtype))


def estimate_bytes(backend_cls, config: AttentionConfig, num_layers: int) -> int:
    """A session's device bytes before it is built: its KV caches, and one snapshot copy of them
    (the step's scratch, backend/harness/scratch.py). Graph pools and builder buffers come on top
    and are measured once built (Session.memory_bytes). 0 where the backend's layout is its own."""
    fam = family_of(config.attention)
    row_bytes = fam.cache_slot_bytes(config)
    if row_bytes is not None:  # the family's own byte rows (mla_sparse's fp8_ds_mla)
        return 2 * num_layers * fam.num_planes * config.num_blocks * config.block_size * row_bytes
    shape_of = getattr(backend_cls, "kv_cache_shape", None)
    if getattr(backend_cls, "allocate_kv_cache", None) is not None or shape_of is None:
        return 0
    try:
        shape = shape_of(config.num_blocks, config.block_size, config.num_kv_heads, config.head_size)
    except Exception:  # noqa: BLE001 - a plugin's shape function: the measurement will tell
        return 0
    elems = 1
    for n in shape:
        elems *= int(n)
    itemsize = 1 if config.kv_cache_dtype == "fp8" else torch.empty((), dtype=config.dtype).element_size()
    return 2 * num_layers * elems * itemsize
