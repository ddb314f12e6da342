"""Torch building blocks of the MLA providers (backend/attention/mla.py has the shapes): the latent
KV write, the absorbed decode and the decompressed prefill, and the up/down projections around
them in the precision vLLM runs them (bf16 matmuls, fp32 softmax).

Graph-safe like torch_ops.py: shapes come from tensor shapes and host ints the metadata carries
(num_decode_tokens, max_query_len, max_seq_len: the builder's, frozen by a graph), never from
tensor values; no host syncs. Decode rows attend with one latent row per key shared by every
head (MQA over L + R dims, V = the latent's first L); prefill rows attend per head over
decompressed K = [kv_c W_UK | k_pe] and V = kv_c W_UV.
"""

from __future__ import annotations

import torch

from backend.attention.kv_cache import write_slots
from backend.attention.mla import MLADims, MLAMetadata
from backend.providers.torch_backend import gather_length
from backend.providers.torch_ops import gather_paged, token_chunks, token_to_request


def write_latent(
    kv_cache: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor, slot_mapping: torch.Tensor, k_scale: torch.Tensor
) -> None:
    """[kv_c | k_pe] [T, L + R] into kv_cache [num_blocks, block_size, L + R] at slot_mapping (-1:
    nothing), quantised with the one per-tensor k_scale for an fp8 cache (vLLM's
    concat_and_cache_mla; here the same slot write every provider's GQA cache uses)."""
    n = slot_mapping.shape[0]
    write_slots(kv_cache, torch.cat([kv_c[:n], k_pe[:n]], dim=-1), slot_mapping, k_scale)


def absorb_query(q: torch.Tensor, w_uk_t: torch.Tensor, dims: MLADims) -> torch.Tensor:
    """q [T, Hl, P + R] -> q' [T, Hl, L + R] = [q_nope W_UK | q_pe] in q's dtype (vLLM's bmm)."""
    p = dims.qk_nope_head_dim
    ql = torch.bmm(q[..., :p].transpose(0, 1), w_uk_t).transpose(0, 1)  # [T, Hl, L]
    return torch.cat([ql, q[..., p:]], dim=-1)


def up_project(o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """o_lat [T, Hl, L] -> [T, Hl, V] (vLLM's _v_up_proj: bmm in the model dtype)."""
    return torch.bmm(o_lat.transpose(0, 1), w_uv).transpose(0, 1)


def gather_latent(kv_cache: torch.Tensor, block_rows: torch.Tensor, length: int, scale) -> torch.Tensor:
    """kv_cache [num_blocks, block_size, L + R], block_rows [C, max_blocks] -> fp32 [C, length, L + R]."""
    return gather_paged(kv_cache.unsqueeze(2), block_rows, length, scale).squeeze(2)


def absorbed_decode(
    qq: torch.Tensor, kv_cache: torch.Tensor, md: MLAMetadata, k_scale, scale: float, dims: MLADims, num_tokens: int
) -> torch.Tensor:
    """q' [>= num_tokens, Hl, L + R] of the decode tokens [0, num_tokens) -> o_lat fp32
    [num_tokens, Hl, L]. Token i of a request with query len q and seq len s attends positions
    p < s with p <= s - q + i (a verify row's causal block); padded tokens attend nothing (0)."""
    h, dim, lat = qq.shape[1], qq.shape[2], dims.kv_lora_rank
    block_size = kv_cache.shape[1]
    length = gather_length(md, block_size)
    req, pos = token_to_request(md.query_start_loc, num_tokens)
    seq = md.seq_lens.to(torch.int64)[req]
    qlen = md.query_lens.to(torch.int64)[req]
    limit = seq - qlen + pos
    real = pos < qlen
    keys = torch.arange(length, device=qq.device)
    out = torch.zeros(num_tokens, h, lat, dtype=torch.float32, device=qq.device)
    per_token = length * dim * 4 * 2 + h * length * 4 * 3
    for chunk in token_chunks(num_tokens, per_token):
        mask = (keys[None, :] <= limit[chunk, None]) & (keys[None, :] < seq[chunk, None]) & real[chunk, None]
        # Keys outside the mask are read as 0, as a kernel that stops at seq_len never reads them:
        # a masked weight of 0 times a NaN left there by an earlier step would still be NaN.
        rows = gather_latent(kv_cache, md.block_table[req[chunk]], length, k_scale).masked_fill(
            ~mask[..., None], 0.0
        )  # [C, Lk, L + R]
        scores = torch.matmul(qq[chunk].float() * scale, rows.transpose(1, 2))  # [C, Hl, Lk]
        scores.masked_fill_(~mask[:, None, :], float("-inf"))
        p = torch.softmax(scores, dim=-1)
        p.masked_fill_(~mask.any(dim=-1)[:, None, None], 0.0)  # no key: 0, not 0/0
        out[chunk] = torch.matmul(p, rows[..., :lat])
    return out


def decompress(
    latent: torch.Tensor, w_uk_t: torch.Tensor, w_uv: torch.Tensor, dims: MLADims, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """latent rows [..., S, L + R] (fp32) -> K [..., S, Hl, P + R], V [..., S, Hl, V] in `dtype`
    (vLLM's forward_mha up-projects kv_c with kv_b_proj in the model dtype; k_pe is shared by
    every head)."""
    lat = dims.kv_lora_rank
    kv_c = latent[..., :lat].to(dtype)
    k_nope = torch.einsum("...sl,hpl->...shp", kv_c, w_uk_t.to(dtype))
    v = torch.einsum("...sl,hlv->...shv", kv_c, w_uv.to(dtype))
    k_pe = latent[..., lat:].to(dtype).unsqueeze(-2).expand(*k_nope.shape[:-1], dims.qk_rope_head_dim)
    return torch.cat([k_nope, k_pe], dim=-1), v


def decompressed_prefill(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    md: MLAMetadata,
    k_scale,
    scale: float,
    dims: MLADims,
    w_uk_t: torch.Tensor,
    w_uv: torch.Tensor,
) -> torch.Tensor:
    """The prefill requests [num_decodes, num_decodes + num_prefills) of q [T, Hl, P + R] -> fp32
    [num_prefill_tokens, Hl, V]: per request, its whole sequence decompressed and attended
    causally (bottom-right). Requests' queries are padded to the host max_query_len (graph-safe
    varlen: no host read of the boundaries)."""
    nd, npf, _, npt = md.num_decodes, md.num_prefills, md.num_decode_tokens, md.num_prefill_tokens
    h, v_dim = q.shape[1], dims.v_head_dim
    if not npf or not npt:
        return torch.zeros(0, h, v_dim, dtype=torch.float32, device=q.device)
    block_size = kv_cache.shape[1]
    length = gather_length(md, block_size)
    max_q = max(int(md.max_query_len), 1)
    reqs = torch.arange(nd, nd + npf, device=q.device)
    qsl = md.query_start_loc.to(torch.int64)
    seq = md.seq_lens.to(torch.int64)[reqs]  # [Np]
    qlen = md.query_lens.to(torch.int64)[reqs]
    keys = torch.arange(length, device=q.device)
    latent = gather_latent(kv_cache, md.block_table[reqs], length, k_scale)  # [Np, Lk, L + R]
    latent = latent.masked_fill(~(keys[None, :] < seq[:, None])[..., None], 0.0)  # past seq_len: never read
    k, v = decompress(latent, w_uk_t, w_uv, dims, q.dtype)  # [Np, Lk, Hl, *]
    i = torch.arange(max_q, device=q.device)
    idx = (qsl[reqs, None] + i[None, :]).clamp(max=q.shape[0] - 1)  # [Np, max_q] token of each query row
    qp = q[idx].float() * scale  # [Np, max_q, Hl, P + R]
    scores = torch.einsum("rqhd,rshd->rhqs", qp, k.float())
    mask = (
        (keys[None, None, :] < seq[:, None, None])
        & (keys[None, None, :] <= (seq - qlen)[:, None, None] + i[None, :, None])
        & (i[None, :, None] < qlen[:, None, None])
    )  # [Np, max_q, Lk]
    scores.masked_fill_(~mask[:, None], float("-inf"))
    p = torch.softmax(scores, dim=-1)
    p.masked_fill_(~mask.any(dim=-1)[:, None, :, None], 0.0)
    o = torch.einsum("rhqs,rshv->rqhv", p, v.float())  # [Np, max_q, Hl, V]
    # Back to the prefill tokens [dt, dt + npt) by gather (no boolean indexing: no host sync).
    req, pos = token_to_request(qsl[nd : nd + npf + 1] - qsl[nd], npt)
    return o[req, pos.clamp(max=max_q - 1)]
