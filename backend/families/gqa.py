"""gqa: grouped-query paged attention, the family orch started with (DESIGN.md §3).

Per layer on one tp rank (T tokens, H query heads, Hkv kv heads, D head size):
    q, k, v = h @ W_qkv[rank shard].T      # column-parallel: [T, Hl, D], [T, Hkvl, D] x2
    a = impl.forward(q, k, v, kv_cache, metadata, k_scale, v_scale, out)   # [T, Hl, D]
kv_cache [2, num_blocks, block_size, Hkvl, D] (NHD; plane 0 = K, 1 = V; block 0 = null block).
kv heads are split by tp, or replicated when tp exceeds them (TPLayout.kv_heads).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from backend.attention.kv_cache import write_kv
from backend.families.contract import AttentionFamily, split_by
from backend.families.specs import GQA as SPEC
from backend.harness.reference import reference_attention


def head_cols(heads: range, head_size: int) -> torch.Tensor:
    return torch.arange(heads.start * head_size, heads.stop * head_size)


class GQA(AttentionFamily):
    spec = SPEC
    num_planes: ClassVar[int] = 2

    def scale(self, shape) -> float:
        return shape.head_size**-0.5

    def out_head_size(self, shape) -> int:
        return shape.head_size

    def planes(self, cache):
        return [cache[0], cache[1]]

    def plane_scales(self, k_scale, v_scale):
        return k_scale, v_scale

    def context_rows(self, shape):
        row = (shape.num_kv_heads, shape.head_size)
        return row, row

    def rank_context(self, values, layout):
        heads = layout.kv_heads  # a range: the rank's kv heads are a slice (a view, no copy)
        return [v[:, heads.start : heads.stop] for v in values]

    def write(self, cache, values, slots, k_scale, v_scale):
        write_kv(cache, values[0], values[1], slots, k_scale, v_scale)

    def draw(self, w, norm, shape, layer):
        hid, hd, kvd = shape.hidden_size, shape.num_heads * shape.head_size, shape.num_kv_heads * shape.head_size
        return {"wq": w(hd, hid), "wk": w(kvd, hid), "wv": w(kvd, hid)}

    def shard(self, weights, layout, shape):
        q_cols = head_cols(layout.q_heads, shape.head_size)
        kv_cols = head_cols(layout.kv_heads, shape.head_size)
        # fused column-parallel QKV shard: [Hl*D + 2*Hkvl*D, hidden]
        return {"wqkv": torch.cat([weights["wq"][q_cols], weights["wk"][kv_cols], weights["wv"][kv_cols]])}

    def project(self, lw, h, layout, shape):
        d, t = shape.head_size, h.shape[0]
        qkv = h @ lw["wqkv"].t()
        a, b = layout.local_heads * d, layout.local_kv_heads * d
        q = qkv[:, :a].reshape(t, layout.local_heads, d).contiguous()
        k = qkv[:, a : a + b].reshape(t, layout.local_kv_heads, d).contiguous()
        v = qkv[:, a + b :].reshape(t, layout.local_kv_heads, d).contiguous()
        return q, k, v

    def attend(self, impl, lw, inputs, cache, metadata, k_scale, v_scale, out):
        q, k, v = inputs
        return impl.forward(q, k, v, cache, metadata, k_scale, v_scale, out)

    def reference(self, weights, h, context, query_lens, round_new, round_query, shape, rnd):
        q, k, v = self.reference_qkv(weights, h, round_new, round_query, shape, rnd)
        ks = _with_new(context[0], k, query_lens)
        vs = _with_new(context[1], v, query_lens)
        return reference_attention(q, ks, vs, query_lens, self.scale(shape))

    @staticmethod
    def reference_qkv(weights, h, round_new, round_query, shape, rnd):
        """The reference's q [T, H, D] (rounded as the backend's query is) and this step's new K/V
        rows [T, Hkv, D] (rounded as the cache stores them)."""
        d, hq, hkv = shape.head_size, shape.num_heads, shape.num_kv_heads
        t = h.shape[0]
        q = rnd(h @ weights["wq"].t()).view(t, hq, d)
        if round_query is not None:
            q = round_query(q)
        k = round_new(0, rnd(h @ weights["wk"].t()).view(t, hkv, d))
        v = round_new(1, rnd(h @ weights["wv"].t()).view(t, hkv, d))
        return q, k, v


def _with_new(context: Sequence[torch.Tensor], new: torch.Tensor, query_lens: Sequence[int]):
    """Each request's whole sequence: its context rows, then this step's new rows, one request at a
    time (an iterator: the whole batch's sequences at once are GBs at GPU shapes)."""
    return (torch.cat([c, n]) for c, n in zip(context, split_by(new, query_lens)))
