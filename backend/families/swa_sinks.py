"""swa_sinks: gpt-oss attention (DESIGN.md §9b-9c): GQA with a sliding window on some layers,
full attention on the others, a learned sink logit per query head, and one KV-cache group per
layer kind.

Per layer on one tp rank: gqa's projections and cache; the op gets the layer's window W (None:
full) and sinks [Hl]:
    a = impl.forward(q, k, v, kv_cache, metadata[layer], k_scale, v_scale, out, window, sinks)
A query at absolute position i sees key j iff j <= i and (no window, or i - j < W); the sink adds
exp(sink_h - m) once to the softmax denominator (not scaled, no value).

Layers: layer_pattern `alternate` windows the even layers (gpt-oss starts with a sliding layer),
`window` / `full` every layer alike. KV-cache groups (kv_groups): `hybrid`, vLLM's hybrid manager:
one group per layer kind, in first-layer order, the window group's blocks wholly outside the
window freed to the null block; `merged` (--disable-hybrid-kv-cache-manager): one group, every
block kept, its spec carrying the first layer's window (vLLM promotes SlidingWindowSpec to a
FullAttentionSpec that records it), which a backend must not apply to the full layers (#51756).
The session's builder is backend/attention/groups.py's, over the groups in that order.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch

from backend.attention.groups import GroupedMetadataBuilder
from backend.families.contract import KVCacheGroup
from backend.families.gqa import GQA, _with_new
from backend.families.specs import SWA_SINKS as SPEC
from backend.harness.reference import same_shape_batches


def layer_window(shape, layer: int) -> int | None:
    dims = dict(shape.dims)
    pattern, w = dims["layer_pattern"], dims["sliding_window"]
    if pattern == "window" or (pattern == "alternate" and layer % 2 == 0):
        return w
    return None


class SWASinks(GQA):
    spec = SPEC
    num_planes: ClassVar[int] = 2

    def draw(self, w, norm, shape, layer):
        out = super().draw(w, norm, shape, layer)
        if dict(shape.dims)["sinks"]:
            # one logit per query head; drawn as before (the weights after it follow the seed)
            out["sinks"] = sink_logits(shape, w(shape.num_heads, 1).view(-1))
        out["window"] = layer_window(shape, layer)
        return out

    def shard(self, weights, layout, shape):
        out = super().shard(weights, layout, shape)
        if "sinks" in weights:
            out["sinks"] = weights["sinks"][layout.q_heads.start : layout.q_heads.stop]
        out["window"] = weights["window"]
        return out

    def attend(self, impl, lw, inputs, cache, metadata, k_scale, v_scale, out):
        q, k, v = inputs
        return impl.forward(q, k, v, cache, metadata, k_scale, v_scale, out, window=lw["window"], sinks=lw.get("sinks"))

    def reference(self, weights, h, context, query_lens, round_new, round_query, shape, rnd):
        q, k, v = self.reference_qkv(weights, h, round_new, round_query, shape, rnd)
        sinks = weights.get("sinks")
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        runs = same_shape_batches(
            query_lens, _with_new(context[0], k, query_lens), _with_new(context[1], v, query_lens)
        )
        for start, ql, ks, vs in runs:  # requests of one shape together, each on its own K/V
            rows = slice(start, start + ks.shape[0] * ql)
            qs = q[rows].reshape(ks.shape[0], ql, *q.shape[1:])
            o = reference_window_sinks(qs, ks, vs, self.scale(shape), weights["window"], sinks)
            out[rows] = o.reshape(-1, *q.shape[1:])
        return out

    def groups(self, shape):
        dims = dict(shape.dims)
        windows = [layer_window(shape, i) for i in range(shape.num_layers)]
        if dims["kv_groups"] == "merged" or len(set(windows)) == 1:
            # One group: its spec's window is the first layer's; blocks kept unless every layer
            # slides (one SlidingWindowSpec group frees them, as the hybrid window group does).
            all_slide = all(w is not None for w in windows)
            return (
                KVCacheGroup(
                    "merged" if len(set(windows)) > 1 else "all",
                    tuple(range(shape.num_layers)),
                    windows[0],
                    frees_outside_window=all_slide,
                ),
            )
        kinds = list(dict.fromkeys(windows))  # first-layer order: gpt-oss's window group first
        return tuple(
            KVCacheGroup(
                "sliding_window" if w is not None else "full",
                tuple(i for i, x in enumerate(windows) if x == w),
                w,
                frees_outside_window=w is not None,
            )
            for w in kinds
        )

    def make_builder(self, backend_cls, config, shape):
        return GroupedMetadataBuilder(
            backend_cls,
            config,
            self.groups(shape),
            shape.num_layers,
            group_config=lambda c, g: dataclasses.replace(
                c, sliding_window=g.sliding_window, kv_spec="sliding_window" if g.frees_outside_window else "full"
            ),
        )


# The keys a row attends range from a few to max_model_len. Sinks ~N(0, 1) against logits ~N(0, 1)
# over n keys (whose exp-sum is about n e^0.5) carried well under 1% of a row's mass at 100 keys, so
# a sink counted twice or added without its exp2 conversion moved a head's output 2.5-3.6%, inside
# the ~4% per-head threshold, less at the GPU shape's longer contexts. gpt-oss's trained sinks
# are of the order of a row's largest logits. Here head h's sink is 0.5 + ln(n_h) (+ a quarter of
# its draw): it holds half the mass of a row over n_h keys, and the n_h are spread log-uniformly
# from SINK_MIN_KEYS to max_model_len over the heads (in bit-reversed head order, so every tp
# rank's contiguous share of heads spans the range): at every context some heads carry 20-80%.
# Measured errors against the tolerance: benchmarks/sink_share.py, docs/FAMILIES.md.
SINK_MIN_KEYS = 8


def sink_logits(shape, drawn: torch.Tensor) -> torch.Tensor:
    """Per query head, from `drawn` ~N(0, 1) [num_heads], rounded to the model dtype (a weight)."""
    h = shape.num_heads
    bits = max(1, (h - 1).bit_length())
    order = sorted(range(h), key=lambda i: int(format(i, f"0{bits}b")[::-1], 2))  # bit-reversed
    rank = torch.empty(h)
    rank[torch.tensor(order)] = torch.arange(h, dtype=torch.float32)
    lo, hi = math.log(SINK_MIN_KEYS), math.log(shape.max_model_len)
    keys = lo + (hi - lo) * rank / max(h - 1, 1)
    sinks = 0.5 + keys.to(drawn.device) + 0.25 * drawn
    return sinks.to(getattr(torch, shape.dtype)).float()


def reference_window_sinks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None, sinks: torch.Tensor | None
) -> torch.Tensor:
    """One request, fp32: q [q, H, D] (its last q positions), k/v [s, Hkv, D] its whole sequence;
    or n requests of one shape, each on its own K/V: q [n, q, H, D], k/v [n, s, Hkv, D].
    Explicit softmax with the sink as one more logit per head (value 0), then dropped. GQA without
    repeating K/V: query head g * rep + r attends kv head g (K/V stay fp32 at the kv heads)."""
    *lead, q_len, h, d = q.shape
    s, hkv = k.shape[-3], k.shape[-2]
    rep = h // hkv
    qg = q.float().reshape(*lead, q_len, hkv, rep, d)
    scores = torch.einsum("...qgrd,...sgd->...grqs", qg, k.float()).reshape(*lead, h, q_len, s) * scale
    i = torch.arange(q_len, device=q.device)[:, None] + (s - q_len)
    j = torch.arange(s, device=q.device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed = allowed & (i - j < window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(-1, 1, 1).expand(*scores.shape[:-1], 1)
        p = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :s]
    else:
        p = torch.softmax(scores, dim=-1)
    pg = p.reshape(*lead, hkv, rep, q_len, s)
    return torch.einsum("...grqs,...sgd->...qgrd", pg, v.float()).reshape(*lead, q_len, h, v.shape[-1])
