"""Torch implementations of the two native AITER ops, with their documented semantics
(DESIGN.md §3), so the `aiter` provider's own wrapper runs on CPU and in CI.

What matters is what a graph freezes, so host ints are honoured exactly as the kernels use them:
- flash_attn_varlen_func: the launch grid covers max_seqlen_q query rows and max_seqlen_k key
  positions per request (host ints); rows/positions beyond them are not computed. Rows of requests
  with seqlen_q <= min_seqlen_q are skipped (left unwritten). Causal is bottom-right aligned.
- paged_attention_v1: with cu_query_lens it returns early (writes nothing) for requests whose
  query len > 1; context_lens, block_tables, cu_query_lens and the scales are read live from device
  tensors; the host max_context_len sets the partition count, so positions at or beyond
  ceil(max_context_len / partition_size) * partition_size are never attended.
No host syncs: both run under the CPU graph emulation, which raises on .item()/nonzero/tolist.
"""

from __future__ import annotations

import torch

from backend.providers.torch_ops import gather_paged, masked_attention, token_chunks, token_to_request


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                           min_seqlen_q: int = 0, dropout_p: float = 0.0, softmax_scale: float | None = None,
                           logits_soft_cap: float = 0.0, causal: bool = False, window_size=(-1, -1),
                           bias=None, alibi_slopes=None, deterministic: bool = False, return_lse: bool = False,
                           return_attn_probs: bool = False, how_v3_bf16_cvt: int = 1, block_table=None,
                           out: torch.Tensor | None = None, cu_seqlens_q_padded=None, cu_seqlens_k_padded=None):
    """q [Tq, H, D], k/v [Tk, Hkv, D] packed contiguously by cu_seqlens_q/k [B+1]. Returns out."""
    unsupported = {"dropout_p": dropout_p, "logits_soft_cap": logits_soft_cap, "bias": bias,
                   "alibi_slopes": alibi_slopes, "block_table": block_table, "return_lse": return_lse,
                   "return_attn_probs": return_attn_probs, "cu_seqlens_q_padded": cu_seqlens_q_padded,
                   "cu_seqlens_k_padded": cu_seqlens_k_padded}
    used = [name for name, val in unsupported.items() if val not in (None, 0.0, False)]
    if used or tuple(window_size) != (-1, -1):
        raise NotImplementedError(f"emulated flash_attn_varlen_func does not model {used or 'window_size'}")
    if out is None:
        out = torch.zeros_like(q)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    tq, h, d = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    req, row = token_to_request(cu_seqlens_q, tq)
    cu_k = cu_seqlens_k.to(torch.int64)
    qlen = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(torch.int64)[req]
    klen = (cu_k[1:] - cu_k[:-1])[req]
    # Written rows: inside the launch grid (row < max_seqlen_q) and of a request not skipped.
    written = (row < qlen) & (row < max_seqlen_q) & (qlen > min_seqlen_q)
    keys = torch.arange(max(max_seqlen_k, 0), device=q.device)
    per_token = max(max_seqlen_k, 1) * hkv * d * 4 * 2 + h * max(max_seqlen_k, 1) * 4 * 3
    for chunk in token_chunks(tq, per_token):
        index = (cu_k[req[chunk], None] + keys[None, :]).clamp(0, max(tk - 1, 0))
        visible = keys[None, :] < klen[chunk, None]
        if causal:
            visible &= keys[None, :] <= (klen - qlen + row)[chunk, None]
        res = masked_attention(q[chunk], k[index].float(), v[index].float(), visible, scale)
        out[chunk] = torch.where(written[chunk, None, None], res.to(out.dtype), out[chunk])
    return out


def workspace_bytes(num_seqs: int, num_heads: int, head_size: int, max_context_len: int,
                    out_dtype: torch.dtype, partition_size: int = 256) -> int:
    """Workspace paged_attention_v1 needs (tmp outputs + exp sums + max logits), as vLLM sizes it."""
    parts = -(-max_context_len // partition_size)
    elem = torch.finfo(out_dtype).bits // 8
    return num_seqs * num_heads * parts * head_size * elem + 2 * num_seqs * num_heads * parts * 4


def paged_attention_v1(out, workspace_buffer, query, key_cache, value_cache, scale: float, block_tables,
                       cu_query_lens, context_lens, max_context_len: int, alibi_slopes, kv_cache_dtype: str,
                       kv_cache_layout: str, logits_soft_cap: float, k_scale, v_scale, fp8_out_scale=None,
                       partition_size: int = 256, mtp: int = 1, sliding_window: int = 0):
    """Decode attention over the paged NHD cache. query/out [T, H, D]; request r's query row is
    cu_query_lens[r] (or r without cu_query_lens). key_cache [num_blocks, block_size, Hkv, D]."""
    if kv_cache_layout != "NHD":
        raise NotImplementedError("emulated paged_attention_v1 models the NHD layout only")
    if alibi_slopes is not None or logits_soft_cap or fp8_out_scale is not None or mtp != 1 or sliding_window:
        raise NotImplementedError("emulated paged_attention_v1 models plain decode only")
    t, h, d = query.shape
    num_seqs = context_lens.shape[0]
    need = workspace_bytes(num_seqs, h, d, max_context_len, out.dtype, partition_size)
    if workspace_buffer.numel() * workspace_buffer.element_size() < need:
        raise ValueError(f"paged_attention_v1 workspace too small: {need} bytes needed")
    block_size, hkv = key_cache.shape[1], key_cache.shape[2]
    # Positions covered by the partitions the host max_context_len launches.
    covered = min(-(-max_context_len // partition_size) * partition_size, block_tables.shape[1] * block_size)
    if cu_query_lens is not None:
        req, row = token_to_request(cu_query_lens[: num_seqs + 1], t)
        qlen = (cu_query_lens[1: num_seqs + 1] - cu_query_lens[:num_seqs]).to(torch.int64)[req]
        active = (row == 0) & (qlen <= 1) & (qlen >= 1)
    else:
        tokens = torch.arange(t, device=query.device)
        req = tokens.clamp(max=num_seqs - 1)
        active = tokens < num_seqs
    ctx = context_lens.to(torch.int64)[req]
    active = active & (ctx > 0)  # no partition starts below a context of 0: nothing written
    keys = torch.arange(covered, device=query.device)
    per_token = covered * hkv * d * 4 * 2 + h * covered * 4 * 3
    scale_k = k_scale if kv_cache_dtype.startswith("fp8") else None
    scale_v = v_scale if kv_cache_dtype.startswith("fp8") else None
    for chunk in token_chunks(t, per_token):
        rows = block_tables[req[chunk]]
        kk = gather_paged(key_cache, rows, covered, scale_k)
        vv = gather_paged(value_cache, rows, covered, scale_v)
        res = masked_attention(query[chunk], kk, vv, keys[None, :] < ctx[chunk, None], scale)
        out[chunk] = torch.where(active[chunk, None, None], res.to(out.dtype), out[chunk])
    return out
