"""Bug class (mla_sparse): the indexer's top-k scratch allocated per call, captured by pointer
(TensorRT-LLM #14297: the radix scratch went stale when chunked-prefill activations moved the
allocator).

Here every metadata build allocates a fresh top-k buffer and the Impl writes and reads the one
its metadata carries: right in eager; a replayed FULL graph writes and reads the buffer of the
build it was captured on (on a GPU, memory the allocator has handed on: wrong output or an illegal
address; the CPU emulation keeps it alive, so the output stays right there), and the step's own
buffer stays empty: the family's check sees the graph's top-k differ from eager's wherever a FULL
decode graph replays.
"""

from __future__ import annotations

import torch

from backend.attention.mla_sparse import SparseMLAMetadataBuilder
from backend.providers.torch_mla_sparse import TorchSparseMLABackend, TorchSparseMLAImpl


class Builder(SparseMLAMetadataBuilder):
    def _write(self, *args, **kwargs):
        md = super()._write(*args, **kwargs)
        md.topk_scratch = torch.full(
            (md.num_padded_tokens, self.index.index_topk), -1, dtype=torch.int32, device=self.config.device
        )  # per build: not a persistent buffer
        return md


class Impl(TorchSparseMLAImpl):
    def topk_for(self, metadata):
        return metadata.topk_scratch


class Backend(TorchSparseMLABackend):
    name = "mutant-mla-sparse-per-call-scratch"
    builder_cls = Builder
    impl_cls = Impl
