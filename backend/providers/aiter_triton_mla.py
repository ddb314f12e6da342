"""`aiter-triton` provider of the MLA family: AITER's Triton MLA decode (SGLang-derived,
aiter/ops/triton/mla_decode_rope.py decode_attention_fwd_grouped_rope, loaded through
aiter_loader.py) and the Triton MHA for prefill, over the AITER MLA builder's page-size-1 layout
(aiter_mla.py: one row per decode token over its causal prefix).

- decode: decode_attention_fwd_grouped_rope(q' [rows, Hl, L + R], k_buffer [slots, 1, L + R],
  v_buffer = its first L values, o [rows, Hl, L], kv_indptr, kv_indices, ..., attn_logits [rows,
  Hl, splits, L + 1], num_kv_splits, sm_scale, use_rope=False). num_kv_splits is a host int,
  chosen from the host max_seq_len as vLLM's TritonMLA does (next power of two of
  max_seq_len // 512, capped): a graph freezes the capture's (max_model_len), so graph and eager
  may run different split counts (not bitwise equal; DESIGN.md §9a). A row with no keys (a
  padded token) ends in the stage-2 reduce's 0/0: NaN, zeroed here as our interface promises.
- prefill: the Triton MHA flash_attn_varlen_func over the decompressed K/V (v head dim V).
The kernel takes no fp8 scales: kv auto only. Support UNIFORM_BATCH.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from backend.attention.mla import MLAImpl
from backend.providers import mla_ops
from backend.providers.aiter_loader import load_aiter_triton, triton_unavailable_reason
from backend.providers.aiter_mla import AiterMLABackend, gather_sequences
from backend.providers.aiter_triton_backend import keep_padded_rows_finite

MIN_WORK_PER_SPLIT = 512  # vLLM triton_mla.py _MIN_WORK_PER_SPLIT
MAX_SPLITS = 16


def num_kv_splits(max_seq_len: int) -> int:
    """Split-KV segments for a host max_seq_len (a power of two, as vLLM's TritonMLA picks them)."""
    ideal = 1 << max(0, (max(1, max_seq_len // MIN_WORK_PER_SPLIT) - 1).bit_length())
    return min(ideal, MAX_SPLITS)


class AiterTritonMLAImpl(MLAImpl):
    def __init__(self, config):
        super().__init__(config)
        # RoPE is outside the op here (use_rope=False): the kernel never reads these, but the
        # signature types them as tensors, so it gets small ones (never None).
        dev, r = config.device, self.dims.qk_rope_head_dim
        self._no_rope = (
            torch.zeros(1, r, dtype=config.dtype, device=dev),
            torch.zeros(1, r, dtype=config.dtype, device=dev),
            torch.zeros(1, dtype=torch.int64, device=dev),
        )

    def forward(self, q, kv_c, k_pe, kv_cache, metadata, k_scale, output, w_uk_t, w_uv):
        ops, dims, scale, md = load_aiter_triton(), self.dims, self.config.scale, metadata
        mla_ops.write_latent(kv_cache, kv_c, k_pe, md.slot_mapping, k_scale)
        dt, npt = md.num_decode_tokens, md.num_prefill_tokens
        if dt:
            qq = mla_ops.absorb_query(q[:dt], w_uk_t, dims).contiguous()
            o_lat = torch.zeros(dt, qq.shape[1], dims.kv_lora_rank, dtype=q.dtype, device=q.device)
            splits = num_kv_splits(int(md.max_seq_len))
            logits = torch.empty(dt, qq.shape[1], splits, dims.kv_lora_rank + 1, dtype=torch.float32, device=q.device)
            k_buffer = kv_cache.view(-1, 1, dims.row)
            ops.decode_attention_fwd_grouped_rope(
                qq,
                k_buffer,
                k_buffer[..., : dims.kv_lora_rank],
                o_lat,
                md.kv_indptr,
                md.kv_indices,
                self._no_rope[0],
                dims.kv_lora_rank,
                dims.qk_rope_head_dim,
                self._no_rope[1],
                self._no_rope[2],
                logits,
                splits,
                scale,
                logit_cap=0.0,
                use_rope=False,
                is_neox_style=False,
            )
            keep_padded_rows_finite(o_lat, md.query_start_loc)
            output[:dt].copy_(mla_ops.up_project(o_lat, w_uv))
        if npt:
            latent, cu_k = gather_sequences(kv_cache, md, k_scale)
            k, v = mla_ops.decompress(latent, w_uk_t, w_uv, dims, q.dtype)
            qsl = md.query_start_loc[md.num_decodes : md.num_decodes + md.num_prefills + 1]
            # The Triton MHA returns a new tensor (it ignores out=).
            res = ops.flash_attn_varlen_func(
                q[dt : dt + npt],
                k,
                v,
                qsl - qsl[0],
                cu_k,
                md.max_query_len,
                md.max_seq_len,
                softmax_scale=scale,
                causal=True,
            )
            output[dt : dt + npt].copy_(res)
        return output


class AiterTritonMLABackend(AiterMLABackend):
    name: ClassVar[str] = "aiter-triton"
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)
    jit_kernels: ClassVar[bool] = True
    impl_cls = AiterTritonMLAImpl

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        return triton_unavailable_reason(device)
