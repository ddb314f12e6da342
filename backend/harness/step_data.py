"""A step's data and its reference: the per-process caches of step inputs and reference outputs
(shared by every mode, kv dtype and backend of a batch), the context fill through the family's
KV write, the per-case fp8 scales, and the fp32 reference forward."""

from __future__ import annotations

import torch

from backend.attention.kv_cache import fp8_dtype
from backend.case import Case
from backend.harness.model import reference_forward
from backend.harness.reference import fp8_round
from backend.harness.session import LRU, Session
from backend.harness.steps import StepInputs, hash_seed, make_step_inputs
from backend.host_copy import copy_into

# fp8 scales are drawn per case so a graph that froze an old scale disagrees with eager.
FP8_SCALE_RANGE = (6.0, 12.0)  # |K|, |V| covered before saturation (inputs are ~N(0, 1))


# Reference outputs of recent steps, per process. The reference is the unsharded fp32 model on the
# step's inputs: it depends on the shape, kv dtype (how new K/V are rounded), batch, seed and step,
# not on the backend, mode or tp rank, so every backend's eager output of a step is checked
# against one computation of it (~0.3 s per step of a 200-request decode batch on the H200).
# Bounded by bytes (an entry is the step's output and attention outputs: KBs on the CPU shape, up
# to ~13 MB at the GPU's): at 64 entries the 290-case tp 1 GPU slice, whose providers run their
# batches interleaved, evicted most of them before the next provider came back to the same step
# (aiter-triton-pa recomputed 1.9 s of references, #13).
REFERENCES_BYTES = 2 * 2**30


REFERENCES = LRU(REFERENCES_BYTES, size=lambda ref: sum(t.numel() * t.element_size() for t in ref))


# Step inputs of recent steps, per process. They are a function of (step plan, model shape, seed,
# device) only, so the five cudagraph modes, both kv dtypes and every backend of one (batch, seed)
# draw the same ones: drawn once (the context K/V draw was a fifth of a rank's case time on the
# 2-core machine, #13). Read-only for every user (the KV write, the runs and the reference copy
# out of them). Bounded by bytes, by device: on the CPU 256 MB (entries up to 32 MB, so the small
# batches share theirs); on a GPU a fifth of the device's memory, entries up to a quarter of that
# (full.yaml's GPU shape draws 32 GB of context over its 45 distinct steps, 6.4 GB for one
# decode_200 step: at 256 MB every GPU case drew its own, 11 s of the 290-case tp 1 run's 40 s).
INPUTS_BYTES = 256 * 2**20


GPU_INPUTS_FRACTION = 5  # of the device's total memory


def new_inputs_cache(budget: int = INPUTS_BYTES, max_entry: int | None = None) -> LRU:
    """Step inputs by (plan, shape, seed, device), at most `budget` bytes; an entry above
    `max_entry` (default budget / 8) is not kept (it would evict the small batches that share theirs)."""
    return LRU(budget, size=lambda inputs: inputs.nbytes,
               max_item=budget // 8 if max_entry is None else max_entry)


INPUTS = new_inputs_cache()


INPUTS_SIZED_FOR_GPU = False


def inputs_cache_for(device: torch.device) -> LRU:
    """The process's step-inputs cache, sized for `device` the first time a GPU uses it (a worker
    has one device; CPU workers keep the default)."""
    global INPUTS, INPUTS_SIZED_FOR_GPU
    if device.type == "cuda" and not INPUTS_SIZED_FOR_GPU:
        budget = torch.cuda.get_device_properties(device).total_memory // GPU_INPUTS_FRACTION
        INPUTS = new_inputs_cache(budget, max_entry=budget // 4)
        INPUTS_SIZED_FOR_GPU = True
    return INPUTS


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
    return (case.model, case.kv_cache_dtype, case.batch, case.spec_tokens, case.seed, case.steps,
            session.capture_sizes, step,  # the step plan depends on the (resolved) sizes
            str(session.device), paged_cache_dtype(session), query_scale(session))


def set_scales(case: Case, session: Session) -> None:
    gen = torch.Generator().manual_seed(hash_seed(case.seed, 977))
    fp8 = case.kv_cache_dtype == "fp8"
    fmax = torch.finfo(fp8_dtype(session.device)).max if fp8 else 1.0
    lo, hi = FP8_SCALE_RANGE
    for ks, vs in zip(session.model.k_scales, session.model.v_scales):
        for t in (ks, vs):
            value = (lo + (hi - lo) * torch.rand(1, generator=gen)) / fmax if fp8 else torch.ones(1)
            copy_into(t, value)  # in place: graphs hold these tensors


def fill_context(session: Session, inputs: StepInputs, reference: bool = True
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
    return (reference_context(session, inputs) if reference else [[] for _ in session.kv_caches]), \
        on_device.all_ctx_slots


def reference_context(session: Session, inputs: StepInputs) -> list:
    """The context as the reference's own fp8 rounding sees it ([layer][plane][req], fp32, every
    head; an empty list for a layer without a paged cache), computed from the step's draw: what
    fill_context writes, without writing it."""
    family = session.family
    context: list = [[] for _ in session.kv_caches]
    for layer in family.paged_layers(session.shape):
        cache = session.kv_caches[layer]
        scales = family.plane_scales(session.model.k_scales[layer], session.model.v_scales[layer])
        context[layer] = [list(torch.split(fp8_round(v, scale, cache.dtype), inputs.ctx_lens))
                          for v, scale in zip(inputs.ctx_flat[layer], scales)]
    return context


def compute_reference(case: Case, session: Session, inputs: StepInputs, context) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference output [T, hidden] fp32 and its attention outputs [layers, T, H, Dv] (every
    head; kept in the model dtype, which holds them exactly: the reference rounds them to it)."""
    cache_dtype = paged_cache_dtype(session)
    model, family = session.model, session.family

    def kv_round(layer: int, plane: int, t: torch.Tensor) -> torch.Tensor:
        scale = family.plane_scales(model.k_scales[layer], model.v_scales[layer])[plane]
        return fp8_round(t, scale, cache_dtype)

    q_scale = query_scale(session)
    q_round = None if q_scale is None else (lambda layer, q: fp8_round(q, q_scale, cache_dtype))

    # On the session's device (fp32): GPU shapes would make a host reference the slowest part.
    attn: list[torch.Tensor] = []
    out = reference_forward(session.reference_weights, case.model, inputs.on(session.device).x, context,
                            inputs.plan.query_lens, kv_round, attn, q_round=q_round)
    return out, torch.stack(attn).to(getattr(torch, case.model.dtype))
