"""KV-cache dtype helpers and the graph-safe KV write shared by every provider.

Cache layout (interface.py): kv_cache [2, num_blocks, block_size, Hkv, D], NHD, block 0 = null block.
fp8 caches hold float8 values; k_scale/v_scale are [1] float32 device tensors read live, so a
captured graph sees scale changes.
"""

from __future__ import annotations

import functools

import torch

from backend.attention.interface import AttentionConfig


@functools.cache
def _is_gfx942(device_index: int) -> bool:
    props = torch.cuda.get_device_properties(device_index)
    return "gfx942" in getattr(props, "gcnArchName", "")


def fp8_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """float8_e4m3fnuz on gfx942 (MI300), else float8_e4m3fn (NVIDIA, gfx950, CPU)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda" and torch.version.hip is not None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if _is_gfx942(index):
            return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def kv_cache_torch_dtype(config: AttentionConfig) -> torch.dtype:
    """The dtype a kv cache for `config` is allocated with."""
    return fp8_dtype(config.device) if config.kv_cache_dtype == "fp8" else config.dtype


def allocate_kv_cache(config: AttentionConfig, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """A zeroed cache of the backend's shape (2, num_blocks, block_size, Hkv, D)."""
    shape = shape or (2, config.num_blocks, config.block_size, config.num_kv_heads, config.head_size)
    return torch.zeros(shape, dtype=kv_cache_torch_dtype(config), device=config.device)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x / scale -> float8, saturating (a plain cast of an out-of-range value gives NaN in e4m3fn)."""
    fmax = torch.finfo(dtype).max
    return (x.float() / scale.float()).clamp(-fmax, fmax).to(dtype)


def dequantize(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """Cache values -> float32 (float8 * scale; other dtypes as they are)."""
    if x.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        return fp8_to_float(x).mul_(scale.float())  # a fresh tensor: scaled in place
    return x.float()


# Every float8 value as float32, by byte, from torch's own conversion (so a lookup is bitwise what
# x.float() gives, NaN payloads included). On the CPU x.float() converts float8 one element at a
# time, ~20x slower than bf16, and the providers' gathers dequantise every token's K/V: a lookup
# by byte is ~2x faster there. Built at import, outside any graph capture.
_FP8_TABLES = {
    dt: torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dt).float()
    for dt in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
}


def fp8_to_float(x: torch.Tensor) -> torch.Tensor:
    """float8 -> float32, equal bit for bit to x.float(): a table lookup by byte on the CPU; the
    device's own conversion elsewhere (a GPU converts natively)."""
    if x.device.type != "cpu":
        return x.float()
    # index_select takes int32 indices: half the bytes of take()'s int64 ones, ~1.5x faster.
    return _FP8_TABLES[x.dtype].index_select(0, x.view(torch.uint8).flatten().int()).view(x.shape)


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _raw(t: torch.Tensor) -> torch.Tensor:
    # Bit-level view: the write below copies bytes back unchanged, even NaN payloads and fp8.
    return t.view(_SAME_SIZE_INT[t.element_size()])


def write_kv(
    kv_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> None:
    """Scatter this step's K/V [T, Hkv, D] into the cache at slot_mapping [T'] (T' <= T).

    Slots of -1 write nothing, graph-safely: no host sync, no boolean-mask indexing. A -1 slot is
    redirected to slot 0 (inside the null block, which no real token writes), whose bytes are kept
    before the write and put back after it when the batch had a -1 slot, so nothing in the cache
    changes for padded tokens. (One pass over the written rows: reading every redirected row back
    and selecting per row cost three, on GBs of context a step at GPU shapes.)
    """
    write_slots(kv_cache[0], key, slot_mapping, k_scale)
    write_slots(kv_cache[1], value, slot_mapping, v_scale)


def write_slots(cache: torch.Tensor, x: torch.Tensor, slot_mapping: torch.Tensor, scale: torch.Tensor) -> None:
    """write_kv for one of K or V: cache [num_blocks, block_size, Hkv, D]. The cache may be a
    strided view (a vLLM-layout cache seen as ours) as long as (num_blocks, block_size) flatten
    into one slot dim without a copy."""
    num_slots = cache.shape[0] * cache.shape[1]
    n = slot_mapping.shape[0]
    index = slot_mapping.clamp(min=0)
    try:
        flat = cache.view(num_slots, *cache.shape[2:])  # [num_slots, Hkv, D]
    except RuntimeError:
        raise ValueError(
            "kv_cache blocks and slots must flatten without a copy (the write goes through a flat view)"
        ) from None
    x = x[:n]
    new = (
        quantize_fp8(x, scale, flat.dtype)
        if flat.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
        else x.to(flat.dtype)
    )
    raw = _raw(flat)
    null = raw[:1].clone()  # slot 0 as it was
    raw.index_copy_(0, index, _raw(new))
    raw[:1].copy_(torch.where((slot_mapping < 0).any(), null, raw[:1]))
