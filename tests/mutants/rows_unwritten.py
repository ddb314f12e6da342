"""Bug class: a kernel that leaves real rows of its output unwritten (AITER's varlen prefill skips
rows with seqlen_q <= min_seqlen_q and relies on the decode kernel writing them; ROCm MLA's rows
of padding, vLLM #37682).

Here the captured path writes the rows of decode tokens only: a mixed graph's prefill rows keep
what the output buffer held. Eager writes every row. That buffer is the session's static attention
output, which held the previous replay's (or the PIECEWISE run's) values: finite, and where a
replay of the same batch wrote them, right. The checker fills the real rows with NaN before every
replay: a FULL graph's prefill rows read NaN, and `finite` fails on the graph side.
"""

from __future__ import annotations

import torch

from backend.providers.torch_backend import TorchBackend, TorchImpl
from tests.mutants._common import token_query_len


class _DecodeRowsImpl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        if not metadata.for_capture:
            return super().attend(query, kv_cache, metadata, k_scale, v_scale, output)
        t = metadata.num_padded_tokens
        before = output[:t].clone()
        super().attend(query, kv_cache, metadata, k_scale, v_scale, output)
        decode = (token_query_len(metadata, t) == 1)[:, None, None]
        output[:t].copy_(torch.where(decode, output[:t], before))  # prefill rows: as they were
        return output


class Backend(TorchBackend):
    name = "mutant-rows-unwritten"
    impl_cls = _DecodeRowsImpl
