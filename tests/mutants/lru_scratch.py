"""Bug class: a device tensor kept in a per-call cache, read by a graph captured on a cache hit
(AITER's `mla_decode_fwd` keeps its split indptr in an `lru_cache`: ROCm/aiter#5193, #4587, #5194;
the same class: ROCm/aiter#5393, NVIDIA/TensorRT-LLM#14297).

`Backend` scales each output row by a per-size device vector of ones from an `lru_cache(maxsize=1)`:
eager is right. The warm-up before each capture fills the cache (a miss), the capture reads the
cached tensor (a hit) and records only its address; the next call with another size evicts it, the
allocator hands its block to something else, and every replay reads that. Once, the replay ran
right after capture with little allocated in between and read the right bytes (red on an H200 in
FULL, green in FULL_AND_PIECEWISE by luck), and the CPU emulation kept every captured tensor alive:
green everywhere. `Fixed` keeps the same vectors in a persistent buffer of the Impl: green.
"""

from __future__ import annotations

import functools

import torch

from backend.providers.torch_backend import TorchBackend, TorchImpl


@functools.lru_cache(maxsize=1)
def _row_scale(num_tokens: int, device: torch.device) -> torch.Tensor:
    return torch.ones(num_tokens, 1, 1, device=device)  # one per output row, allocated on a miss


class _LruImpl(TorchImpl):
    def row_scale(self, num_tokens: int, device: torch.device) -> torch.Tensor:
        return _row_scale(num_tokens, device)

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        out = super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        t = metadata.num_padded_tokens
        out[:t].mul_(self.row_scale(t, out.device))
        return out


class _PersistentImpl(_LruImpl):
    """The fix: the scale lives as long as the Impl (as the graphs that read it)."""

    def __init__(self, config):
        super().__init__(config)
        self.scale = torch.ones(config.max_num_tokens, 1, 1, device=config.device)

    def row_scale(self, num_tokens: int, device: torch.device) -> torch.Tensor:
        return self.scale[:num_tokens]


class Backend(TorchBackend):
    name = "mutant-lru-scratch"
    impl_cls = _LruImpl


class Fixed(TorchBackend):
    name = "mutant-lru-scratch-fixed"
    impl_cls = _PersistentImpl
