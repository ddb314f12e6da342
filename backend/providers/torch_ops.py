"""Torch building blocks shared by the `torch` provider and the emulated AITER ops.

Everything here is graph-safe: shapes come only from tensor shapes and static config, never from
tensor values; no host syncs (.item(), nonzero, boolean-mask indexing), so the CPU graph emulation
and real CUDA/HIP graphs can capture it. Work is split over tokens in chunks whose size is a
function of static shapes only.
"""

from __future__ import annotations

import torch

from backend.attention.kv_cache import dequantize

# Per chunk, the gathered K+V (fp32) and the scores should stay around this many bytes.
CHUNK_BYTES = 512 * 1024**2


def token_chunks(num_tokens: int, per_token_bytes: int, budget: int = CHUNK_BYTES) -> list[slice]:
    """Static token slices of at most budget bytes each (at least one token per slice)."""
    step = max(1, budget // max(per_token_bytes, 1))
    return [slice(s, min(s + step, num_tokens)) for s in range(0, num_tokens, step)]


def token_to_request(cu_seqlens: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For tokens 0..num_tokens-1 packed by cu_seqlens [R+1]: (request index, position in its
    request's query), both [num_tokens] int64. Tokens past the last request (padding) map to request
    R-1 with a position >= its query len; callers mask them out."""
    num_reqs = cu_seqlens.shape[0] - 1
    tokens = torch.arange(num_tokens, device=cu_seqlens.device)
    cu = cu_seqlens.to(torch.int64)
    req = torch.searchsorted(cu[1:], tokens, right=True).clamp(max=max(num_reqs - 1, 0))
    return req, tokens - cu[req]


def gather_paged(
    cache: torch.Tensor, block_rows: torch.Tensor, length: int, scale: torch.Tensor | None
) -> torch.Tensor:
    """cache [num_blocks, block_size, Hkv, D], block_rows [C, max_blocks] -> fp32 [C, length, Hkv, D]
    (positions 0..length-1 of each row's sequence, dequantised).

    The result is a view of kv-head-major storage ([Hkv, C, length, D]): the blocks are selected
    straight out of a head-first view of the cache, one copy in the cache dtype (2 or 1 bytes an
    element), then dequantised; masked_attention multiplies per (kv head, token) and takes that
    layout as it is (before, a position-major gather was reordered by a second copy, and
    before that copied again in fp32 inside each einsum)."""
    block_size, hkv, d = cache.shape[1], cache.shape[2], cache.shape[3]
    nblocks = -(-length // block_size)
    c = block_rows.shape[0]
    # A kernel reads no block past a sequence's length; this gathers whole rows and masks after,
    # so a padded request's row (vLLM pads -1: backend/attention/padding.py) is read as block 0.
    blocks = block_rows[:, :nblocks].reshape(-1).to(torch.int64).clamp_min(0)
    kv = cache.permute(2, 0, 1, 3).index_select(1, blocks)  # [Hkv, C * nblocks, block_size, D]
    kv = kv.view(hkv, c, nblocks * block_size, d)[:, :, :length]
    return dequantize(kv, scale).permute(1, 2, 0, 3)


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Per-token attention over its own keys, fp32.

    q [C, H, D], k [C, L, Hkv, D], v [C, L, Hkv, Dv], mask [C, L] (True = attend) -> [C, H, Dv].
    GQA: query head h uses kv head h // (H // Hkv). A row with no key attended gives 0, not NaN
    (padded requests have seq_len 0).

    Batched over (kv head, token): k/v as gather_paged returns them ([Hkv, C, L, D] storage) go
    into the matmuls without a copy; one softmax pass over the fp32 scores (it was five).
    """
    c, h, d = q.shape
    hkv = k.shape[2]
    qh = (q.float().view(c, hkv, h // hkv, d) * scale).transpose(0, 1)  # [Hkv, C, G, D], small
    kh = k.float().permute(2, 0, 1, 3)  # [Hkv, C, L, D]
    vh = v.float().permute(2, 0, 1, 3)
    scores = torch.matmul(qh, kh.transpose(-1, -2))  # [Hkv, C, G, L]
    scores.masked_fill_(~mask[None, :, None, :], float("-inf"))
    # A row with no key attended is all -inf: softmax makes it NaN, zeroed here (as before: 0).
    p = torch.softmax(scores, dim=-1)
    p.masked_fill_(~mask.any(dim=-1)[None, :, None, None], 0.0)
    return torch.matmul(p, vh).transpose(0, 1).reshape(c, h, v.shape[-1])
