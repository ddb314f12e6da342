"""Spec-decode control: a host branch on max_query_len == 1 under a k > 0 capture.

The Impl runs a one-query-token decode kernel when metadata.max_query_len == 1 (right for q = 1)
and the general kernel otherwise. vLLM captures a k > 0 decode graph with max_query_len = 1 + k
(uniform_decode_query_len) and its verify replays have q = 1 + k too, so the branch is frozen on
the general side and every replay is right; mixed graphs are captured with max_query_len = N.
Declares UNIFORM_BATCH. Expected green everywhere: it fails only if a checker captures k > 0
decode graphs with q = 1 (the capture bug this pins), or lets a q = 1 graph replay verify rows.
"""

from __future__ import annotations

from backend.attention.interface import AttentionCGSupport
from backend.providers.torch_backend import TorchBackend
from tests.mutants.one_query_token import OneQueryTokenImpl


class DecodeBranchImpl(OneQueryTokenImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        if metadata.max_query_len == 1:  # host branch frozen at capture
            return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        return super(OneQueryTokenImpl, self).forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)


class Backend(TorchBackend):
    name = "mutant-decode-branch-spec"
    cudagraph_support = AttentionCGSupport.UNIFORM_BATCH
    impl_cls = DecodeBranchImpl
