"""`torch` provider of the hybrid_gdn family: GatedDeltaNet's core in plain torch (gdn_ops.py: the
decode and verify rows vectorised and graph-safe, prefill rows chunked and eager) over orch's GDN
builder (backend/attention/gdn.py); the attention layers are swa_sinks' torch provider without a
window or sinks (vLLM TRITON_ATTN's structure, what Qwen3-Next's attention layers run on NVIDIA)
over the attention group's metadata, which its builder reads off the shared common metadata as
vLLM's do (the token count from query_start_loc_cpu). CPU and GPU; UNIFORM_BATCH, as vLLM's GDN
backend declares.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from backend.attention.gdn import GDNImpl, HybridGDNBackend, HybridImpl
from backend.attention.swa import SWAMetadataBuilder
from backend.providers import gdn_ops
from backend.providers.torch_swa import TorchSWAImpl


class TorchGDNImpl(GDNImpl):
    # The mutation suite's broken kernel sets this (gdn_ops.gdn_core).
    padded_conv_unwritten: ClassVar[bool] = False

    def forward(self, mixed_qkv, b, a, page, layout, md, weights, out):
        return gdn_ops.gdn_core(
            mixed_qkv, b, a, page, layout, md, weights, out, self.dims, padded_conv_unwritten=self.padded_conv_unwritten
        )


class TorchHybridImpl(HybridImpl):
    attention_cls = TorchSWAImpl
    gdn_cls = TorchGDNImpl


class TorchHybridGDNBackend(HybridGDNBackend):
    name: ClassVar[str] = "torch"
    attention_builder_cls = SWAMetadataBuilder
    impl_cls = TorchHybridImpl

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        from backend.attention.capabilities import device_class, torch_unavailable

        return torch_unavailable(device_class(device))
