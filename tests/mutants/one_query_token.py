"""Bug class (spec decode, DESIGN.md §4b): a decode kernel that reads one query token per request.

For uniform batches (host: every request has max_query_len tokens) the Impl runs a decode kernel
in the shape of paged_attention_v1: one query row per request, its first token, attending at the
end of the sequence, the result written to every token of the request. Right for q = 1; for a
verify batch of q = 1 + k it drops k query tokens and the causal offsets: wrong eagerly too, so
the reference check sees it in every mode, exactly where k > 0 and the batch is uniform verify.
Declares UNIFORM_BATCH (mixed batches take the general path).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from backend.attention.interface import AttentionCGSupport
from backend.providers.torch_backend import TorchBackend, TorchImpl
from backend.providers.torch_ops import token_to_request


class OneQueryTokenImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        uniform = metadata.num_reqs and metadata.num_actual_tokens == metadata.num_reqs * metadata.max_query_len
        if not uniform:  # host branch; one query len per uniform graph, so sound under UNIFORM_BATCH
            return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        self.write(kv_cache, key, value, metadata, k_scale, v_scale)
        t = metadata.num_padded_tokens
        req, _ = token_to_request(metadata.query_start_loc, t)
        first = metadata.query_start_loc[:-1].to(torch.int64).clamp(max=max(t - 1, 0))
        # The decode kernel: one query token per request, as if its query len were 1.
        dq = query[first]
        one = torch.ones_like(metadata.query_lens)
        qsl = torch.arange(first.shape[0] + 1, dtype=metadata.query_start_loc.dtype, device=query.device)
        dmd = replace(
            metadata,
            num_padded_tokens=first.shape[0],
            query_start_loc=qsl,
            query_lens=torch.where(metadata.query_lens > 0, one, metadata.query_lens),
        )
        dout = torch.zeros_like(dq)
        self.attend(dq, kv_cache, dmd, k_scale, v_scale, dout)
        output[:t].copy_(dout[req])
        return output


class Backend(TorchBackend):
    name = "mutant-one-query-token"
    cudagraph_support = AttentionCGSupport.UNIFORM_BATCH
    impl_cls = OneQueryTokenImpl
