"""Bug class (hybrid KV-cache groups): a capture builder that fills the shared seq_lens with 1 in
place (vLLM's Triton and ROCm capture builders do, on the tensor every group shares).

Under the V2 runner a mixed FULL graph is captured with query lens above 1, so the next group's
builder is handed seq_len 1 < query_len: it refuses the batch (a later group's builder failing
at capture, as in vLLM #51585). Decode graphs (query len 1) capture; eager never captures.
"""

from __future__ import annotations

from backend.attention.swa import SWAMetadataBuilder
from backend.providers.torch_swa import TorchSWABackend


class Builder(SWAMetadataBuilder):
    def build_for_capture(self, cm):
        md = super().build_for_capture(cm)
        cm.seq_lens.fill_(1)  # shared with every later group
        cm.seq_lens_cpu.fill_(1)
        return md


class Backend(TorchSWABackend):
    name = "mutant-swa-fill-seq-lens"
    builder_cls = Builder
