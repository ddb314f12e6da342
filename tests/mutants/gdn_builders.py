"""hybrid_gdn's broken backends (DESIGN.md §11; docs/FAMILIES.md's table): each one of the 2026 bug
classes of hybrid recurrent state under FULL graphs, as a small subclass of the correct `torch`
provider, loaded by import path like a plugin. tests/families/test_gdn_mutants.py says where each
must be red, with which check, and green everywhere else.

    PadClampedToZero     padded requests' state index clamped from -1 to 0 (tokenspeed #700):
                         the padded rows write slot 0
    PadToLastSlot        the padding remapped to the last slot (sglang #36885; vllm-gaudi #1431's
                         remainder): the padded rows write it
    TokenPaddedBuffers   request-indexed buffers padded to the step's tokens, not its requests
                         (vLLM #45100: 72 requests, 288 tokens under MTP 3)
    RecycledNotZeroed    a prompt's one-token first chunk classed as a decode (vLLM #51483, likely
                         #57720): it reads the leftover state of its recycled slot
    AcceptedPaddedZero   padded requests' accepted count 0, not 1 (a kernel that reads column
                         accepted - 1 of a padded row reads before its row)
    ZeroedQueryStart     the first state group's capture build zeroes the shared query_start_loc
                         (the ROCm builder of vLLM #51585/#53821): the later groups' captures read 0
    PaddedConvUnwritten  padded rows' conv output never written (sglang #30974): NaN fed to the
                         recurrence (backend/providers/gdn_ops.py)
"""

from __future__ import annotations

from backend.attention.gdn import GDNMetadataBuilder, num_state_slots
from backend.providers.torch_gdn import TorchGDNImpl, TorchHybridGDNBackend, TorchHybridImpl


class _ClampBuilder(GDNMetadataBuilder):
    def pad_indices(self, buf):
        buf.fill_(-1).clamp_(min=0)


class PadClampedToZero(TorchHybridGDNBackend):
    name = "mutant-gdn-pad-clamped-0"
    gdn_builder_cls = _ClampBuilder


class _LastSlotBuilder(GDNMetadataBuilder):
    def pad_indices(self, buf):
        buf.fill_(-1).remainder_(num_state_slots(self.config))  # Python's -1 % n: the last slot


class PadToLastSlot(TorchHybridGDNBackend):
    name = "mutant-gdn-pad-last-slot"
    gdn_builder_cls = _LastSlotBuilder


class _TokenRowsBuilder(GDNMetadataBuilder):
    def request_rows(self, cm):
        return cm.num_padded_tokens


class TokenPaddedBuffers(TorchHybridGDNBackend):
    name = "mutant-gdn-token-padded"
    gdn_builder_cls = _TokenRowsBuilder


class _QueryLenBuilder(GDNMetadataBuilder):
    def split(self, q, ctx, drafts):
        return super().split(q, [1] * len(ctx), drafts)  # context ignored: q == 1 is a decode


class RecycledNotZeroed(TorchHybridGDNBackend):
    name = "mutant-gdn-recycled-not-zeroed"
    gdn_builder_cls = _QueryLenBuilder


class _AcceptedZeroBuilder(GDNMetadataBuilder):
    def pad_accepted(self, buf):
        buf.fill_(0)


class AcceptedPaddedZero(TorchHybridGDNBackend):
    name = "mutant-gdn-accepted-0"
    gdn_builder_cls = _AcceptedZeroBuilder


class _ZeroingBuilder(GDNMetadataBuilder):
    def build_for_capture(self, cm):
        md = super().build_for_capture(cm)
        cm.query_start_loc.zero_()  # shared with every later group's common metadata
        cm.query_start_loc_cpu.zero_()
        return md


class ZeroedQueryStart(TorchHybridGDNBackend):
    name = "mutant-gdn-zeroed-qsl"
    gdn_builder_cls = _ZeroingBuilder


class _UnwrittenConv(TorchGDNImpl):
    padded_conv_unwritten = True


class _UnwrittenConvImpl(TorchHybridImpl):
    gdn_cls = _UnwrittenConv


class PaddedConvUnwritten(TorchHybridGDNBackend):
    name = "mutant-gdn-padded-conv-unwritten"
    impl_cls = _UnwrittenConvImpl
