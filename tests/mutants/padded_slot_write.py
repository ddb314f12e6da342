"""Bug class: padded tokens writing the KV cache (vLLM #57017, #37682).

The KV write indexes the flattened cache with slot_mapping as is, so a padded token's slot -1
wraps to the last slot of the cache (python-style negative indexing), overwriting whatever real
request owns it. Only a padded FULL replay has -1 slots: eager and PIECEWISE attention run on
unpadded metadata.
"""

from __future__ import annotations

import torch

from backend.attention.kv_cache import quantize_fp8
from backend.harness.checks import raw
from backend.providers.torch_backend import TorchBackend, TorchImpl

_FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def wrapping_write(kv_cache, key, value, slot_mapping, k_scale, v_scale) -> None:
    num_slots = kv_cache.shape[1] * kv_cache.shape[2]
    index = slot_mapping.remainder(num_slots)  # -1 -> num_slots - 1: the bug
    for cache, x, scale in ((kv_cache[0], key, k_scale), (kv_cache[1], value, v_scale)):
        flat = cache.reshape(num_slots, *cache.shape[2:])
        x = x[: slot_mapping.shape[0]]
        new = quantize_fp8(x, scale, flat.dtype) if flat.dtype in _FP8 else x.to(flat.dtype)
        raw(flat).index_copy_(0, index, raw(new))  # bytes: index_copy_ has no fp8 kernel on CPU


class PaddedSlotWriteImpl(TorchImpl):
    def write(self, kv_cache, key, value, metadata, k_scale, v_scale) -> None:
        wrapping_write(kv_cache, key, value, metadata.slot_mapping, k_scale, v_scale)


class Backend(TorchBackend):
    name = "mutant-padded-slot-write"
    impl_cls = PaddedSlotWriteImpl
