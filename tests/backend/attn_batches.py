"""Batch builders for backend tests: vLLM-style paged batches with context already in the cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.attention.interface import AttentionConfig, BatchDescription
from backend.attention.kv_cache import allocate_kv_cache, write_kv


def make_config(
    *,
    num_heads=4,
    num_kv_heads=2,
    head_size=16,
    block_size=4,
    max_model_len=64,
    max_num_seqs=8,
    max_num_tokens=64,
    dtype=torch.bfloat16,
    kv_cache_dtype="auto",
    num_blocks=0,
) -> AttentionConfig:
    max_blocks = -(-max_model_len // block_size)
    return AttentionConfig(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        block_size=block_size,
        num_blocks=num_blocks or max_num_seqs * max_blocks + 1,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_tokens=max_num_tokens,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        device=torch.device("cpu"),
        scale=head_size**-0.5,
    )


@dataclass
class Step:
    batch: BatchDescription
    query: torch.Tensor  # [T, H, D]
    key: torch.Tensor  # [T, Hkv, D] this step's new K
    value: torch.Tensor
    kv_cache: torch.Tensor  # context already written
    k_scale: torch.Tensor
    v_scale: torch.Tensor


def make_step(config: AttentionConfig, query_lens, seq_lens, *, seed=0, shuffle=True, k_scale=1.0, v_scale=1.0) -> Step:
    """Requests get distinct non-null blocks (a random permutation when shuffle, so block tables
    are non-contiguous); positions 0..s-q-1 (context) are written to the cache now, the last q
    are this step's new tokens."""
    g = torch.Generator().manual_seed(seed)
    c = config
    bs, nb = c.block_size, c.max_blocks_per_seq
    pool = torch.randperm(c.num_blocks - 1, generator=g) + 1 if shuffle else torch.arange(1, c.num_blocks)
    block_table = torch.zeros(len(query_lens), nb, dtype=torch.int32)
    used = 0
    for i, s in enumerate(seq_lens):
        need = -(-s // bs)
        block_table[i, :need] = pool[used : used + need].to(torch.int32)
        used += need
    slots_ctx, slots_new = [], []
    for i, (q, s) in enumerate(zip(query_lens, seq_lens)):
        for p in range(s):
            slot = int(block_table[i, p // bs]) * bs + p % bs
            (slots_new if p >= s - q else slots_ctx).append(slot)
    kv_cache = allocate_kv_cache(c)
    ks, vs = torch.tensor([k_scale]), torch.tensor([v_scale])
    n_ctx = len(slots_ctx)
    if n_ctx:
        kc = torch.randn(n_ctx, c.num_kv_heads, c.head_size, generator=g) * k_scale
        vc = torch.randn(n_ctx, c.num_kv_heads, c.head_size, generator=g) * v_scale
        write_kv(kv_cache, kc, vc, torch.tensor(slots_ctx), ks, vs)
    t = sum(query_lens)
    query = torch.randn(t, c.num_heads, c.head_size, generator=g).to(c.dtype)
    key = (torch.randn(t, c.num_kv_heads, c.head_size, generator=g) * k_scale).to(c.dtype)
    value = (torch.randn(t, c.num_kv_heads, c.head_size, generator=g) * v_scale).to(c.dtype)
    batch = BatchDescription(list(query_lens), list(seq_lens), block_table, torch.tensor(slots_new, dtype=torch.int64))
    return Step(batch, query, key, value, kv_cache, ks, vs)


def run_backend(backend_cls, config: AttentionConfig, step: Step, num_padded_tokens=None, num_padded_reqs=None):
    """Build + forward once; returns the output rows of the real tokens [T, H, D]."""
    builder = backend_cls.builder_cls(config)
    impl = backend_cls.impl_cls(config)
    md = builder.build(step.batch, num_padded_tokens, num_padded_reqs)
    tp = md.num_padded_tokens
    pad = tp - step.query.shape[0]

    def padded(x):
        return torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) if pad else x

    out = torch.full((tp, config.num_heads, config.head_size), float("nan"), dtype=config.dtype)
    impl.forward(
        padded(step.query), padded(step.key), padded(step.value), step.kv_cache, md, step.k_scale, step.v_scale, out
    )
    return out
