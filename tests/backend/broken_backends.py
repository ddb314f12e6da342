"""Deliberately broken backends, loaded by import path (tests.backend.broken_backends:Cls).

FrozenBranchBackend reproduces the vLLM PR #22721 bug class: forward branches in Python on the
host value metadata.max_query_len and runs a decode-only kernel when it is 1, while declaring
ALWAYS. Eager it is correct. A FULL graph captured on vLLM's dummy batch (N tokens over N
requests: max_query_len == 1) freezes the decode branch, so a mixed batch replayed through it
leaves its prefill rows unwritten. The checker must make it red under FULL graphs.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from backend.attention.interface import AttentionCGSupport
from backend.providers import aiter_ops_emulated
from backend.providers.torch_backend import TorchBackend, TorchImpl


class FrozenBranchImpl(TorchImpl):
    def __init__(self, config):
        super().__init__(config)
        self.workspace = torch.empty(
            aiter_ops_emulated.workspace_bytes(
                max(config.max_num_seqs, config.max_num_tokens),
                config.num_heads,
                config.head_size,
                config.max_model_len,
                config.dtype,
            ),
            dtype=torch.uint8,
            device=config.device,
        )

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        if metadata.max_query_len != 1:  # BUG: a host value decides the kernel
            return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        self.write(kv_cache, key, value, metadata, k_scale, v_scale)
        t = metadata.num_padded_tokens
        out = output[:t]
        out.zero_()
        # Decode-only kernel: rows of requests with query len > 1 are not written.
        aiter_ops_emulated.paged_attention_v1(
            out,
            self.workspace,
            query[:t],
            kv_cache[0],
            kv_cache[1],
            self.config.scale,
            metadata.block_table,
            metadata.query_start_loc,
            metadata.seq_lens,
            self.config.max_model_len,
            None,
            self.config.kv_cache_dtype,
            "NHD",
            0.0,
            k_scale,
            v_scale,
        )
        return output


class FrozenBranchBackend(TorchBackend):
    name: ClassVar[str] = "frozen-branch"
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS  # a lie
    impl_cls = FrozenBranchImpl


class NotABackend:
    """Looks like a backend but has no builder_cls/impl_cls: the registry must refuse it."""

    name = "not-a-backend"
    cudagraph_support = AttentionCGSupport.ALWAYS
    supported_kv_cache_dtypes = ("auto",)


def not_a_class():
    return None
