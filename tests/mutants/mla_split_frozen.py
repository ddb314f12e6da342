"""Bug class (MLA): a split-KV launch topology chosen on the host in the builder (AITER's
min_kv_seq_len, an `.item()` in vLLM's builder, #51119) and frozen by the graph captured with the
dummy batch.

Made a correctness bug for the checker: the builder reads the batch's longest sequence on the
host and the kernel runs cdiv(that, SPLIT) splits of SPLIT keys, so keys past the splits are
dropped. Eager is right; a FULL decode graph captured on V2's dummy (seq_lens = 1: one split)
drops every key past the first SPLIT at replay. V1's capture (seq_lens = max_model_len) covers
every replay: the same code passes there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from backend.attention.mla import MLAMetadata, MLAMetadataBuilder
from backend.providers import mla_ops
from backend.providers.torch_mla import TorchMLABackend, TorchMLAImpl

SPLIT = 16


@dataclass
class Metadata(MLAMetadata):
    max_kv_seq_len: int = 1  # host value, as the builder's .item() gives it


class Builder(MLAMetadataBuilder):
    def _write(self, query_lens, seq_lens, *args, **kwargs):
        md = super()._write(query_lens, seq_lens, *args, **kwargs)
        return Metadata(**vars(md), max_kv_seq_len=max(seq_lens, default=1))


class Impl(TorchMLAImpl):
    def decode(self, qq, kv_cache, md, k_scale):
        splits = -(-md.max_kv_seq_len // SPLIT)
        keys = splits * SPLIT
        capped = md.seq_lens.clamp(max=keys)  # every split covers SPLIT keys, no more
        md2 = dataclasses.replace(md, seq_lens=capped)
        return mla_ops.absorbed_decode(qq, kv_cache, md2, k_scale, self.config.scale, self.dims, md.num_decode_tokens)


class Backend(TorchMLABackend):
    name = "mutant-mla-split-frozen"
    builder_cls = Builder
    impl_cls = Impl
