"""The MLA family through vLLM's own code: `vllm:TRITON_MLA` (current interface, 0.33/0.34), the
MLA decode path free of FlashMLA, FA3 and CUTLASS binaries on an H100/H200.

What runs as vLLM's: TritonMLAImpl.forward_mqa itself, the decode of every decode row (its
num_kv_splits chosen on the host max_seq_len, frozen by a graph; its per-row causal extents for a
verify block; vLLM's Triton decode_attention_fwd; its split-KV reduce), on the latent cache in
vLLM's layout [blocks, block_size, L + R] with layer._k_scale for K and V alike. Its support level
is TritonMLAMetadataBuilder's own `_cudagraph_support`.

What runs as orch's, labelled in every result (versions["kernels"]): the KV write (vLLM's
concat_and_cache_mla is a compiled op a Python-only wheel lacks: orch's slot write, which also
quantises with the one k_scale), the metadata builder (MLAMetadataBuilder: the same decode/prefill
split and decode-only capture, not MLACommonMetadataBuilder, whose construction needs a DeepSeek
model config and the prefill backend), W_UK absorption and W_UV up-projection (vLLM's bmm, here
mla_ops), and the prefill rows (vLLM's forward_mha needs a compiled FlashAttention or FlashInfer).
"""

from __future__ import annotations

import functools
import types

import torch

from backend.attention.interface import AttentionCGSupport, AttentionConfig
from backend.attention.mla import MLABackend, MLAImpl, MLAMetadataBuilder
from backend.providers import mla_ops

KERNELS = "decode: vLLM's TritonMLAImpl.forward_mqa; KV write, builder, W_UK/W_UV and prefill: orch's"


@functools.lru_cache(maxsize=1)
def load_triton_mla():
    """(vLLM's TritonMLAImpl and TritonMLAMetadataBuilder, None), or (None, why not here)."""
    from backend.adapters.vllm import current_interface, errors, native

    iface, why = current_interface()
    if iface is None:
        return None, why
    if iface.name != "current":
        return None, "unavailable: vllm:TRITON_MLA is bridged for vLLM's current interface (0.33/0.34) only"
    try:
        native.stub_platform_native()
        native.stub_flash_attn_extension()
        with errors.quiet_vllm_import():
            from vllm.v1.attention.backends.mla.triton_mla import TritonMLAImpl, TritonMLAMetadataBuilder
    except Exception as exc:  # noqa: BLE001 - an import that fails for any reason is "unavailable"
        return None, errors.backend_import_failed("TRITON_MLA", exc)
    return (TritonMLAImpl, TritonMLAMetadataBuilder), None


class VllmTritonMLAImpl(MLAImpl):
    def __init__(self, config: AttentionConfig):
        super().__init__(config)
        loaded, why = load_triton_mla()
        if loaded is None:
            raise RuntimeError(why)
        self.forward_mqa = loaded[0].forward_mqa
        device = torch.device(config.device)
        sm = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
        # The attributes forward_mqa reads of its Impl (TritonMLAImpl.__init__ sets them from the
        # layer's MLA args; ours are the same values).
        self.view = types.SimpleNamespace(
            kv_lora_rank=self.dims.kv_lora_rank,
            scale=config.scale,
            decode_sliding_window=None,
            dcp_world_size=1,
            _sm_count=sm,
        )

    def forward(self, q, kv_c, k_pe, kv_cache, metadata, k_scale, output, w_uk_t, w_uv):
        md, dims = metadata, self.dims
        mla_ops.write_latent(kv_cache, kv_c, k_pe, md.slot_mapping, k_scale)
        dt, nd, npt = md.num_decode_tokens, md.num_decodes, md.num_prefill_tokens
        if dt:
            qq = mla_ops.absorb_query(q[:dt], w_uk_t, dims)
            decode = types.SimpleNamespace(
                decode=types.SimpleNamespace(block_table=md.block_table[:nd], seq_lens=md.seq_lens[:nd]),
                max_seq_len=md.max_seq_len,
                causal=True,
            )
            o_lat, _ = self.forward_mqa(self.view, qq, kv_cache, decode, types.SimpleNamespace(_k_scale=k_scale))
            output[:dt].copy_(mla_ops.up_project(o_lat.to(q.dtype), w_uv))
        if npt:
            res = mla_ops.decompressed_prefill(q, kv_cache, md, k_scale, self.config.scale, dims, w_uk_t, w_uv)
            output[dt : dt + npt].copy_(res.to(output.dtype))
        return output


@functools.lru_cache(maxsize=1)
def make_triton_mla_backend() -> type[MLABackend]:
    loaded, why = load_triton_mla()
    level = getattr(loaded[1], "_cudagraph_support", None) if loaded else None
    support = AttentionCGSupport[level.name] if level is not None else AttentionCGSupport.NEVER

    @classmethod
    def unavailable_reason(klass, device: torch.device) -> str | None:
        if why:
            return why
        device = torch.device(device)
        if device.type != "cuda":
            return "unavailable: vllm:TRITON_MLA launches Triton kernels: it needs a GPU (--devices gpu)"
        if not torch.cuda.is_available():
            return "unavailable: no CUDA/ROCm device visible"
        return None

    attrs = {
        "name": "vllm:TRITON_MLA",
        "cudagraph_support": support,
        "supported_dtypes": (torch.bfloat16, torch.float16),
        "builder_cls": MLAMetadataBuilder,
        "impl_cls": VllmTritonMLAImpl,
        "unavailable_reason": unavailable_reason,
        "kernels": KERNELS,
        "emulated": staticmethod(lambda: ("concat_and_cache_mla (orch's slot write)", "prefill (orch's torch)")),
        "__doc__": "vLLM's TRITON_MLA decode run in place (backend/adapters/vllm/mla.py).",
    }
    return types.new_class("Vllm_TRITON_MLA", (MLABackend,), {}, lambda ns: ns.update(attrs))
