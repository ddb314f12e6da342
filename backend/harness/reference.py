"""Independent fp32 reference for paged causal attention (check 1 of DESIGN.md §5).

Deliberately shares no attention math with the providers: `torch.nn.functional.scaled_dot_product_attention`
over each request's own K/V with an explicit bottom-right causal mask (neighbouring requests of one
shape batched into one call), GQA by attending each kv head's query heads as rows of one
attention over its keys, on K/V read out of the paged cache one block at a time.
Its fp8 rounding (`fp8_round`) is its own arithmetic, not the providers' quantiser or torch's
float8 cast: a broken provider quantiser must disagree with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.nn.functional as F

from backend.attention.interface import BatchDescription

_FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
# OCP e4m3fn: max 448, bias 7 (normals from 2^-6); gfx942's e4m3fnuz: max 240, bias 8 (from 2^-7).
# Both have 3 mantissa bits, subnormals spaced like the smallest normal binade.
_FP8_FORMAT = {torch.float8_e4m3fn: (448.0, -6), torch.float8_e4m3fnuz: (240.0, -7)}
_MANTISSA_BITS = 3


def fp8_round(x: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """What a correct fp8 cache returns for fp32 `x`: x / scale rounded to the nearest e4m3 value
    (ties to even, saturating at the format's max), times scale; fp32. Other dtypes: x rounded
    to `dtype`. Plain fp32 arithmetic: y / 2^(e - 3) is exact, so torch.round's half-to-even is
    the format's rounding."""
    if dtype not in _FP8_FORMAT:
        return x.to(dtype).float()
    fmax, min_exp = _FP8_FORMAT[dtype]
    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device).reshape(())
    y = (x.float() / s).clamp(-fmax, fmax)
    exp = torch.floor(torch.log2(y.abs().clamp_min(2.0**min_exp))).clamp_min(min_exp)
    step = torch.exp2(exp - _MANTISSA_BITS)
    return (torch.round(y / step) * step).clamp(-fmax, fmax) * s


def _to_float(x: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    x32 = x.to(torch.float32)
    if x.dtype in _FP8:
        x32 = x32 * torch.as_tensor(scale, dtype=torch.float32, device=x.device).reshape(())
    return x32


def request_kv_from_cache(
    kv_cache: torch.Tensor, block_row: Sequence[int], seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [seq_len, Hkv, D] of one request, block by block (still in the cache dtype)."""
    block_size = kv_cache.shape[2]
    ks, vs = [], []
    for i in range(-(-seq_len // block_size)):
        block = int(block_row[i])
        n = min(block_size, seq_len - i * block_size)
        ks.append(kv_cache[0, block, :n])
        vs.append(kv_cache[1, block, :n])
    empty = kv_cache.new_zeros((0, *kv_cache.shape[3:]))
    return (torch.cat(ks) if ks else empty), (torch.cat(vs) if vs else empty)


# How much fp32 K and V one batched call of the reference may hold: requests of one shape run
# together up to it (a decode batch of 200 requests of 2,048 tokens at 8 kv heads of 128 is 16 MiB
# a request).
GROUP_BYTES = 512 << 20


def reference_attention(
    query: torch.Tensor,
    k_ctx: Iterable[torch.Tensor],
    v_ctx: Iterable[torch.Tensor],
    query_lens: Sequence[int],
    scale: float,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """Causal attention for a packed batch, fp32.

    query [T, H, D]: tokens of request i are rows sum(query_lens[:i]) .. + query_lens[i].
    k_ctx[i], v_ctx[i] [s_i, Hkv, D]: request i's full sequence (context + this step's tokens), in
      the model dtype or float8 (then multiplied by k_scale / v_scale).
    Token j (0-based) of request i attends positions p <= s_i - q_i + j (bottom-right aligned).
    Returns [T, H, D] float32; rows beyond sum(query_lens) are 0.

    Neighbouring requests of the same query and sequence length run as one batch (a decode batch
    is one call, not one per request); each request still attends only to its own K/V.
    """
    t, h, d = query.shape
    out = torch.zeros(t, h, d, dtype=torch.float32, device=query.device)
    for start, q_len, k, v in same_shape_batches(query_lens, k_ctx, v_ctx):
        n, s, hkv = k.shape[0], k.shape[1], k.shape[2]
        rows = slice(start, start + n * q_len)
        rep = h // hkv
        # GQA without repeating K/V to every query head: the rep query heads of a kv head are
        # rows of one attention over that head's keys ([n, Hkv, rep * q, D]; row r * q + i is
        # query head kv * rep + r at position i), so K/V stay [n, Hkv, s, D] in fp32.
        q = query[rows].to(torch.float32).reshape(n, q_len, hkv, rep, d).permute(0, 2, 3, 1, 4)
        q = q.reshape(n, hkv, rep * q_len, d)
        k32 = _to_float(k, k_scale).transpose(1, 2)  # [n, Hkv, s, D]
        v32 = _to_float(v, v_scale).transpose(1, 2)
        i = torch.arange(q_len, device=query.device)[:, None]
        j = torch.arange(s, device=query.device)[None, :]
        mask = (j <= i + (s - q_len)).repeat(rep, 1)  # [rep * q, s] bottom-right causal
        o = F.scaled_dot_product_attention(q, k32, v32, attn_mask=mask, scale=scale)
        out[rows] = o.reshape(n, hkv, rep, q_len, d).permute(0, 3, 1, 2, 4).reshape(n * q_len, h, d)
    return out


def same_shape_batches(
    query_lens: Sequence[int], k_ctx: Iterable[torch.Tensor], v_ctx: Iterable[torch.Tensor]
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """(first query row, query len, K [n, s, Hkv, D], V) for each run of neighbouring requests of
    one query and sequence length, at most GROUP_BYTES of fp32 K and V a run. Raises for a request
    whose query is longer than its sequence."""
    group: list[tuple[torch.Tensor, torch.Tensor]] = []
    start = g_start = g_len = 0
    g_shape = (0, 0)
    for q_len, k, v in zip(query_lens, k_ctx, v_ctx):
        s = k.shape[0]
        if q_len > s:
            raise ValueError(f"query len {q_len} exceeds sequence length {s}")
        per_request = 2 * s * k.shape[-2] * k.shape[-1] * 4
        if group and (g_shape != (q_len, s) or (len(group) + 1) * per_request > GROUP_BYTES):
            yield g_start, g_len, torch.stack([kv[0] for kv in group]), torch.stack([kv[1] for kv in group])
            group = []
        if not group:
            g_start, g_len, g_shape = start, q_len, (q_len, s)
        group.append((k, v))
        start += q_len
    if group:
        yield g_start, g_len, torch.stack([kv[0] for kv in group]), torch.stack([kv[1] for kv in group])


def reference_from_cache(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    batch: BatchDescription,
    scale: float,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """reference_attention on the K/V a (correct) step left in the cache: query [T, H, D] for the
    real tokens of `batch`; returns [T, H, D] fp32. Read the cache after the step's KV write."""
    ks, vs = [], []
    for i, s in enumerate(batch.seq_lens):
        k, v = request_kv_from_cache(kv_cache, batch.block_table[i].tolist(), s)
        ks.append(k)
        vs.append(v)
    return reference_attention(query, ks, vs, batch.query_lens, scale, k_scale, v_scale)
