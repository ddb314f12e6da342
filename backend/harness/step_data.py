"""A step's data and its reference: the per-process caches of step inputs and reference outputs
(shared by every mode, kv dtype and backend of a batch), the context fill through the family's
KV write, the per-step fp8 scales (and those graphs are captured under), and the fp32 reference
forward."""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Sequence

import torch

from backend.attention.kv_cache import fp8_dtype
from backend.case import Case
from backend.harness.model import reference_forward
from backend.harness.reference import fp8_round
from backend.harness.session import LRU, Session
from backend.harness.steps import StepInputs, hash_seed, make_step_inputs
from backend.host_copy import copy_into

# fp8 scales. Every step draws its own (the same for every mode, kv dtype and backend of a
# batch: the eager sides and references they share depend on them), and graphs are captured under
# scales from a range no step draws from. So a graph that froze a host copy of a scale at capture
# replays it against different live scales in every step of every case, whatever ran before on the
# worker; before, a graph captured under the previous case's scales (the same seed) passed.
FP8_SCALE_RANGE = (6.0, 12.0)  # |K|, |V| covered before saturation (inputs are ~N(0, 1))
CAPTURE_SCALE_RANGE = (2.0, 4.0)  # disjoint from FP8_SCALE_RANGE: never a step's


# Reference outputs of recent steps, per process. The reference is the unsharded fp32 model on the
# step's inputs: it depends on the shape, kv dtype (how new K/V are rounded), batch, seed and step,
# not on the backend, mode or tp rank, so every backend's eager output of a step is checked
# against one computation of it. Bounded by bytes, not entries (an entry is KBs on the CPU shape, up
# to ~13 MB at the GPU's), large enough that providers running their batches interleaved still find
# the step's reference when they come back to it (docs/BENCHMARKS.md "Harness caches").
REFERENCES_BYTES = 2 * 2**30


REFERENCES = LRU(REFERENCES_BYTES, size=lambda ref: sum(t.numel() * t.element_size() for t in ref))


# Step inputs of recent steps, per process. They are a function of (step plan, model shape, seed,
# device) only, so the five cudagraph modes, both kv dtypes and every backend of one (batch, seed)
# draw the same ones: drawn once. Read-only for every user (the KV write, the runs and the
# reference copy out of them). Bounded by bytes, by device: on the CPU 256 MB (entries up to 32 MB,
# so the small batches share theirs); on a GPU a fifth of the device's memory, entries up to a
# quarter of that, since a GPU shape's step draws GBs of context (docs/BENCHMARKS.md "Harness caches").
INPUTS_BYTES = 256 * 2**20


GPU_INPUTS_FRACTION = 5  # of the device's total memory


def new_inputs_cache(budget: int = INPUTS_BYTES, max_entry: int | None = None) -> LRU:
    """Step inputs by (plan, shape, seed, device), at most `budget` bytes; an entry above
    `max_entry` (default budget / 8) is not kept (it would evict the small batches that share theirs)."""
    return LRU(budget, size=lambda inputs: inputs.nbytes, max_item=budget // 8 if max_entry is None else max_entry)


INPUTS = new_inputs_cache()


INPUTS_SIZED_FOR_GPU = False


# The worker's device-memory budget (bytes) once its SessionCache has one (set_budget): a GPU
# worker's caches are sized by it, not by the device, since several workers share one device.
BUDGET: list[int | None] = [None]


def set_budget(budget: int | None) -> None:
    BUDGET[0] = budget


def inputs_cache_for(device: torch.device) -> LRU:
    """The process's step-inputs cache, sized for `device` the first time a GPU uses it (a worker
    has one device; CPU workers keep the default): a fifth of the worker's memory budget (or of
    the device's memory, without one)."""
    global INPUTS, INPUTS_SIZED_FOR_GPU
    if device.type == "cuda" and not INPUTS_SIZED_FOR_GPU:
        budget = (BUDGET[0] or torch.cuda.get_device_properties(device).total_memory) // GPU_INPUTS_FRACTION
        INPUTS = new_inputs_cache(budget, max_entry=budget // 4)
        INPUTS_SIZED_FOR_GPU = True
    return INPUTS


def cached_bytes() -> int:
    """Device and host bytes the process's step caches hold now (what a budget must leave them)."""
    return INPUTS._total + REFERENCES._total


def clear_caches() -> None:
    INPUTS.clear()
    REFERENCES.clear()


def step_inputs(plan, shape, seed: int, device: torch.device) -> StepInputs:
    cache = inputs_cache_for(device)
    key = (plan, shape, seed, str(device))
    inputs = cache.get(key)
    if inputs is None:
        inputs = make_step_inputs(plan, shape, seed, device)
        cache.put(key, inputs)  # not kept when above the cache's max_item
    return inputs


def query_scale(session: Session) -> float | None:
    """The static scale with which the backend rounds its query to the cache's fp8 before
    attention (`query_fp8_scale()` on its Impl: vLLM's layer quantises the query for an Impl that
    declares supports_quant_query_input), or None: the query stays in the model dtype."""
    fn = getattr(session.impl, "query_fp8_scale", None)
    return fn() if callable(fn) else None


def paged_cache_dtype(session: Session) -> torch.dtype:
    """The dtype of the session's paged KV caches (a family's state layers hold other caches)."""
    return session.kv_caches[session.family.paged_layers(session.shape)[0]].dtype


def reference_key(case: Case, session: Session, step: int) -> tuple:
    return (
        case.model,
        case.kv_cache_dtype,
        case.batch,
        case.spec_tokens,
        case.seed,
        case.steps,
        session.capture_sizes,
        step,  # the step plan depends on the (resolved) sizes
        str(session.device),
        paged_cache_dtype(session),
        query_scale(session),
    )


def set_scales(case: Case, session: Session, step: int) -> None:
    """The step's KV scales (every layer's k_scale and v_scale), drawn from the batch, k, seed and
    step: what the eager side and the reference of the step are shared by."""
    batch = zlib.crc32(repr((case.batch.name, case.batch.query_lens, case.batch.seq_lens)).encode())
    _draw_scales(
        session, case.kv_cache_dtype, hash_seed(case.seed, batch, case.spec_tokens, step, 977), FP8_SCALE_RANGE
    )


def set_capture_scales(session: Session, kv_cache_dtype: str) -> None:
    """Scales no step draws: what graphs are captured under (module comment above)."""
    _draw_scales(session, kv_cache_dtype, hash_seed(977, 13), CAPTURE_SCALE_RANGE)


def _draw_scales(session: Session, kv_cache_dtype: str, seed: int, scale_range: tuple[float, float]) -> None:
    gen = torch.Generator().manual_seed(seed)
    fp8 = kv_cache_dtype == "fp8"
    fmax = torch.finfo(fp8_dtype(session.device)).max if fp8 else 1.0
    lo, hi = scale_range
    for ks, vs in zip(session.model.k_scales, session.model.v_scales):
        for t in (ks, vs):
            value = (lo + (hi - lo) * torch.rand(1, generator=gen)) / fmax if fp8 else torch.ones(1)
            copy_into(t, value)  # in place: graphs hold these tensors


def fill_context(
    session: Session, inputs: StepInputs, reference: bool = True
) -> tuple[list[list[list[torch.Tensor]]], torch.Tensor]:
    """Write every request's context into the rank's caches through the providers' KV write (the
    family's `write`, which every provider's forward uses for new tokens: its quantiser is under
    test for the context too); return the context as the reference's own fp8 rounding sees it
    ([layer][plane][req], fp32, every head; empty lists when `reference` is False). One write per
    layer for the whole batch. Also returns the slots written (int64, on the device)."""
    family = session.family
    on_device = inputs.on(session.device)
    for layer in family.paged_layers(session.shape):
        cache = session.kv_caches[layer]
        k_scale, v_scale = session.model.k_scales[layer], session.model.v_scales[layer]
        # make_step_inputs keeps the unsplit draw: one KV write per layer, no cat of its views
        values = inputs.ctx_flat[layer]
        group = on_device.group_of(layer)  # the layer's KV-cache group: its slots, its share of the rows
        slots = group.ctx_slots
        if slots.numel():
            held = values if group.ctx_rows is None else [v.index_select(0, group.ctx_rows) for v in values]
            family.write(cache, family.rank_context(held, session.layout), slots, k_scale, v_scale)
    return (
        reference_context(session, inputs) if reference else [[] for _ in session.kv_caches]
    ), on_device.all_ctx_slots


def reference_context(session: Session, inputs: StepInputs) -> list:
    """The context as the reference's own fp8 rounding sees it ([layer][plane][req], fp32, every
    head; an empty list for a layer without a paged cache), computed from the step's draw: what
    fill_context writes, without writing it."""
    family = session.family
    context: list = [[] for _ in session.kv_caches]
    for layer in family.paged_layers(session.shape):
        cache = session.kv_caches[layer]
        scales = family.plane_scales(session.model.k_scales[layer], session.model.v_scales[layer])
        context[layer] = [
            RoundedContext(
                v, functools.partial(round_as_stored, family, session.shape, p, scale, cache.dtype), inputs.ctx_lens
            )
            for p, (v, scale) in enumerate(zip(inputs.ctx_flat[layer], scales))
        ]
    return context


def round_as_stored(family, shape, plane: int, scale, cache_dtype: torch.dtype, t: torch.Tensor) -> torch.Tensor:
    """t (fp32) as the cache returns it after a write: the family's own byte format
    (AttentionFamily.round_stored), else fp8_round with the plane's scale (or the model dtype)."""
    own = family.round_stored(shape, plane, t, cache_dtype)
    return fp8_round(t, scale, cache_dtype) if own is None else own


class RoundedContext(Sequence):
    """One layer plane's context as the reference reads it: request i's rows rounded the way the
    cache stores them (round_as_stored), made when asked for, a run of neighbouring requests at a
    time (at most CHUNK_BYTES of rows, at least one request: the rounding is row by row, so a run's
    rows round as each request's would). The whole batch rounded at once would be an fp32 copy of
    every context row, GBs at a GPU shape (docs/BENCHMARKS.md "Harness caches"); one request at a
    time was a dozen launches per request, layer and plane (800 requests' worth a decode_200 step)."""

    CHUNK_BYTES = 128 << 20

    def __init__(self, values: torch.Tensor, rounding: Callable[[torch.Tensor], torch.Tensor], lens: list[int]):
        self._values, self._lens, self._round = values, lens, rounding
        self._starts = [0]
        for n in lens:
            self._starts.append(self._starts[-1] + n)
        self._row_bytes = values[0].numel() * 4 if values.shape[0] else 0  # fp32 after the rounding
        self._chunk: tuple[int, int, tuple[torch.Tensor, ...]] = (0, 0, ())

    def __len__(self) -> int:
        return len(self._lens)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        lo, hi, parts = self._chunk
        if not lo <= i < hi:
            lo, hi = i, i + 1
            while hi < len(self) and (self._starts[hi + 1] - self._starts[lo]) * self._row_bytes <= self.CHUNK_BYTES:
                hi += 1
            rows = self._round(self._values[self._starts[lo] : self._starts[hi]])
            parts = torch.split(rows, self._lens[lo:hi])
            self._chunk = (lo, hi, parts)
        return parts[i - lo]


def compute_reference(case: Case, session: Session, inputs: StepInputs, context) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference output [T, hidden] fp32 and its attention outputs [layers, T, H, Dv] (every
    head; kept in the model dtype, which holds them exactly: the reference rounds them to it)."""
    cache_dtype = paged_cache_dtype(session)
    model, family = session.model, session.family

    def kv_round(layer: int, plane: int, t: torch.Tensor) -> torch.Tensor:
        scale = family.plane_scales(model.k_scales[layer], model.v_scales[layer])[plane]
        return round_as_stored(family, case.model, plane, scale, cache_dtype, t)

    q_scale = query_scale(session)
    q_round = None if q_scale is None else (lambda layer, q: fp8_round(q, q_scale, cache_dtype))

    # On the session's device (fp32): GPU shapes would make a host reference the slowest part.
    attn: list[torch.Tensor] = []
    out = reference_forward(
        session.reference_weights,
        case.model,
        inputs.on(session.device).x,
        context,
        inputs.plan.query_lens,
        kv_round,
        attn,
        q_round=q_round,
    )
    return out, torch.stack(attn).to(getattr(torch, case.model.dtype))
