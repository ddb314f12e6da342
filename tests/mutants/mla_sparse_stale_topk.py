"""Bug class (mla_sparse): top-k state that outlives a call (vLLM #49139: the persistent top-k
rotated its histogram ring on short rows, so a later long row read a stale histogram).

Here the top-k writes only the candidates a token has and leaves the rest of its row as the last
call left it (no -1 fill): a token with fewer candidates than index_topk (a context shorter than
top-k) reads positions an earlier call picked there, past its own length. Reachable wherever such
a token follows a call that filled more of its row: in every mode of the family's batches, eager
included, except where the step plan only grows each row's context
(tests/families/test_mla_sparse_mutants.py says which).
"""

from __future__ import annotations

import torch

from backend.providers.torch_mla_sparse import TorchSparseMLABackend, TorchSparseMLAImpl


class Impl(TorchSparseMLAImpl):
    def select(self, kv_cache, md, v_scale, index_q, index_w, topk):
        fresh = torch.empty_like(topk)
        super().select(kv_cache, md, v_scale, index_q, index_w, fresh)
        topk.copy_(torch.where(fresh >= 0, fresh, topk))  # keeps what the last call left


class Backend(TorchSparseMLABackend):
    name = "mutant-mla-sparse-stale-topk"
    impl_cls = Impl
