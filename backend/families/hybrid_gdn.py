"""hybrid_gdn: Qwen3-Next's hybrid (DESIGN.md §11): GatedDeltaNet layers beside full-attention
layers, every full_attention_interval-th layer attention (interval 4: layers 0-2 GDN, 3 attention).

Attention layers are gqa's (projections, paged cache, reference). A GDN layer on one tp rank
(Hk key heads of Dk, Hv = num_heads value heads of Dv = head_size, split by tp):
    qkvz = h @ W_qkvz[rank].T -> mixed_qkv [T, C] = [q | k | v], z [T, Hv, Dv]
    ba = h @ W_ba[rank].T      -> b, a [T, Hv]
    core = impl.gdn.forward(mixed_qkv, b, a, state page, metadata, conv_w, A_log, dt_bias)
    out = rmsnorm(core) * norm_w * silu(z)           # [T, Hv, Dv]: the harness's output projection
The state page (backend/attention/gdn.py) holds each request's conv buffer and recurrent state per
slot; its recurrent plane's dtype is the layer's (state_dtype: float32, bfloat16, or mixed: float32
and bfloat16 on alternating GDN layers). KV-cache groups, in first-layer order as vLLM builds
them: one state group per state dtype, then the attention group, over one shared common
metadata (backend/attention/groups.py); gdn_layout.py holds that layout, and gdn_groups.py notes a
capture build writing it (a GDN layer whose metadata cannot hold its tokens runs no core). Requests
continue from step to step; gdn_state.py is the family's StepState (the state each step starts
from, and the state_integrity check).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from backend.attention.gdn import GDNDims, StatePage, num_state_slots
from backend.attention.kv_cache import allocate_kv_cache
from backend.families.gdn_groups import StateGroupsBuilder, uncovered
from backend.families.gdn_layout import (
    STATE_DTYPES,
    conv_channels,
    is_state_page,
    kv_cache_groups,
    layer_state_dtype,
    rank_heads,
    state_page,
)
from backend.families.gdn_reference import gated_rmsnorm, reference_layer
from backend.families.gdn_state import STATE
from backend.families.gqa import GQA
from backend.families.specs import HYBRID_GDN as SPEC
from backend.families.specs import is_attention_layer
from backend.result import CHECK_STATE_INTEGRITY


class HybridGDN(GQA):
    spec = SPEC
    num_planes: ClassVar[int] = 2
    extra_checks: ClassVar[tuple[str, ...]] = (CHECK_STATE_INTEGRITY,)

    # ---- caches: attention layers' KV, GDN layers' state pages -------------------------------
    def planes(self, cache):
        if is_state_page(cache):
            return [cache.view(cache.shape[0], 1, cache.shape[1])]
        return super().planes(cache)

    def slot_rows(self, cache):
        if is_state_page(cache):
            return cache.view(1, cache.shape[0], cache.shape[1])
        return super().slot_rows(cache)

    def paged_layers(self, shape):
        return tuple(i for i in range(shape.num_layers) if is_attention_layer(shape, i))

    def allocate_caches(self, backend_cls, config, shape):
        own = getattr(backend_cls, "allocate_kv_cache", None)
        caches = []
        for layer in range(shape.num_layers):
            if not is_attention_layer(shape, layer):
                caches.append(state_page(config, shape, layer).allocate(num_state_slots(config), config.device))
            elif own is not None:
                caches.append(own(config))
            else:
                caches.append(
                    allocate_kv_cache(
                        config,
                        tuple(
                            backend_cls.kv_cache_shape(
                                config.num_blocks, shape.block_size, config.num_kv_heads, shape.head_size
                            )
                        ),
                    )
                )
        return caches

    def config_dims(self, shape):
        return (*shape.dims, ("num_v_heads", shape.num_heads))

    # ---- the test-model layer ------------------------------------------------------------------
    def draw(self, w, norm, shape, layer):
        if is_attention_layer(shape, layer):
            return {**super().draw(w, norm, shape, layer), "kind": "attention"}
        dims = dict(shape.dims)
        hk, dk, kw = dims["num_k_heads"], dims["head_k_dim"], dims["conv_kernel"]
        hv, dv, hid = shape.num_heads, shape.head_size, shape.hidden_size
        dtype = getattr(torch, shape.dtype)
        # q correlated with k (q's projection is k's plus an independent half, the same conv taps):
        # with independent random q and k a head's output is a near-cancellation on ~1% of rows
        # (q.k ~ 0 against a fresh request's rank-one state), which the gated RMSNorm turns into
        # 20% errors from one-ulp differences upstream; trained q and k are correlated so.
        wk, wq_extra = w(hk * dk, hid), w(hk * dk, hid)
        conv_k = w(hk * dk, kw)
        return {
            "kind": "gdn",
            "state_dtype": layer_state_dtype(shape, layer),
            "w_qkvz": torch.cat([(wk + 0.5 * wq_extra).to(dtype).float(), wk, w(2 * hv * dv, hid)]),
            "w_ba": w(2 * hv, hid),
            "conv_w": torch.cat([conv_k, conv_k, w(hv * dv, kw)]),
            # decay rates exp(A_log) of ~0.02-0.2 a token: the state keeps steps of memory (Qwen's
            # init, A in [1, 16], forgets within a token or two at this scale)
            "A_log": (norm(hv) * 2.0 - 5.0).to(dtype).float(),
            "dt_bias": w(hv, 1).view(-1),
            "gnorm": norm(dv),
        }

    def shard(self, weights, layout, shape):
        if weights["kind"] == "attention":
            return {**super().shard(weights, layout, shape), "kind": "attention"}
        dims = dict(shape.dims)
        dk, dv, hk_all, hv_all = dims["head_k_dim"], shape.head_size, dims["num_k_heads"], shape.num_heads
        _, vh = rank_heads(layout, shape)
        ch = conv_channels(layout, shape)
        c_all = 2 * hk_all * dk + hv_all * dv
        z = c_all + torch.arange(vh.start * dv, vh.stop * dv)
        heads = torch.arange(vh.start, vh.stop)
        return {
            "kind": "gdn",
            "state_dtype": weights["state_dtype"],
            "w_qkvz": weights["w_qkvz"][torch.cat([ch, z])],
            "w_ba": weights["w_ba"][torch.cat([heads, hv_all + heads])],
            "conv_w": weights["conv_w"][ch],
            "A_log": weights["A_log"][heads],
            "dt_bias": weights["dt_bias"][heads],
            "gnorm": weights["gnorm"],
        }

    def project(self, lw, h, layout, shape):
        if lw["kind"] == "attention":
            return super().project(lw, h, layout, shape)
        hv, dv = layout.local_heads, shape.head_size
        qkvz = h @ lw["w_qkvz"].t()
        c = qkvz.shape[1] - hv * dv
        ba = h @ lw["w_ba"].t()
        return (
            qkvz[:, :c].contiguous(),
            qkvz[:, c:].reshape(-1, hv, dv).contiguous(),
            ba[:, :hv].contiguous(),
            ba[:, hv:].contiguous(),
        )

    def attend(self, impl, lw, inputs, cache, metadata, k_scale, v_scale, out):
        if lw["kind"] == "attention":
            q, k, v = inputs
            return impl.attention.forward(q, k, v, cache, metadata, k_scale, v_scale, out)
        mixed_qkv, z, b, a = inputs
        config = impl.config
        page = StatePage(GDNDims.of(config), config.dtype, STATE_DTYPES[lw["state_dtype"]])
        t = mixed_qkv.shape[0]
        if uncovered(metadata, getattr(metadata, "num_actual_tokens", t)):  # a kernel would fail on its shapes
            out[:t].zero_()
            return out
        core = impl.gdn.forward(mixed_qkv, b, a, cache, page, metadata, lw, out[:t])
        out[:t].copy_(gated_rmsnorm(core.float(), z.float(), lw["gnorm"].float()).to(out.dtype))
        return out

    # ---- the reference -----------------------------------------------------------------------------
    def reference(self, weights, h, context, query_lens, round_new, round_query, shape, rnd):
        if weights["kind"] == "attention":
            return super().reference(weights, h, context, query_lens, round_new, round_query, shape, rnd)
        return reference_layer(weights, h, context, query_lens, shape, rnd)

    # ---- groups, builder, steps ----------------------------------------------------------------------
    def groups(self, shape):
        return kv_cache_groups(shape)

    def make_builder(self, backend_cls, config, shape):
        return StateGroupsBuilder(
            backend_cls,
            config,
            self.groups(shape),
            shape.num_layers,
            group_builder=lambda g, c: backend_cls.group_builder(g.kind, c),
        )

    def order_rows(self, query_lens, seq_lens, spec_tokens):
        # the family's StepState plans (and orders) its own steps: gdn_steps.py
        return tuple(query_lens), tuple(seq_lens)

    def step_state(self):
        return STATE
