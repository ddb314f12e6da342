"""Bug class (mla_sparse): a padded row's seq_len filled below its query len (sglang #30378 /
#31123: draft-extend padded rows carried seq_len 1 under query len 6, lengths -4..1, an illegal
address in the top-k; fixed by signed comparisons).

Here padded requests get seq_len 1 (as FlashMLA's fp8 builder declares for its kernel) and the
per-token length 1 - q + i + 1 is left unclamped: negative for i < q - 2, so only where a FULL
decode graph replays padded verify rows of q >= 3 (k >= 2). At q <= 2 the lengths are 0 and 1,
inside the padded request's one null-block key: no violation.
"""

from __future__ import annotations

from backend.attention.mla_sparse import SparseMLAMetadataBuilder
from backend.providers.torch_mla_sparse import TorchSparseMLABackend


class Builder(SparseMLAMetadataBuilder):
    cg_pad_seq_lens = 1

    def padded_tokens(self, md, query_lens):
        rows, _ = super().padded_tokens(md, query_lens)
        q, pad = max(self.reorder_threshold, 1), md.num_padded_tokens - md.num_actual_tokens
        return rows, [self.cg_padding[0] - q + j % q + 1 for j in range(pad)]  # unsigned in the original


class Backend(TorchSparseMLABackend):
    name = "mutant-mla-sparse-pad-seq-fill"
    builder_cls = Builder
