"""Bug class: metadata not in persistent buffers.

The builder hands out freshly allocated tensors at every build instead of writing the persistent
buffers a graph was captured on, so a FULL replay reads the capture-time dummy metadata (its seq
lens, block tables and slots). PIECEWISE runs attention eagerly on the fresh tensors and is fine.
"""

from __future__ import annotations

from backend.attention.builder import PersistentMetadataBuilder
from backend.providers.torch_backend import TorchBackend


class FreshMetadataBuilder(PersistentMetadataBuilder):
    def build(self, batch, num_padded_tokens=None, num_padded_reqs=None):
        # A new builder per step: new tensors, the captured ones never see this step.
        return PersistentMetadataBuilder(self.config).build(batch, num_padded_tokens, num_padded_reqs)


class Backend(TorchBackend):
    name = "mutant-fresh-metadata"
    builder_cls = FreshMetadataBuilder
