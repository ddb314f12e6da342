"""Bug class (hybrid KV-cache groups): a capture builder that zeroes the shared query offsets in
place, device and CPU copies (vLLM PR #51585: ROCm's builder cleared query_start_loc_cpu and a
later group's builder failed; #53821: ROCM_AITER_UNIFIED_ATTN read the zeroed offsets).

The groups' metadata are built from shallow copies of one common metadata, so the zeroing by the
first group's builder (the sliding-window layers) is what the next group's builder (the full
layers) reads: its token count, taken from query_start_loc_cpu, is 0 in every graph it is
captured in, and those layers' rows come back empty at replay. The first group's layers, and
eager (no capture), are right: only the other group's rows fail, where a FULL graph replays.
"""

from __future__ import annotations

from backend.attention.swa import SWAMetadataBuilder
from backend.providers.torch_swa import TorchSWABackend


class Builder(SWAMetadataBuilder):
    def build_for_capture(self, cm):
        md = super().build_for_capture(cm)
        cm.query_start_loc.zero_()  # shared with every later group's common metadata
        cm.query_start_loc_cpu.zero_()
        return md


class Backend(TorchSWABackend):
    name = "mutant-swa-zero-qsl"
    builder_cls = Builder
