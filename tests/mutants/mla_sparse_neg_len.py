"""Bug class (mla_sparse): a padded request of seq_len 0 gives the indexer a negative per-token
length (vLLM #51593: an MTP padding row's length -1, read as 4294967295 by the persistent top-k,
deadlocked the GPU). Token i of a padded request of the uniform query len q gets 0 - q + i + 1:
negative for i < q - 1, so only where a FULL decode graph replays padded verify rows (k >= 1).

Here the builder leaves the length unclamped; the torch top-k reads a negative length as "no
candidate", so the outputs stay right: the contract check (state_integrity) names the field, the
row and the value.
"""

from __future__ import annotations

from backend.attention.mla_sparse import SparseMLAMetadataBuilder
from backend.providers.torch_mla_sparse import TorchSparseMLABackend


class Builder(SparseMLAMetadataBuilder):
    def padded_tokens(self, md, query_lens):
        rows, _ = super().padded_tokens(md, query_lens)
        q, pad = max(self.reorder_threshold, 1), md.num_padded_tokens - md.num_actual_tokens
        return rows, [self.cg_padding[0] - q + j % q + 1 for j in range(pad)]  # no clamp at 0


class Backend(TorchSparseMLABackend):
    name = "mutant-mla-sparse-neg-len"
    builder_cls = Builder
