"""Bug class: a graph that froze a host copy of the fp8 KV scale (vLLM layers keep `_k_scale_float`
/ `_v_scale_float`, Python floats of the scale tensors, and some backends hand those to their
kernels; when the scales change after capture, e.g. computed from the first batches, the graphs
keep the old floats).

The Impl refreshes its float copies whenever it runs eagerly (a host sync, allowed outside a
capture) and quantises and dequantises with tensors made from them, so a capture freezes the floats
of the eager run before it (the warm-up). Eager is right in every step; a replay is right only
while the live scales equal the ones the graph was captured under. Once, a graph captured
under the previous case's scales passed whenever that case had the same seed: the case that
captured failed, the one after it passed, depending on the order cases reached a worker.
"""

from __future__ import annotations

import torch

from backend.graphs import is_capturing
from backend.providers.torch_backend import TorchBackend, TorchImpl


class _HostScaleImpl(TorchImpl):
    def __init__(self, config):
        super().__init__(config)
        self.floats: dict[int, tuple[float, float]] = {}  # per layer (its scale tensors), as vLLM's per-layer floats

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        layer = id(k_scale)
        if not is_capturing():
            self.floats[layer] = (float(k_scale), float(v_scale))
        k_float, v_float = self.floats.get(layer, (1.0, 1.0))
        k_scale = torch.full_like(k_scale, k_float)  # a constant in a captured graph
        v_scale = torch.full_like(v_scale, v_float)
        return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)


class Backend(TorchBackend):
    name = "mutant-host-scale-copy"
    impl_cls = _HostScaleImpl
