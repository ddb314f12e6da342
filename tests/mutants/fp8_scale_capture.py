"""Bug class: fp8 KV cache wrong under FULL only (vLLM #49010).

On the capture path (metadata built by build_for_capture) the Impl replaces the live k/v scale
tensors with a constant 1.0 made during capture, as a wrapper that turned the scale into a
python float at capture would. Replays then quantise and dequantise with the wrong scale. With
kv auto the scales are 1.0 anyway, and eager/PIECEWISE attention never takes that path.
"""

from __future__ import annotations

import torch

from backend.providers.torch_backend import TorchBackend, TorchImpl


class Fp8ScaleCaptureImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        if metadata.for_capture:
            k_scale = torch.ones_like(k_scale)  # frozen constant in the graph
            v_scale = torch.ones_like(v_scale)
        return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)


class Backend(TorchBackend):
    name = "mutant-fp8-scale-capture"
    impl_cls = Fp8ScaleCaptureImpl
