"""Bug class: a kernel that is simply wrong (prefill output overwritten by the decode kernel).

After the correct attention, every token of a prefill row (query len > 1) gets the output of its
request's last token, as if a decode kernel had written the whole row. Eager is as wrong as any
graph, so replay-vs-eager cannot see it: only the reference check does. Pure decode is right.
"""

from __future__ import annotations

import torch

from backend.providers.torch_backend import TorchBackend, TorchImpl
from tests.mutants._common import token_last_index, token_query_len


class WrongPrefillImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        out = super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        t = metadata.num_padded_tokens
        prefill_row = (token_query_len(metadata, t) > 1)[:, None, None]
        decoded = out[:t].index_select(0, token_last_index(metadata, t))
        out[:t].copy_(torch.where(prefill_row, decoded, out[:t]))
        return out


class Backend(TorchBackend):
    name = "mutant-wrong-prefill"
    impl_cls = WrongPrefillImpl
