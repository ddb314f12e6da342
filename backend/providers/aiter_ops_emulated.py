"""Torch implementations of the native AITER ops orch's `aiter` providers call, with their
documented semantics (DESIGN.md §3, §9a), so the providers' own wrappers run on CPU and in CI:
flash_attn_varlen_func and paged_attention_v1 (gqa), mla_decode_fwd (mla).

What matters is what a graph freezes, so host ints are honoured exactly as the kernels use them:
- flash_attn_varlen_func: the launch grid covers max_seqlen_q query rows and max_seqlen_k key
  positions per request (host ints); rows/positions beyond them are not computed, and K/V outside a
  row's window are never read (uninitialised memory there stays out of the result). Rows of requests
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


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q: int,
    max_seqlen_k: int,
    min_seqlen_q: int = 0,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    logits_soft_cap: float = 0.0,
    causal: bool = False,
    window_size=(-1, -1),
    bias=None,
    alibi_slopes=None,
    deterministic: bool = False,
    return_lse: bool = False,
    return_attn_probs: bool = False,
    how_v3_bf16_cvt: int = 1,
    block_table=None,
    out: torch.Tensor | None = None,
    cu_seqlens_q_padded=None,
    cu_seqlens_k_padded=None,
):
    """q [Tq, H, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv] packed contiguously by cu_seqlens_q/k [B+1]
    (MLA's prefill: D = P + R, Dv = V). Returns out [Tq, H, Dv]."""
    unsupported = {
        "dropout_p": dropout_p,
        "logits_soft_cap": logits_soft_cap,
        "bias": bias,
        "alibi_slopes": alibi_slopes,
        "block_table": block_table,
        "return_lse": return_lse,
        "return_attn_probs": return_attn_probs,
        "cu_seqlens_q_padded": cu_seqlens_q_padded,
        "cu_seqlens_k_padded": cu_seqlens_k_padded,
    }
    used = [name for name, val in unsupported.items() if val not in (None, 0.0, False)]
    if used or tuple(window_size) != (-1, -1):
        raise NotImplementedError(f"emulated flash_attn_varlen_func does not model {used or 'window_size'}")
    if out is None:
        out = q.new_zeros(*q.shape[:-1], v.shape[-1])
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
    per_token = max(max_seqlen_k, 1) * hkv * (d + v.shape[-1]) * 4 + h * max(max_seqlen_k, 1) * 4 * 3
    for chunk in token_chunks(tq, per_token):
        index = (cu_k[req[chunk], None] + keys[None, :]).clamp(0, max(tk - 1, 0))
        visible = keys[None, :] < klen[chunk, None]
        if causal:
            visible &= keys[None, :] <= (klen - qlen + row)[chunk, None]
        # Keys outside a row's window are never read by the kernel: zeroed here, so uninitialised
        # memory there (vLLM's torch.empty gather buffers) cannot reach the row through 0 * NaN.
        kk = torch.where(visible[:, :, None, None], k[index].float(), 0.0)
        vv = torch.where(visible[:, :, None, None], v[index].float(), 0.0)
        res = masked_attention(q[chunk], kk, vv, visible, scale)
        out[chunk] = torch.where(written[chunk, None, None], res.to(out.dtype), out[chunk])
    return out


def workspace_bytes(
    num_seqs: int,
    num_heads: int,
    head_size: int,
    max_context_len: int,
    out_dtype: torch.dtype,
    partition_size: int = 256,
) -> int:
    """Workspace paged_attention_v1 needs (tmp outputs + exp sums + max logits), as vLLM sizes it."""
    parts = -(-max_context_len // partition_size)
    elem = torch.finfo(out_dtype).bits // 8
    return num_seqs * num_heads * parts * head_size * elem + 2 * num_seqs * num_heads * parts * 4


def paged_attention_v1(
    out,
    workspace_buffer,
    query,
    key_cache,
    value_cache,
    scale: float,
    block_tables,
    cu_query_lens,
    context_lens,
    max_context_len: int,
    alibi_slopes,
    kv_cache_dtype: str,
    kv_cache_layout: str,
    logits_soft_cap: float,
    k_scale,
    v_scale,
    fp8_out_scale=None,
    partition_size: int = 256,
    mtp: int = 1,
    sliding_window: int = 0,
):
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
        qlen = (cu_query_lens[1 : num_seqs + 1] - cu_query_lens[:num_seqs]).to(torch.int64)[req]
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


def _segment_sum(values: torch.Tensor, row: torch.Tensor, rows: int) -> torch.Tensor:
    """Sums of `values` [P, ...] per row id, `row` [P] sorted ascending -> [rows, ...]. On a GPU,
    prefix sums in fp64 differenced at each row's bounds: deterministic where index_add_ of floats
    is atomic (an H200 saw the eager side differ between two runs of the same step), and graph-safe
    (static shapes, no host read). On the host, index_add_ (sequential there)."""
    if not values.is_cuda:  # index_add_ is sequential, hence deterministic, on the host, and cheaper
        return values.new_zeros((rows, *values.shape[1:])).index_add_(0, row, values)
    ids = torch.arange(rows, device=row.device)
    lo, hi = torch.searchsorted(row, ids), torch.searchsorted(row, ids, right=True)
    prefix = torch.cat([values.new_zeros((1, *values.shape[1:]), dtype=torch.float64), values.double().cumsum(0)])
    return (prefix[hi] - prefix[lo]).to(values.dtype)


def mla_decode_fwd(
    q,
    kv_buffer,
    o,
    qo_indptr,
    kv_indptr,
    kv_indices,
    kv_last_page_lens,
    max_seqlen_q,
    sm_scale=None,
    logit_cap=0.0,
    num_kv_splits=None,
    num_kv_splits_indptr=None,
    work_meta_data=None,
    work_indptr=None,
    work_info_set=None,
    reduce_indptr=None,
    reduce_final_map=None,
    reduce_partial_map=None,
    q_scale=None,
    kv_scale=None,
):
    """aiter/mla.py mla_decode_fwd: MQA over a paged latent cache. q [T, H, Dqk]; kv_buffer
    [num_pages, page_size, 1, Dqk]; o [T, H, Dv] (V = each key row's first Dv values, the
    latent); row b owns query tokens qo_indptr[b]..qo_indptr[b+1] and the KV pages
    kv_indices[kv_indptr[b]:kv_indptr[b+1]]; kv_scale dequantises an fp8 buffer. Modelled: page
    size 1 and max_seqlen_q 1 (one query token a row), no logit cap, no q_scale. A row with no
    keys is left unwritten (the native stage-2 reduce's result there is not documented; orch's
    wrapper zero-fills `o` first). Returns (o, None).

    Graph-safe: a segmented softmax over kv_indices' whole capacity (a static shape), positions
    past kv_indptr's last entry masked; no host read of the layout."""
    pages, page_size = kv_buffer.shape[0], kv_buffer.shape[1]
    if page_size != 1 or max_seqlen_q != 1 or logit_cap or q_scale is not None or work_meta_data is not None:
        raise NotImplementedError(
            "emulated mla_decode_fwd models page size 1, max_seqlen_q 1, no logit cap, "
            "no q_scale, the non-persistent path"
        )
    rows, h, dv = qo_indptr.shape[0] - 1, q.shape[1], o.shape[-1]
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
    flat = kv_buffer.view(pages, -1)
    ends = kv_indptr[1 : rows + 1].to(torch.int64)
    first_token = qo_indptr[:rows].to(torch.int64).clamp(max=max(q.shape[0] - 1, 0))
    qr = q[first_token].float()  # [rows, H, Dqk]
    m = torch.full((rows, h), float("-inf"), dtype=torch.float32, device=q.device)
    den = torch.zeros(rows, h, dtype=torch.float32, device=q.device)
    num = torch.zeros(rows, h, dv, dtype=torch.float32, device=q.device)
    per_pos = flat.shape[1] * 4 * 2 + h * (dv + 4) * 4 * 3  # K, scores, and the fp64 prefix sums
    for chunk in token_chunks(kv_indices.shape[0], per_pos, budget=32 * 1024**2):  # online softmax
        p = torch.arange(chunk.start, chunk.stop, device=q.device)
        row = torch.searchsorted(ends, p, right=True)
        valid = row < rows
        row = row.clamp(max=max(rows - 1, 0))
        k = flat[kv_indices[chunk].to(torch.int64).clamp(0, pages - 1)]
        k = k.float() * kv_scale.float() if kv_scale is not None else k.float()
        s = torch.einsum("phd,pd->ph", qr[row], k) * scale
        s = torch.where(valid[:, None], s, torch.full_like(s, float("-inf")))
        m_new = m.scatter_reduce(0, row[:, None].expand(-1, h), s, reduce="amax")
        keep = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), torch.exp(m - m_new))  # rows still empty: 0
        den, num, m = den * keep, num * keep[..., None], m_new
        e = torch.where(valid[:, None], torch.exp(s - m[row]), torch.zeros_like(s))
        den += _segment_sum(e, row, rows)
        num += _segment_sum(e[..., None] * k[:, None, :dv], row, rows)
    has_keys = den > 0
    res = num / torch.where(has_keys, den, torch.ones_like(den))[..., None]
    target = qo_indptr[:rows].to(torch.int64).clamp(max=max(o.shape[0] - 1, 0))
    written = has_keys.any(dim=-1) & (qo_indptr[1 : rows + 1] > qo_indptr[:rows])
    o[target] = torch.where(written[:, None, None], res.to(o.dtype), o[target])
    return o, None
