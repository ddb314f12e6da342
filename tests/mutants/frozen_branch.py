"""Bug class: a host value frozen at capture (vLLM #22721 / #25104).

The Impl picks a decode-only kernel in Python when metadata.max_query_len == 1. Eagerly that is
right. A FULL graph captured with vLLM's dummy batch of N <= max_num_seqs tokens (one token per
request) freezes the decode branch; a mixed batch replayed through it has its prefill rows
skipped (left zero), exactly like paged_attention with cu_query_lens returning early.
Declares ALWAYS, so FULL is not downgraded.
"""

from __future__ import annotations

import torch

from backend.attention.interface import AttentionCGSupport
from backend.providers.torch_backend import TorchBackend, TorchImpl
from tests.mutants._common import token_query_len


class FrozenBranchImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        out = super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        if metadata.max_query_len == 1:  # host branch: frozen into the graph at capture
            t = metadata.num_padded_tokens
            prefill_row = (token_query_len(metadata, t) > 1)[:, None, None]
            out[:t].copy_(torch.where(prefill_row, torch.zeros_like(out[:t]), out[:t]))
        return out


class Backend(TorchBackend):
    name = "mutant-frozen-branch"
    cudagraph_support = AttentionCGSupport.ALWAYS
    impl_cls = FrozenBranchImpl
