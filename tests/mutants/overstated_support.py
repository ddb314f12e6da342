"""Bug class: a backend declaring a support level it does not meet.

The Impl has a fast path for uniform-decode batches chosen on host values
(num_actual_tokens == num_reqs) and on that path treats every token as the last token of its
request (no causal mask inside the request). Correct eagerly and for pure-decode graphs; a mixed
batch replayed through a graph captured on the decode dummy batch attends to future tokens.

`Backend` overstates ALWAYS, so FULL stays FULL and mixed replays fail. `HonestBackend` is the
same code declaring UNIFORM_SINGLE_TOKEN_DECODE: FULL is downgraded to FULL_AND_PIECEWISE (shown
in the result) and passes.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from backend.attention.interface import AttentionCGSupport
from backend.providers.torch_backend import TorchBackend, TorchImpl


class UniformDecodeFastPathImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        if metadata.num_actual_tokens != metadata.num_reqs:  # host value: frozen at capture
            return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        self.write(kv_cache, key, value, metadata, k_scale, v_scale)
        # "decode": every token is its request's last, i.e. query len 1 at the end of the sequence
        decode_md = replace(metadata, query_lens=torch.clamp(metadata.query_lens, max=1))
        return self.attend(query, kv_cache, decode_md, k_scale, v_scale, output)


class Backend(TorchBackend):
    name = "mutant-overstated-support"
    cudagraph_support = AttentionCGSupport.ALWAYS
    impl_cls = UniformDecodeFastPathImpl


class HonestBackend(Backend):
    name = "mutant-honest-support"
    cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
