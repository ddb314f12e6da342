"""The KV cache in vLLM's layout, seen by the checker as ours ([2, num_blocks, block_size, Hkv, D],
backend/attention/interface.py) without a copy, so context writes, snapshots and the KV-integrity
check read vLLM's bytes.

- 0.33/0.34 (current): logical [num_blocks, Hkv, block_size, 2 * D] (K | V in the content dim),
  physical order from the backend's supported_kv_cache_layouts() (LBNHC when it states none); we
  hold a strided view of it, and hand vLLM its logical view (as_vllm_view).
- 0.10/0.11 (old): get_kv_cache_shape() is (2, num_blocks, block_size, Hkv, D), our own layout: the
  same tensor on both sides. Only the fp8 format can differ: the cache holds what vLLM's Impl reads
  (0.10.2's ROCM_AITER_FA views it as float8_e4m3fnuz whatever the platform, old.py)."""

from __future__ import annotations

import torch

from backend.attention.interface import AttentionConfig
from backend.attention.kv_cache import kv_cache_torch_dtype


def allocate_in_layout(config: AttentionConfig, layout) -> torch.Tensor:
    """One layer's cache in vLLM's physical order (a KVCacheLayout), returned as our
    [2, B, N, Hkv, D] view of it."""
    b, h, n, d = config.num_blocks, config.num_kv_heads, config.block_size, config.head_size
    logical = (b, h, n, 2 * d)
    order = layout.layer_view_order  # physical axis order of the logical [B, H, N, C] view
    if order[-1] != 3:
        raise ValueError(f"KV layout {layout.name}: the content dim is not innermost")
    physical = torch.zeros([logical[i] for i in order], dtype=kv_cache_torch_dtype(config), device=config.device)
    vllm_view = physical.permute([order.index(i) for i in range(4)])  # logical [B, H, N, 2D]
    sb, sh, sn, sc = vllm_view.stride()
    return physical.as_strided((2, b, n, h, d), (d * sc, sb, sn, sh, sc), physical.storage_offset())


def as_vllm_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """Our [2, B, N, Hkv, D] view (allocate_in_layout) -> vLLM's logical [B, Hkv, N, 2D]."""
    _, b, n, h, d = kv_cache.shape
    _, sb, sn, sh, sc = kv_cache.stride()
    return kv_cache.as_strided((b, h, n, 2 * d), (sb, sh, sn, sc), kv_cache.storage_offset())


def allocate_plain(config: AttentionConfig, shape: tuple[int, ...], fp8: torch.dtype | None = None) -> torch.Tensor:
    """A cache of vLLM's get_kv_cache_shape(), which must be ours: (2, num_blocks, block_size, Hkv,
    D). `fp8`: the float8 format vLLM's Impl reads an fp8 cache as, when it is not ours."""
    ours = (2, config.num_blocks, config.block_size, config.num_kv_heads, config.head_size)
    if tuple(shape) != ours:
        raise ValueError(f"vLLM's kv cache shape {tuple(shape)} is not orch's {ours}")
    dtype = kv_cache_torch_dtype(config)
    if config.kv_cache_dtype == "fp8" and fp8 is not None:
        dtype = fp8
    return torch.zeros(ours, dtype=dtype, device=config.device)
