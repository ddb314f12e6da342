"""Broken on purpose: vLLM's own backends (`vllm:NAME`, backend/adapters/vllm/) with one thing
off after vLLM's forward. They are `module:Class` plugins that subclass the adapter's class, so
vLLM's builder, Impl, support level and KV cache all run unchanged and only the bug is ours:

  FlexPrefillDropped / TritonPrefillDropped   tokens of prefill/extend requests (query len > 1)
        output 0, as if a decode-only kernel had run: pure decode batches stay green; every
        batch with a prefill row fails the reference check, in every mode (eager is as wrong)
  FlexHeadScaled / TritonHeadScaled   the rank's first query head x 0.5: red everywhere

    orch run matrices/vllm.yaml --backend tests.mutants.vllm_backends:FlexPrefillDropped --devices cpu
    python benchmarks/gpu_vllm.py --backend tests.mutants.vllm_backends:TritonPrefillDropped

Without a usable vllm the base class says why, and these skip with that reason.
"""

from __future__ import annotations

from backend.attention.registry import get_backend
from tests.mutants._common import token_query_len

_FLEX = get_backend("vllm:FLEX_ATTENTION")
_TRITON = get_backend("vllm:TRITON_ATTN")


def _prefill_dropped(base_impl: type) -> type:
    class PrefillDroppedImpl(base_impl):
        def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
            out = super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
            t = metadata.num_padded_tokens
            prefill = (token_query_len(metadata, t) > 1)[:, None, None]  # graph-safe: no host read
            out[:t].masked_fill_(prefill, 0)
            return out

    return PrefillDroppedImpl


def _head_scaled(base_impl: type, factor: float = 0.5) -> type:
    class HeadScaledImpl(base_impl):
        def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
            out = super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
            out[: metadata.num_padded_tokens, 0].mul_(factor)
            return out

    return HeadScaledImpl


class FlexPrefillDropped(_FLEX):
    name = "mutant-vllm:FLEX_ATTENTION-prefill-dropped"
    impl_cls = _prefill_dropped(_FLEX.impl_cls)


class FlexHeadScaled(_FLEX):
    name = "mutant-vllm:FLEX_ATTENTION-head-scaled"
    impl_cls = _head_scaled(_FLEX.impl_cls)


class TritonPrefillDropped(_TRITON):
    name = "mutant-vllm:TRITON_ATTN-prefill-dropped"
    impl_cls = _prefill_dropped(_TRITON.impl_cls)


class TritonHeadScaled(_TRITON):
    name = "mutant-vllm:TRITON_ATTN-head-scaled"
    impl_cls = _head_scaled(_TRITON.impl_cls)
