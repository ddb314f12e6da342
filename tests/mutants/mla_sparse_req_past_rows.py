"""Bug class (mla_sparse): padded tokens' request index past the block table's rows (vLLM #55636 /
#55637: graph warm-up produced token_to_req_indices beyond the rows: a silent wrong KV slot, or an
illegal address).

Here a padded build numbers the padded tokens' requests on from the last padded row, one a
token, past the block table's rows; the provider reads the row it is given (clamped, as a kernel reads
whatever memory follows), and the padded tokens' lengths are 0, so outputs stay right: the contract
check names req_id_per_token. Reachable where a FULL decode graph replays with padded tokens.
"""

from __future__ import annotations

from backend.attention.mla_sparse import SparseMLAMetadataBuilder
from backend.providers.torch_mla_sparse import TorchSparseMLABackend


class Builder(SparseMLAMetadataBuilder):
    def padded_tokens(self, md, query_lens):
        _, lens = super().padded_tokens(md, query_lens)
        return [md.num_padded_reqs + j for j in range(len(lens))], lens


class Backend(TorchSparseMLABackend):
    name = "mutant-mla-sparse-req-past-rows"
    builder_cls = Builder
