"""The backend contract for the swa_sinks family (DESIGN.md §9b-9c): GQA paged attention with a
per-layer sliding window and per-head sinks, its metadata built per KV-cache group from a shared
CommonAttentionMetadata (backend/attention/groups.py), as vLLM's TRITON_ATTN and
ROCM_AITER_UNIFIED_ATTN are driven for gpt-oss.

Shapes (per tp rank): query [T, Hl, D], key/value [T, Hkvl, D], output [T, Hl, D]; kv_cache
[2, num_blocks, block_size, Hkvl, D] as gqa's. Per call the layer's own window W (None = full:
a query at position i sees key j iff 0 <= i - j < W) and sinks [Hl] fp32 (one logit per query
head, added once to the softmax denominator, not scaled, no value), or None.

A group's builder reads the common metadata as vLLM's do: the shared device tensors as they
are (never copied), host values from the common's host fields, and, as builders that read the
CPU offsets do, the step's token count from query_start_loc_cpu[num_reqs] and each request's
context length from seq_lens_cpu - query lens (a negative one is refused: vLLM #51585's later
group failed the same way at capture). A correct builder mutates nothing it shares; vLLM's Triton
and ROCm capture builders did (seq_lens.fill_(1), query_start_loc.zero_()): tests/mutants/swa_*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from backend.attention.groups import CommonAttentionMetadata
from backend.attention.interface import AttentionBackend, AttentionCGSupport, AttentionConfig, AttentionImpl


@dataclass
class SWAMetadata:
    num_actual_tokens: int  # host, from query_start_loc_cpu[num_reqs]
    num_reqs: int
    num_padded_tokens: int
    num_padded_reqs: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # the shared device tensor
    seq_lens: torch.Tensor  # the shared device tensor
    query_lens: torch.Tensor
    block_table: torch.Tensor  # the group's
    slot_mapping: torch.Tensor  # the group's
    sliding_window: int | None  # the group spec's (AttentionConfig.sliding_window)
    for_capture: bool = False


class SWAMetadataBuilder:
    def __init__(self, config: AttentionConfig):
        self.config = config

    def build(self, cm: CommonAttentionMetadata) -> SWAMetadata:
        n = cm.num_reqs
        qsl = cm.query_start_loc_cpu[: n + 1]
        num_tokens = int(qsl[n]) if n else 0
        context = cm.seq_lens_cpu[:n] - (qsl[1:] - qsl[:-1])
        if n and int(context.min()) < 0:
            r = int(torch.argmin(context))
            raise ValueError(
                f"{'capture batch' if cm.for_capture else 'batch'} request {r}: seq_len "
                f"{int(cm.seq_lens_cpu[r])} < query_len {int(qsl[r + 1] - qsl[r])} in the common "
                f"metadata this group's builder was given"
            )
        return SWAMetadata(
            num_tokens,
            n,
            cm.num_padded_tokens,
            cm.num_padded_reqs,
            cm.max_query_len,
            cm.max_seq_len,
            cm.query_start_loc,
            cm.seq_lens,
            cm.query_lens,
            cm.block_table_tensor,
            cm.slot_mapping,
            self.config.sliding_window,
            cm.for_capture,
        )

    def build_for_capture(self, cm: CommonAttentionMetadata) -> SWAMetadata:
        return self.build(cm)


class SWAImpl(AttentionImpl):
    def forward(
        self,
        query,
        key,
        value,
        kv_cache,
        metadata: SWAMetadata,
        k_scale,
        v_scale,
        output,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Write this step's K/V at metadata.slot_mapping (skipping -1), then attend with the
        layer's window and sinks; write `output` [num_padded_tokens, Hl, D] and return it. Rows
        past num_actual_tokens (padded tokens) may hold anything finite."""
        raise NotImplementedError


class SWABackend(AttentionBackend):
    """Static capabilities of a swa_sinks provider (subclass this for one)."""

    family: ClassVar[str] = "swa_sinks"
    # "sinks": the Impl honours a layer's sinks (a backend without them, like vLLM's ROCM_ATTN,
    # cannot run a model with sinks: the matrix refuses the pair).
    features: ClassVar[tuple[str, ...]] = ("sinks",)
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS
    builder_cls = SWAMetadataBuilder
    impl_cls = SWAImpl
