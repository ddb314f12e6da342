"""Semantics of the emulated AITER ops that graphs freeze (DESIGN.md §3)."""

from __future__ import annotations

import torch

from backend.harness.reference import reference_attention
from backend.providers import aiter_ops_emulated as ops

SENTINEL = 7.0


def _packed(qlens, klens, h=4, hkv=2, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(qlens), h, d, generator=g)
    k = torch.randn(sum(klens), hkv, d, generator=g)
    v = torch.randn(sum(klens), hkv, d, generator=g)
    cu = lambda xs: torch.tensor([0, *torch.tensor(xs).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu(qlens), cu(klens)


def _ref(q, k, v, qlens, klens, scale):
    ks = torch.split(k, klens)
    vs = torch.split(v, klens)
    return reference_attention(q, ks, vs, qlens, scale)


def test_varlen_skips_rows_at_or_below_min_seqlen_q():
    qlens, klens = [1, 5, 1, 3], [9, 5, 4, 7]
    q, k, v, cu_q, cu_k = _packed(qlens, klens)
    out = torch.full_like(q, SENTINEL)
    ops.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(qlens), max(klens), min_seqlen_q=1, softmax_scale=0.3, causal=True, out=out
    )
    ref = _ref(q, k, v, qlens, klens, 0.3)
    decode_rows = [0, 6]
    assert (out[decode_rows] == SENTINEL).all(), "decode rows are left unwritten"
    prefill_rows = [1, 2, 3, 4, 5, 7, 8, 9]
    torch.testing.assert_close(out[prefill_rows], ref[prefill_rows], atol=1e-5, rtol=1e-5)


def test_varlen_frozen_max_seqlen_q_truncates_rows():
    """The hazard: a graph captured with max_seqlen_q=2 replayed on a batch with a 5-token row."""
    qlens, klens = [5, 2], [5, 6]
    q, k, v, cu_q, cu_k = _packed(qlens, klens, seed=1)
    out = torch.full_like(q, SENTINEL)
    ops.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 2, max(klens), min_seqlen_q=1, softmax_scale=0.3, causal=True, out=out
    )
    ref = _ref(q, k, v, qlens, klens, 0.3)
    torch.testing.assert_close(out[[0, 1, 5, 6]], ref[[0, 1, 5, 6]], atol=1e-5, rtol=1e-5)
    assert (out[2:5] == SENTINEL).all(), "rows past the frozen max_seqlen_q are not computed"


def test_varlen_never_reads_keys_outside_a_rows_window():
    """K/V rows no request's window covers may hold anything (vLLM 0.10.2 gathers into torch.empty
    buffers and leaves the decode requests' rows unwritten): NaN there must not reach a prefill row
    through 0 * NaN in P @ V. Broken on purpose (without the zeroing) the prefill rows turn NaN."""
    qlens, klens = [3, 1], [4, 6]  # the launch covers max_seqlen_k = 6 keys of the 4-key prefill
    q, k, v, cu_q, cu_k = _packed(qlens, klens, seed=3)
    k[4:], v[4:] = float("nan"), float("nan")  # the decode request's K/V: never written, never read
    out = torch.full_like(q, SENTINEL)
    ops.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 6, min_seqlen_q=1, softmax_scale=0.3, causal=True, out=out)
    torch.testing.assert_close(out[:3], _ref(q, k, v, qlens, klens, 0.3)[:3], atol=1e-5, rtol=1e-5)
    assert (out[3] == SENTINEL).all()


def test_varlen_causal_is_bottom_right():
    qlens, klens = [2], [5]
    q, k, v, cu_q, cu_k = _packed(qlens, klens, seed=2)
    out = ops.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, 5, softmax_scale=0.3, causal=True)
    torch.testing.assert_close(out, _ref(q, k, v, qlens, klens, 0.3), atol=1e-5, rtol=1e-5)


def _paged(seq_lens, block_size=4, hkv=2, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    nb = -(-max(seq_lens) // block_size)
    num_blocks = len(seq_lens) * nb + 1
    cache = torch.randn(2, num_blocks, block_size, hkv, d, generator=g)
    table = (torch.arange(len(seq_lens) * nb) + 1).view(len(seq_lens), nb).to(torch.int32)
    return cache, table


def test_paged_decode_returns_early_for_multi_token_rows():
    qlens, slens = [1, 4, 1], [6, 9, 11]
    cache, table = _paged(slens)
    q = torch.randn(sum(qlens), 4, 8)
    out = torch.full_like(q, SENTINEL)
    cu_q = torch.tensor([0, 1, 5, 6], dtype=torch.int32)
    ws = torch.empty(ops.workspace_bytes(3, 4, 8, 16, out.dtype), dtype=torch.uint8)
    one = torch.ones(1)
    ops.paged_attention_v1(
        out,
        ws,
        q,
        cache[0],
        cache[1],
        0.3,
        table,
        cu_q,
        torch.tensor(slens, dtype=torch.int32),
        16,
        None,
        "auto",
        "NHD",
        0.0,
        one,
        one,
    )
    assert (out[1:5] == SENTINEL).all(), "the q=4 request is not written"
    for tok, r in ((0, 0), (5, 2)):
        k = cache[0, table[r]].flatten(0, 1)[: slens[r]]
        vv = cache[1, table[r]].flatten(0, 1)[: slens[r]]
        ref = reference_attention(q[tok : tok + 1], [k], [vv], [1], 0.3)
        torch.testing.assert_close(out[tok : tok + 1], ref, atol=1e-5, rtol=1e-5)


def test_paged_decode_frozen_max_context_len_limits_positions():
    slens = [13]
    cache, table = _paged(slens)
    q = torch.randn(1, 4, 8)
    one = torch.ones(1)
    ws = torch.empty(ops.workspace_bytes(1, 4, 8, 16, q.dtype, 4), dtype=torch.uint8)
    ctx = torch.tensor(slens, dtype=torch.int32)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    full = ops.paged_attention_v1(
        torch.zeros_like(q),
        ws,
        q,
        cache[0],
        cache[1],
        0.3,
        table,
        cu,
        ctx,
        16,
        None,
        "auto",
        "NHD",
        0.0,
        one,
        one,
        partition_size=4,
    )
    short = ops.paged_attention_v1(
        torch.zeros_like(q),
        ws,
        q,
        cache[0],
        cache[1],
        0.3,
        table,
        cu,
        ctx,
        8,
        None,
        "auto",
        "NHD",
        0.0,
        one,
        one,
        partition_size=4,
    )
    k, v = cache[0, table[0]].flatten(0, 1), cache[1, table[0]].flatten(0, 1)
    torch.testing.assert_close(full, reference_attention(q, [k[:13]], [v[:13]], [1], 0.3), atol=1e-5, rtol=1e-5)
    # Captured with max_context_len 8: only the first two partitions (8 positions) are attended.
    torch.testing.assert_close(short, reference_attention(q, [k[:8]], [v[:8]], [1], 0.3), atol=1e-5, rtol=1e-5)


def test_paged_decode_reads_scales_live_and_refuses_small_workspace():
    cache, table = _paged([5])
    fp8 = cache.to(torch.float8_e4m3fn)
    q = torch.randn(1, 4, 8)
    ctx, cu = torch.tensor([5], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    ws = torch.empty(ops.workspace_bytes(1, 4, 8, 8, q.dtype), dtype=torch.uint8)
    k_scale, v_scale = torch.ones(1), torch.ones(1)
    a = ops.paged_attention_v1(
        torch.zeros_like(q), ws, q, fp8[0], fp8[1], 0.3, table, cu, ctx, 8, None, "fp8", "NHD", 0.0, k_scale, v_scale
    ).clone()
    v_scale.fill_(3.0)  # same tensor object, new value: what a graph replay would see
    b = ops.paged_attention_v1(
        torch.zeros_like(q), ws, q, fp8[0], fp8[1], 0.3, table, cu, ctx, 8, None, "fp8", "NHD", 0.0, k_scale, v_scale
    )
    torch.testing.assert_close(b, a * 3.0, atol=1e-5, rtol=1e-5)
    import pytest

    with pytest.raises(ValueError, match="workspace"):
        ops.paged_attention_v1(
            torch.zeros_like(q),
            ws[:8],
            q,
            fp8[0],
            fp8[1],
            0.3,
            table,
            cu,
            ctx,
            8,
            None,
            "fp8",
            "NHD",
            0.0,
            k_scale,
            v_scale,
        )
