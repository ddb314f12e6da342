"""MLA providers against the family's fp32 reference at op level (no model, no graphs): every
provider that runs here, on decode, verify, mixed and prefill batches, kv auto and fp8; the
builder's split and its decode-only capture; AITER's emulated mla_decode_fwd against a direct
computation."""

from __future__ import annotations

import pytest
import torch

from backend.attention.interface import AttentionConfig, BatchDescription
from backend.attention.kv_cache import allocate_kv_cache, fp8_dtype
from backend.attention.mla import MLADims, split_decodes_and_prefills
from backend.attention.registry import get_backend
from backend.families.mla import reference_absorbed, reference_decompressed, split_kv_b
from backend.harness.reference import fp8_round
from backend.providers import aiter_ops_emulated

D = MLADims(kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16)
H, BS = 4, 4


def make_config(kv="auto", spec_tokens=0, max_model_len=64, max_num_seqs=8) -> AttentionConfig:
    nb = max_num_seqs * (-(-max_model_len // BS)) + 1
    return AttentionConfig(
        num_heads=H,
        num_kv_heads=1,
        head_size=D.row,
        block_size=BS,
        num_blocks=nb,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_tokens=256,
        dtype=torch.bfloat16,
        kv_cache_dtype=kv,
        device=torch.device("cpu"),
        scale=(D.qk_nope_head_dim + D.qk_rope_head_dim) ** -0.5,
        spec_tokens=spec_tokens,
        attention="mla",
        dims=(("kv_lora_rank", 32), ("qk_nope_head_dim", 16), ("qk_rope_head_dim", 16), ("v_head_dim", 16)),
    )


def run_op(backend: str, config: AttentionConfig, query_lens, seq_lens, k_scale=1.0, seed=0):
    """One forward over a batch whose context is already in the cache; returns the provider's
    output and the reference's, both [T, H, V] fp32 (the reference on the rows the cache holds)."""
    g = torch.Generator().manual_seed(seed)
    nb = config.max_blocks_per_seq
    pool = torch.randperm(config.num_blocks - 1, generator=g) + 1
    table = torch.zeros(len(query_lens), nb, dtype=torch.int32)
    used, slots_ctx, slots_new = 0, [], []
    for i, s in enumerate(seq_lens):
        need = -(-s // BS)
        table[i, :need] = pool[used : used + need].to(torch.int32)
        used += need
        for p in range(s):
            (slots_new if p >= s - query_lens[i] else slots_ctx).append(int(table[i, p // BS]) * BS + p % BS)
    cls = get_backend(backend, "mla")
    cache = allocate_kv_cache(config, tuple(cls.kv_cache_shape(config.num_blocks, BS, 1, D.row)))
    ks = torch.tensor([k_scale])
    t = sum(query_lens)
    ctx = torch.randn(len(slots_ctx), D.row, generator=g)
    cache_dt = cache.dtype
    from backend.attention.kv_cache import write_slots

    write_slots(cache, ctx, torch.tensor(slots_ctx, dtype=torch.int64), ks)
    q = torch.randn(t, H, D.qk_nope_head_dim + D.qk_rope_head_dim, generator=g).to(config.dtype)
    kv_c = torch.randn(t, D.kv_lora_rank, generator=g).to(config.dtype)
    k_pe = torch.randn(t, D.qk_rope_head_dim, generator=g).to(config.dtype)
    w_kv_b = (
        (torch.randn(H * (D.qk_nope_head_dim + D.v_head_dim), D.kv_lora_rank, generator=g) / D.kv_lora_rank**0.5)
        .to(config.dtype)
        .float()
    )
    w_uk, w_uv = split_kv_b(w_kv_b, H, D)
    builder, impl = cls.builder_cls(config), cls.impl_cls(config)
    md = builder.build(BatchDescription(list(query_lens), list(seq_lens), table, torch.tensor(slots_new)))
    out = torch.full((t, H, D.v_head_dim), float("nan"), dtype=config.dtype)
    impl.forward(
        q,
        kv_c,
        k_pe,
        cache,
        md,
        ks,
        out,
        w_uk.permute(1, 2, 0).to(config.dtype).contiguous(),
        w_uv.permute(1, 0, 2).to(config.dtype).contiguous(),
    )
    # Reference: each request's rows as the cache stores them (fp8 rounding with the same scale).
    new = fp8_round(torch.cat([kv_c, k_pe], 1).float(), ks, cache_dt)
    ctx_r = fp8_round(ctx, ks, cache_dt)
    refs, c0, n0 = [], 0, 0
    for ql, s in zip(query_lens, seq_lens):
        rows = torch.cat([ctx_r[c0 : c0 + s - ql], new[n0 : n0 + ql]])
        fn = reference_absorbed if ql == 1 else reference_decompressed
        refs.append(fn(q[n0 : n0 + ql], rows, w_uk, w_uv, D, config.scale))
        c0, n0 = c0 + s - ql, n0 + ql
    return out.float(), torch.cat(refs)


BATCHES = {
    "decode": ([1, 1, 1], [9, 33, 64]),
    "mixed, decodes first": ([1, 1, 6, 3], [12, 40, 6, 25]),
    "prefill only": ([5, 9], [5, 30]),
}
PROVIDERS = ["torch", "aiter-emulated"]


@pytest.mark.parametrize("backend", PROVIDERS)
@pytest.mark.parametrize("name", BATCHES)
@pytest.mark.parametrize("kv, k_scale", [("auto", 1.0), ("fp8", 0.05)])
def test_provider_matches_the_reference(backend, name, kv, k_scale):
    out, ref = run_op(backend, make_config(kv), *BATCHES[name], k_scale=k_scale)
    assert torch.isfinite(out).all()
    tol = 3e-2 if kv == "auto" else 6e-2  # bf16 q', o_lat; fp8 rows one e4m3 step apart at worst
    rel = (out - ref).norm() / ref.norm()
    assert rel < tol, f"{backend} {name} {kv}: relative error {rel:.3g}"


@pytest.mark.parametrize("backend", PROVIDERS)
def test_verify_rows_take_the_decode_path_with_their_causal_block(backend):
    """k = 2: rows of q = 3 are decodes (threshold 3) and each token sees its own prefix."""
    config = make_config(spec_tokens=2)
    out, ref = run_op(backend, config, [3, 3, 5], [20, 41, 9])
    assert (out - ref).norm() / ref.norm() < 3e-2


@pytest.mark.parametrize(
    "query_lens, threshold, uniform, want",
    [
        ([1, 1, 1], 1, True, (3, 0, 3, 0)),
        ([1, 1, 4], 1, True, (2, 1, 2, 4)),
        ([3, 3, 5], 3, True, (2, 1, 6, 5)),
        ([3, 2, 5], 3, True, (1, 2, 3, 7)),  # a short extend of another length is a prefill
        ([3, 2, 5], 3, False, (2, 1, 5, 5)),
        ([5, 1], 1, True, (0, 2, 0, 6)),  # not reordered: the first row decides
        ([1, 1, 0, 0], 1, True, (4, 0, 2, 0)),  # padded requests of a uniform batch count as decodes
    ],
)
def test_split_decodes_and_prefills_as_vllm(query_lens, threshold, uniform, want):
    assert split_decodes_and_prefills(query_lens, threshold, uniform) == want


def test_capture_is_decode_only():
    cls = get_backend("torch", "mla")
    builder = cls.builder_cls(make_config(spec_tokens=2))
    md = builder.build_for_capture(9, 3)
    assert (md.num_decodes, md.num_decode_tokens, md.num_prefills) == (3, 9, 0) and md.max_query_len == 3
    with pytest.raises(AssertionError, match="decode-only full CUDAGraph capture"):
        builder.build_for_capture(8, 0)  # a mixed graph
    with pytest.raises(AssertionError, match="decode-only"):
        cls.builder_cls(make_config()).build_for_capture(8, 2)  # q above the threshold 1


def test_emulated_mla_decode_fwd_against_a_direct_computation():
    """Rows over their kv_indices ranges, one query token each; a row with no keys unwritten."""
    g = torch.Generator().manual_seed(5)
    slots, dqk, dv = 40, 24, 16
    kv = torch.randn(slots, 1, 1, dqk, generator=g)
    q = torch.randn(3, 2, dqk, generator=g)
    kv_indptr = torch.tensor([0, 4, 4, 9], dtype=torch.int32)  # row 1 has no keys
    kv_indices = torch.cat([torch.randperm(slots, generator=g)[:9], torch.zeros(7, dtype=torch.int64)]).int()
    o = torch.full((3, 2, dv), 7.0)
    aiter_ops_emulated.mla_decode_fwd(
        q,
        kv,
        o,
        torch.arange(4, dtype=torch.int32),
        kv_indptr,
        kv_indices,
        torch.ones(3, dtype=torch.int32),
        1,
        sm_scale=0.3,
    )
    for row, (a, b) in enumerate(((0, 4), (4, 4), (4, 9))):
        if a == b:
            assert torch.equal(o[row], torch.full((2, dv), 7.0))
            continue
        k = kv.view(slots, dqk)[kv_indices[a:b].long()]
        p = torch.softmax(q[row] @ k.t() * 0.3, dim=-1)
        torch.testing.assert_close(o[row], p @ k[:, :dv], atol=1e-5, rtol=1e-5)


def test_fp8_cache_dtype_is_the_platforms():
    assert allocate_kv_cache(make_config("fp8"), (3, BS, D.row)).dtype == fp8_dtype("cpu")
