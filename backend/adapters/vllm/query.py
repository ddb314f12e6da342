"""The query vLLM's Attention layer hands the Impl (docs/VLLM.md "fp8 query"): with an fp8 cache and
a declaration that the backend takes a quantised query, the layer quantises it with vLLM's own
QuantFP8, static, per tensor, with the layer's q scale. Where the declaration lives is the release's:
the Impl instance in 0.33/0.34 (`Attention.__init__` reads `impl.supports_quant_query_input`), the
backend class in 0.11.0 (`attn_backend.supports_quant_query_input`); 0.10.2's layer has no query
quantisation at all (and nothing declares it)."""

from __future__ import annotations

import torch


def query_quantizer(declarer, kv_cache_dtype: str, vllm_config):
    """vLLM's own QuantFP8, static per-tensor, when `declarer` (the object the release's layer
    reads) declares `supports_quant_query_input` and the cache is fp8 (TRITON_ATTN on CUDA, and on
    ROCm but gfx90a/gfx11; FLEX_ATTENTION and ROCM_AITER_FA never declare it). None otherwise: the
    Impl gets the model-dtype query, as in the engine. Per-head q scales come only from a
    checkpoint's q_scale, which this test model has not."""
    if not (getattr(declarer, "supports_quant_query_input", False) and kv_cache_dtype.startswith("fp8")):
        return None
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    with set_current_vllm_config(vllm_config):
        return QuantFP8(static=True, group_shape=GroupShape.PER_TENSOR)


def quantize_query(quant, query: torch.Tensor, q_scale: torch.Tensor) -> torch.Tensor:
    """The layer's `query, _ = self.query_quant(query, self._q_scale)` on the [T, H*D] query,
    through QuantFP8.forward_native: what the engine's default compilation runs (VLLM_COMPILE with
    inductor puts custom_ops "none", so quant_fp8 is disabled and its native form is compiled into
    the model). forward_cuda would call vLLM's compiled scaled_fp8_quant, which a Python-only wheel
    lacks; with a per-tensor static scale both are x / scale, clamped, cast to fp8."""
    t = query.shape[0]
    quantized, _ = quant.forward_native(query.reshape(t, -1), q_scale)
    return quantized.view(query.shape)
