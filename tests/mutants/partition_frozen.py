"""Bug class (spec decode, DESIGN.md §4b): a backend overstating UNIFORM_BATCH, its verify path
splitting the keys by a partition count frozen from the capture batch.

The builder computes the number of key partitions from the step's longest sequence (host, via
.item() in build(), which runs outside the graph). The Impl's q > 1 uniform path ("verify
kernel") attends only over those partitions; its q = 1 path is paged_attention-like and covers
max_model_len. Eagerly the count always covers the batch. vLLM's V2 capture batch has device
seq_lens = q (DESIGN.md §4a), so a FULL verify graph freezes one partition: replays with longer
sequences lose their later keys. Declares UNIFORM_BATCH, so k > 0 verify batches get FULL decode
graphs (FULL resolves to FULL_AND_PIECEWISE) and fail `replay`; k = 0 and mixed batches pass.
`HonestBackend` is the same code at UNIFORM_SINGLE_TOKEN_DECODE: k > 0 resolves to PIECEWISE.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from backend.attention.builder import PersistentMetadataBuilder
from backend.attention.interface import AttentionCGSupport
from backend.providers.torch_backend import TorchBackend, TorchImpl

PARTITION = 16  # keys per partition (tiny shapes: one KV block)


class PartitionBuilder(PersistentMetadataBuilder):
    def _partitions(self, md):
        longest = int(md.seq_lens.max().item()) if md.seq_lens.numel() else 0  # outside the graph
        md.num_partitions = max(1, -(-longest // PARTITION))
        return md

    def build(self, batch, num_padded_tokens=None, num_padded_reqs=None):
        return self._partitions(super().build(batch, num_padded_tokens, num_padded_reqs))

    def build_for_capture(self, num_tokens, uniform_query_len=0, style="v2"):
        return self._partitions(super().build_for_capture(num_tokens, uniform_query_len, style))


class PartitionImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        uniform = metadata.num_reqs and metadata.num_actual_tokens == metadata.num_reqs * metadata.max_query_len
        if metadata.max_query_len <= 1 or not uniform:
            return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        self.write(kv_cache, key, value, metadata, k_scale, v_scale)
        span = metadata.num_partitions * PARTITION  # host: frozen by a graph
        # Keys past the last partition are never visited: attend over the prefix the split covers.
        seen = replace(metadata, seq_lens=torch.clamp(metadata.seq_lens, max=span))
        return self.attend(query, kv_cache, seen, k_scale, v_scale, output)


class Backend(TorchBackend):
    name = "mutant-partition-frozen"
    cudagraph_support = AttentionCGSupport.UNIFORM_BATCH
    builder_cls = PartitionBuilder
    impl_cls = PartitionImpl


class HonestBackend(Backend):
    name = "mutant-partition-frozen-honest"
    cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
