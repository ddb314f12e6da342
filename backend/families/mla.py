"""mla: multi-head latent attention (DeepSeek V3/R1, Kimi K2; DESIGN.md §9a).

Per layer on one tp rank (H heads, Hl = H / tp; L, R, P, V as in backend/attention/mla.py):
    q = h @ W_q[rank heads].T                  # [T, Hl, P + R] (no q LoRA: outside attention)
    ckv = h @ W_kv_a.T                         # [T, L + R], replicated on every rank
    kv_c, k_pe = rmsnorm(ckv[:, :L]), ckv[:, L:]   # RoPE is outside the op and left out
    a = impl.forward(q, kv_c, k_pe, kv_cache, metadata, k_scale, out, W_UK_T, W_UV)  # [T, Hl, V]
with W_UK [L, H, P] and W_UV [L, H, V] from kv_b_proj [H * (P + V), L], as vLLM splits them
(weight.T.view(L, H, P + V).split([P, V])), a rank holding its heads' slices.

The reference computes every request in fp32 from the latent rows: query-len-1 requests in the
absorbed form (scores q'.row over all L + R dims, V = the latent, then W_UV), the others in the
decompressed form (K = [kv_c W_UK | k_pe], V = kv_c W_UV per head, causal): the two paths a
provider takes (tests/families/test_mla_reference.py holds them equal). Scale (P + R)^-0.5, the
model's MHA scale, not (L + R)^-0.5. fp8: one k_scale dequantises the whole row (K and V alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F

from backend.attention.kv_cache import write_slots
from backend.attention.mla import MLADims
from backend.families.contract import AttentionFamily, split_by
from backend.families.specs import MLA as SPEC
from backend.harness.model import rmsnorm


class MLA(AttentionFamily):
    spec = SPEC
    num_planes: ClassVar[int] = 1

    def scale(self, shape) -> float:
        d = MLADims.of(shape)
        return (d.qk_nope_head_dim + d.qk_rope_head_dim) ** -0.5

    def out_head_size(self, shape) -> int:
        return MLADims.of(shape).v_head_dim

    def planes(self, cache):
        return [cache]

    def plane_scales(self, k_scale, v_scale):
        return (k_scale,)  # V is the latent: the K scale dequantises the whole row

    def context_rows(self, shape):
        return ((MLADims.of(shape).row,),)

    def rank_context(self, values, layout):
        return list(values)  # the latent cache is replicated on every rank

    def write(self, cache, values, slots, k_scale, v_scale):
        write_slots(cache, values[0], slots, k_scale)

    def draw(self, w, norm, shape, layer):
        d, hid, h = MLADims.of(shape), shape.hidden_size, shape.num_heads
        return {
            "wq": w(h * (d.qk_nope_head_dim + d.qk_rope_head_dim), hid),
            "w_kv_a": w(d.row, hid),
            "kv_norm": norm(d.kv_lora_rank),
            "w_kv_b": w(h * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank),
        }

    def shard(self, weights, layout, shape):
        d = MLADims.of(shape)
        heads = slice(layout.q_heads.start, layout.q_heads.stop)
        w_uk, w_uv = split_kv_b(weights["w_kv_b"], shape.num_heads, d)  # [L, H, P], [L, H, V]
        qk = d.qk_nope_head_dim + d.qk_rope_head_dim
        return {
            "wq": weights["wq"].view(shape.num_heads, qk, -1)[heads].reshape(-1, weights["wq"].shape[1]),
            "w_kv_a": weights["w_kv_a"],
            "kv_norm": weights["kv_norm"],
            "w_uk_t": w_uk[:, heads].permute(1, 2, 0),  # [Hl, P, L]
            "w_uv": w_uv[:, heads].permute(1, 0, 2),  # [Hl, L, V]
        }

    def project(self, lw, h, layout, shape):
        d, t = MLADims.of(shape), h.shape[0]
        q = (h @ lw["wq"].t()).view(t, layout.local_heads, -1).contiguous()
        ckv = h @ lw["w_kv_a"].t()
        kv_c = rmsnorm(ckv[:, : d.kv_lora_rank], lw["kv_norm"]).contiguous()
        k_pe = ckv[:, d.kv_lora_rank :].contiguous()
        return q, kv_c, k_pe

    def attend(self, impl, lw, inputs, cache, metadata, k_scale, v_scale, out):
        q, kv_c, k_pe = inputs
        return impl.forward(q, kv_c, k_pe, cache, metadata, k_scale, out, lw["w_uk_t"], lw["w_uv"])

    def reference(self, weights, h, context, query_lens, round_new, round_query, shape, rnd):
        d, t, nh = MLADims.of(shape), h.shape[0], shape.num_heads
        q = rnd(h @ weights["wq"].t()).view(t, nh, -1)
        if round_query is not None:
            q = round_query(q)
        ckv = rnd(h @ weights["w_kv_a"].t())
        kv_c = rnd(rmsnorm(ckv[:, : d.kv_lora_rank], weights["kv_norm"]))
        new = round_new(0, torch.cat([kv_c, ckv[:, d.kv_lora_rank :]], dim=-1))
        rows = (torch.cat([c, n]) for c, n in zip(context[0], split_by(new, query_lens)))  # one at a time
        w_uk, w_uv = split_kv_b(weights["w_kv_b"], nh, d)
        scale = self.scale(shape)
        outs = [
            reference_absorbed(qr, r, w_uk, w_uv, d, scale)
            if ql == 1
            else reference_decompressed(qr, r, w_uk, w_uv, d, scale)
            for qr, r, ql in zip(split_by(q, query_lens), rows, query_lens)
        ]
        return torch.cat(outs) if outs else q.new_zeros(0, nh, d.v_head_dim)

    def order_rows(self, query_lens, seq_lens, spec_tokens):
        """Decodes (or verify rows of 1 + k) first, then the rest by query len: the V2 runner's
        sort_batch_req_ids, which split_decodes_and_prefills relies on (a stable sort)."""
        dq = 1 + spec_tokens
        order = sorted(range(len(query_lens)), key=lambda r: (query_lens[r] != dq, query_lens[r]))
        return tuple(query_lens[r] for r in order), tuple(seq_lens[r] for r in order)


def split_kv_b(w_kv_b: torch.Tensor, num_heads: int, d: MLADims) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj's weight [H * (P + V), L] -> W_UK [L, H, P], W_UV [L, H, V] (vLLM's split)."""
    w = w_kv_b.t().reshape(d.kv_lora_rank, num_heads, d.qk_nope_head_dim + d.v_head_dim)
    return w[..., : d.qk_nope_head_dim], w[..., d.qk_nope_head_dim :]


def _causal(q_len: int, s: int, device) -> torch.Tensor:
    rows = torch.arange(q_len, device=device)[:, None]
    cols = torch.arange(s, device=device)[None, :]
    return cols <= rows + (s - q_len)  # [q, s] bottom-right


def reference_absorbed(
    q: torch.Tensor, rows: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, d: MLADims, scale: float
) -> torch.Tensor:
    """One request, absorbed (decode) form, fp32: q [q, H, P + R], rows [s, L + R] -> [q, H, V]."""
    q32, r32 = q.float(), rows.float()
    ql = torch.einsum("qhp,lhp->qhl", q32[..., : d.qk_nope_head_dim], w_uk.float())
    qq = torch.cat([ql, q32[..., d.qk_nope_head_dim :]], dim=-1).transpose(0, 1)  # [H, q, L + R]
    k = r32[None].expand(qq.shape[0], -1, -1)  # MQA: one row for every head
    o_lat = F.scaled_dot_product_attention(
        qq, k, k[..., : d.kv_lora_rank], attn_mask=_causal(q.shape[0], rows.shape[0], q.device), scale=scale
    )
    return torch.einsum("hql,lhv->qhv", o_lat, w_uv.float())


def reference_decompressed(
    q: torch.Tensor, rows: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, d: MLADims, scale: float
) -> torch.Tensor:
    """One request, decompressed (prefill) form, fp32: q [q, H, P + R], rows [s, L + R] -> [q, H, V]."""
    q32, r32 = q.float(), rows.float()
    kv_c, k_pe = r32[:, : d.kv_lora_rank], r32[:, d.kv_lora_rank :]
    h = q.shape[1]
    k_nope = torch.einsum("sl,lhp->hsp", kv_c, w_uk.float())
    k = torch.cat([k_nope, k_pe[None].expand(h, -1, -1)], dim=-1)  # [H, s, P + R]
    v = torch.einsum("sl,lhv->hsv", kv_c, w_uv.float())
    o = F.scaled_dot_product_attention(
        q32.transpose(0, 1), k, v, attn_mask=_causal(q.shape[0], rows.shape[0], q.device), scale=scale
    )
    return o.transpose(0, 1)


def reference_requests(
    q: Sequence[torch.Tensor], rows: Sequence[torch.Tensor], w_uk, w_uv, d: MLADims, scale: float, form: str
) -> list[torch.Tensor]:
    """Every request in one form ("absorbed" | "decompressed"): the agreement test's entry."""
    fn = reference_absorbed if form == "absorbed" else reference_decompressed
    return [fn(qr, r, w_uk, w_uv, d, scale) for qr, r in zip(q, rows)]
