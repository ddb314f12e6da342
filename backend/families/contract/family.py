"""What the harness asks of an attention family's implementation (backend/families/contract/__init__.py).

The harness owns everything around the attention op: the residual stream, the row-parallel
output projection and its all-reduce, the MLP, graphs, steps, checks and the verdict
(backend/harness/). A family owns the op itself and what only it knows:

- the op's contract with its providers: softmax scale, the output's head size, the AttentionConfig
  extras its providers read (`config_dims`);
- the KV cache: its planes (GQA: K and V; MLA: one latent row) as [num_blocks, block_size, ...]
  views of a layer's cache, which scale tensor each plane uses, the context rows a step draws
  (every head) and the share a tp rank holds, and the KV write its providers use;
- the test-model layer: its full fp32 weights (drawn in a fixed order from the model's generator),
  a rank's shard, the projections from the normed residual to the op's inputs, and the op's call;
- the independent fp32 reference of the op;
- its step plan (rows reordered as vLLM's runner hands them to such a backend);
- for a family whose requests keep state from step to step (hybrid_gdn), its StepState: the
  requests' plan across steps, the state groups' batches, the state each step starts from, and
  the checks of it (the harness runs what the family provides; `extra_checks` names them).

Shapes: T tokens, H query heads (Hl on a rank), Dv = out_head_size; a cache plane row is what one
token stores in that plane.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from backend.families.contract.spec import FamilySpec

if TYPE_CHECKING:  # torch only in annotations: the contract loads without it (the planner's side)
    import torch


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one block table, slot mapping and metadata builder (vLLM's KV-cache
    groups: one per layer spec in a hybrid model). `sliding_window`: the group spec's window (what
    a builder reads off the spec, not the layer); `frees_outside_window`: blocks wholly outside
    every query's window are the null block (vLLM's SlidingWindowManager)."""

    name: str
    layers: tuple[int, ...]
    sliding_window: int | None = None
    frees_outside_window: bool = False
    # "paged": K/V in blocks of a paged cache (block table, slot mapping, context rows); "state":
    # one state slot per request (and spec column) that the family's StepState plans and checks.
    kind: str = "paged"


# fn(rows, cols) -> an fp32 weight rounded to the model dtype; fn(n) -> a norm weight
WeightFn = Callable[[int, int], "torch.Tensor"]
NormFn = Callable[[int], "torch.Tensor"]


class AttentionFamily:
    spec: ClassVar[FamilySpec]
    num_planes: ClassVar[int]  # cache planes per layer (GQA: K and V; MLA: the latent row)
    # Checks beyond backend.result's core ones that this family's StepState supplies (their names
    # are in result.CHECK_NAMES); a case reports the core checks and these.
    extra_checks: ClassVar[tuple[str, ...]] = ()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def fresh_prompts_are_prefills(self) -> bool:
        """A row without context is a prompt, not a decode (FamilySpec says why)."""
        return self.spec.fresh_prompts_are_prefills

    # ---- the op's contract ------------------------------------------------------------------
    def scale(self, shape) -> float:
        raise NotImplementedError

    def out_head_size(self, shape) -> int:
        """The attention output's size per query head (what the output projection reads)."""
        raise NotImplementedError

    # ---- KV cache -----------------------------------------------------------------------------
    def planes(self, cache: torch.Tensor) -> list[torch.Tensor]:
        """One layer's cache as its planes, each [num_blocks, block_size, *row] (views)."""
        raise NotImplementedError

    def slot_rows(self, cache: torch.Tensor) -> torch.Tensor:
        """[num_planes, num_slots, row elements]: every slot's bytes per plane (a view where the
        cache allows it, else a copy: callers compare, they do not write through it)."""
        first = self.planes(cache)[0]
        return cache.reshape(self.num_planes, first.shape[0] * first.shape[1], -1)

    def garbage_views(self, cache: torch.Tensor, shape) -> list[torch.Tensor]:
        """The typed views [num_blocks, block_size, ...] of one layer's cache that the session fills
        with seeded garbage (default: the planes). A byte-format cache (mla_sparse's fp8_ds_mla)
        gives each part of its rows in its own dtype, so that garbage decodes finite, as any row a
        writer left does: random bytes would make NaN scales no real cache holds."""
        return self.planes(cache)

    def round_stored(self, shape, plane: int, rows: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor | None:
        """rows [n, *row] (fp32) as a cache of this family's own byte format returns them after a
        write, by the reference's own arithmetic; None where the cache is a plain dtype (the
        harness rounds to it: fp8 with the plane's scale, or the model dtype)."""
        return None

    def decode_rows(self, shape, plane: int, rows: torch.Tensor) -> torch.Tensor | None:
        """rows [..., row bytes] of this family's own byte-format cache plane as the fp32 values a
        reader gets (kv_integrity compares a graph's real slots to eager's as those); None where the
        cache is a plain dtype (dequantised with the plane's scale)."""
        return None

    def cache_slot_bytes(self, config) -> int | None:
        """Bytes of one slot's row per plane where the family allocates a byte-format cache for
        `config` (the session's memory estimate); None: the backend's kv_cache_shape in its dtype."""
        return None

    def plane_scales(self, k_scale: torch.Tensor, v_scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The scale tensor each plane is quantised with (fp8 caches)."""
        raise NotImplementedError

    def context_rows(self, shape) -> tuple[tuple[int, ...], ...]:
        """Per plane, the row shape of one token's context with every head (what a step draws)."""
        raise NotImplementedError

    def rank_context(self, values: Sequence[torch.Tensor], layout) -> list[torch.Tensor]:
        """The share of the context rows (per plane, [n, *row]) that a rank's cache holds."""
        raise NotImplementedError

    def write(
        self,
        cache: torch.Tensor,
        values: Sequence[torch.Tensor],
        slots: torch.Tensor,
        k_scale: torch.Tensor,
        v_scale: torch.Tensor,
    ) -> None:
        """Write rows (per plane, the rank's share) at `slots` through the providers' own KV write
        (its quantiser is under test for the context too); slots of -1 write nothing."""
        raise NotImplementedError

    # ---- the test-model layer -------------------------------------------------------------------
    def draw(self, w: WeightFn, norm: NormFn, shape, layer: int) -> dict[str, Any]:
        """Layer `layer`'s full fp32 attention weights (drawn in a fixed order: the model's weights
        follow from the seed), and any host value of the layer's (swa_sinks: its window). The
        output projection is the harness's: [hidden, H * Dv]."""
        raise NotImplementedError

    def shard(self, weights: dict[str, torch.Tensor], layout, shape) -> dict[str, torch.Tensor]:
        """A rank's share of `draw`'s weights (still fp32 on the host side)."""
        raise NotImplementedError

    def project(self, lw: dict[str, torch.Tensor], h: torch.Tensor, layout, shape) -> tuple[torch.Tensor, ...]:
        """h [T, hidden] (normed, model dtype) -> the op's inputs on this rank."""
        raise NotImplementedError

    def attend(
        self,
        impl,
        lw: dict[str, torch.Tensor],
        inputs: Sequence[torch.Tensor],
        cache: torch.Tensor,
        metadata,
        k_scale: torch.Tensor,
        v_scale: torch.Tensor,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """The provider's op on the inputs; writes `out` [T, Hl, Dv] and returns the result."""
        raise NotImplementedError

    # ---- the reference ----------------------------------------------------------------------------
    def reference(
        self,
        weights: dict[str, torch.Tensor],
        h: torch.Tensor,
        context: Sequence[Sequence[torch.Tensor]],
        query_lens: Sequence[int],
        round_new: Callable[[int, torch.Tensor], torch.Tensor],
        round_query: Callable[[torch.Tensor], torch.Tensor] | None,
        shape,
        rnd: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """The op in fp32 on the unsharded weights: h [T, hidden] (fp32 holding model-dtype values),
        context[plane][req] [ctx_len, *row] (fp32, as the cache returns it), round_new(plane, t)
        rounds this step's new rows as the cache stores them, round_query rounds q as the
        provider's layer does (or None), rnd rounds to the model dtype where the model stores an
        activation. Returns [T, H, Dv] (all heads)."""
        raise NotImplementedError

    # ---- steps -------------------------------------------------------------------------------------
    def order_rows(
        self, query_lens: Sequence[int], seq_lens: Sequence[int], spec_tokens: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """A step's rows in the order vLLM's runner hands them to this family's backends."""
        return tuple(query_lens), tuple(seq_lens)

    def groups(self, shape) -> tuple[KVCacheGroup, ...]:
        """The model's KV-cache groups, in the order vLLM builds their metadata (default: one)."""
        return (KVCacheGroup("all", tuple(range(shape.num_layers))),)

    def make_builder(self, backend_cls, config, shape):
        """The session's metadata builder: build(batches, padded...) and build_for_capture(n, q,
        style) over every group's batch (StepInputs.batches). Default: the backend's own builder
        for the one group, its metadata used by every layer."""
        return SingleGroupBuilder(backend_cls.builder_cls(config))

    def config_dims(self, shape) -> tuple[tuple[str, Any], ...]:
        """The dims a provider's AttentionConfig carries (default: the shape's own)."""
        return shape.dims

    # ---- layers of other kinds, and requests that continue across steps ---------------------
    def paged_layers(self, shape) -> tuple[int, ...]:
        """The layers with a paged KV cache (context rows, KV write, kv_integrity); the others
        (hybrid_gdn's state layers) are their StepState's."""
        return tuple(range(shape.num_layers))

    def allocate_caches(self, backend_cls, config, shape) -> list[torch.Tensor] | None:
        """Every layer's cache, where the family's layers differ in kind (None: the backend's KV
        cache for every layer)."""
        return None

    def step_state(self) -> StepState | None:
        """The family's per-request state across steps (None: steps are independent)."""
        return None


class StepState:
    """What a family whose requests keep state from step to step gives the harness
    (backend/families/hybrid_gdn.py, gdn_state.py). The harness calls, per step it computes: plan_steps (once
    per case), group_batch (a state group's share of the step), prepare (after the context fill,
    before the snapshot: writes the state every request starts from; returns the step's view of
    it, whose merge(context) puts the reference's view of each state layer into the reference's
    context), owned (after the first eager run: the state it wrote), then eager_check and
    graph_check; each check returns (ok, detail, max_abs)."""

    def plan_steps(self, batch, shape, capture_sizes, num_steps: int, seed: int, spec_tokens: int) -> list:
        raise NotImplementedError

    def group_batch(self, plan, shape, group_index: int, group: KVCacheGroup):
        raise NotImplementedError

    def prepare(self, case, session, inputs, plans) -> Any:
        raise NotImplementedError

    def owned(self, session, prepared) -> Any:
        raise NotImplementedError

    def same(self, a, b) -> bool:
        """Whether two `owned` copies are bit-identical (eager's determinism covers the state too)."""
        raise NotImplementedError

    def eager_check(self, case, session, prepared, owned) -> tuple[bool, str, float]:
        raise NotImplementedError

    def graph_check(self, case, session, prepared, owned, snapshot) -> tuple[bool, str, float]:
        raise NotImplementedError


def split_by(t: torch.Tensor, lens: Sequence[int]) -> list[torch.Tensor]:
    return list(t.split(list(lens)))


class SingleGroupBuilder:
    """One group: the backend's builder, handed the group's batch."""

    def __init__(self, builder):
        self.builder = builder

    def build(self, batches, num_padded_tokens=None, num_padded_reqs=None):
        batch = batches[0] if isinstance(batches, tuple) else batches
        return self.builder.build(batch, num_padded_tokens, num_padded_reqs)

    def build_for_capture(self, num_tokens: int, uniform_query_len: int = 0, style: str = "v2"):
        return self.builder.build_for_capture(num_tokens, uniform_query_len, style)

    def __getattr__(self, name):  # the backend builder's own attributes (tests, mutants read them)
        return getattr(self.builder, name)


def layer_metadata(metadata, layer: int):
    """Layer `layer`'s metadata: a per-layer sequence (several KV-cache groups) or one for all."""
    return metadata[layer] if isinstance(metadata, tuple) else metadata
