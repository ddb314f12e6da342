"""`torch` provider of the MLA family: the absorbed decode and the decompressed prefill in plain
torch (mla_ops.py). CPU and GPU, bf16/fp16/fp32, kv auto/fp8.

Graph-safe: persistent metadata (MLAMetadataBuilder), no host syncs; the host branch on the
decode/prefill split is what UNIFORM_BATCH allows (a FULL graph only ever holds a uniform decode
batch, all of it on the decode path). Declares UNIFORM_BATCH, as vLLM's MLA backends do.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from backend.attention.mla import MLABackend, MLAImpl
from backend.providers import mla_ops


class TorchMLAImpl(MLAImpl):
    def forward(self, q, kv_c, k_pe, kv_cache, metadata, k_scale, output, w_uk_t, w_uv):
        self.write(kv_cache, kv_c, k_pe, metadata, k_scale)
        return self.attend(q, kv_cache, metadata, k_scale, output, w_uk_t, w_uv)

    # Separate steps, as TorchImpl's: the mutation suite's broken backends replace one.
    def write(self, kv_cache, kv_c, k_pe, metadata, k_scale) -> None:
        mla_ops.write_latent(kv_cache, kv_c, k_pe, metadata.slot_mapping, k_scale)

    def attend(self, q, kv_cache, md, k_scale, output, w_uk_t, w_uv):
        dims, scale = self.dims, self.config.scale
        dt, npt = md.num_decode_tokens, md.num_prefill_tokens
        if dt:
            o_lat = self.decode(mla_ops.absorb_query(q[:dt], w_uk_t, dims), kv_cache, md, k_scale)
            output[:dt].copy_(mla_ops.up_project(o_lat.to(q.dtype), w_uv))
        if npt:
            res = mla_ops.decompressed_prefill(q, kv_cache, md, k_scale, scale, dims, w_uk_t, w_uv)
            output[dt : dt + npt].copy_(res.to(output.dtype))
        return output

    def decode(self, qq, kv_cache, md, k_scale) -> torch.Tensor:
        """The decode tokens' latent output o_lat fp32 [num_decode_tokens, Hl, L]."""
        return mla_ops.absorbed_decode(qq, kv_cache, md, k_scale, self.config.scale, self.dims, md.num_decode_tokens)


class TorchMLABackend(MLABackend):
    name: ClassVar[str] = "torch"
    impl_cls = TorchMLAImpl

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        from backend.attention.capabilities import device_class, torch_unavailable

        return torch_unavailable(device_class(device))
