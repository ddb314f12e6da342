"""Bug class (MLA): the capture's warm-up writes the KV cache (vLLM #39444: a warm-up write to
slot 0). The dummy batch's slot_mapping should be -1 (write nothing); here the capture builder
leaves it 0, so making the graph writes the capture's K/V into slot 0 (the null block's first
row, which a later request on a real block would not touch in orch, but which vLLM's #39444
overwrote in a live block).

Steps are right (a step's build writes its real slots over the persistent buffer): only the
check of what making a graph wrote (scratch.capture_checked) sees it, on every case that replays a
FULL decode graph.
"""

from __future__ import annotations

from backend.attention.mla import MLAMetadataBuilder
from backend.providers.torch_mla import TorchMLABackend


class Builder(MLAMetadataBuilder):
    def build_for_capture(self, num_tokens, uniform_query_len=0, style="v2"):
        md = super().build_for_capture(num_tokens, uniform_query_len, style)
        md.slot_mapping.fill_(0)  # the persistent buffer the graph reads: slot 0, not -1
        return md


class Backend(TorchMLABackend):
    name = "mutant-mla-warmup-slot0"
    builder_cls = Builder
