"""Bug class: a kernel that leaves NaN in padded output rows (e.g. a softmax over an empty key
range, 0/0, for the padded requests of a FULL graph).

Real rows are right, eager has no padded rows, and the KV write is untouched, so reference,
replay, finite and kv_integrity all pass; the NaN only waits for a later normalisation that mixes
rows. Only the padded_finite check sees it, wherever a FULL graph pads.
"""

from __future__ import annotations

import torch

from backend.providers.torch_backend import TorchBackend, TorchImpl
from tests.mutants._common import token_query_len


class PaddedNaNImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        out = super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        t = metadata.num_padded_tokens
        padded = (token_query_len(metadata, t) == 0)[:, None, None]
        out[:t].copy_(torch.where(padded, torch.full_like(out[:t], float("nan")), out[:t]))
        return out


class Backend(TorchBackend):
    name = "mutant-padded-nan"
    impl_cls = PaddedNaNImpl
