"""`aiter-triton` and `aiter-triton-pa`: AITER's pure-Triton kernels (amd-aiter, loaded only through
aiter_loader.py) over our paged NHD cache.

- aiter-triton: `unified_attention` for the whole mixed batch in one launch. Its wrapper has no
  host syncs; its host ints (max_seqlen_q, max_seqlen_k) only pick tile configs and the 2D/3D
  kernel. We pass values fixed by the config (max_seqlen_q = min(max_num_tokens, max_model_len),
  max_seqlen_k = max_model_len), so eager and every graph launch the same kernels with the same
  configs for any batch: support ALWAYS. Per-batch values live in device tensors.
- aiter-triton-pa: `pa_decode` (paged_attention_decode) for decode rows + the Triton MHA varlen for
  prefill rows on K/V gathered from the cache. Declares UNIFORM_SINGLE_TOKEN_DECODE like `aiter`,
  but pa_decode's wrapper calls `k_scale.item()`, so capturing it fails: a capture error raised
  to the graph runner (a RuntimeError under CUDA stream capture), which the checker reports.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from backend.attention.builder import PersistentMetadataBuilder
from backend.attention.interface import AttentionBackend, AttentionCGSupport, AttentionImpl
from backend.attention.kv_cache import write_kv
from backend.providers.aiter_backend import gather_contiguous_kv
from backend.providers.aiter_loader import load_aiter_triton, triton_unavailable_reason
from backend.providers.torch_ops import token_to_request


class AiterTritonImpl(AttentionImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        c, ops = self.config, load_aiter_triton()
        write_kv(kv_cache, key, value, metadata.slot_mapping, k_scale, v_scale)
        t = metadata.num_padded_tokens
        out = output[:t]
        ops.unified_attention(
            q=query[:t],
            k=kv_cache[0],
            v=kv_cache[1],
            out=out,
            cu_seqlens_q=metadata.query_start_loc,
            max_seqlen_q=min(c.max_num_tokens, c.max_model_len),
            seqused_k=metadata.seq_lens,
            max_seqlen_k=c.max_model_len,
            softmax_scale=c.scale,
            causal=True,
            window_size=(-1, -1),
            block_table=metadata.block_table,
            softcap=0.0,
            q_descale=None,
            k_descale=k_scale,
            v_descale=v_scale,
        )
        keep_padded_rows_finite(out, metadata.query_start_loc)
        return output


def keep_padded_rows_finite(out: torch.Tensor, query_start_loc: torch.Tensor) -> None:
    """Zero the rows of tokens that belong to no request, on the device (graph-safe: the real
    token count is query_start_loc's last entry, a device value, never read on the host).

    unified_attention's 3D (split-KV) path, taken when max_seqlen_k > 512 and the batch has few
    query blocks (small decode batches at production shapes), ends with `reduce_segments`, launched
    for every token of `out`: a padded token maps to a request with seq_len 0, whose 0 segments
    reduce to 0/0, so it writes NaN there (seen on the H200; the 2D path leaves such rows alone).
    Our interface promises finite padded rows (a NaN there can leak into a later normalisation)."""
    real = torch.arange(out.shape[0], device=out.device) < query_start_loc[-1]
    out.copy_(torch.where(real.view(-1, *([1] * (out.dim() - 1))), out, out.new_zeros(())))


_TRITON_COMPUTE_TYPE = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


class AiterTritonPAImpl(AttentionImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        import triton.language as tl

        c, ops = self.config, load_aiter_triton()
        write_kv(kv_cache, key, value, metadata.slot_mapping, k_scale, v_scale)
        t = metadata.num_padded_tokens
        query, out = query[:t], output[:t]
        out.zero_()
        if metadata.max_query_len > 1:  # host branch: allowed at UNIFORM_SINGLE_TOKEN_DECODE
            k, v, cu_k = gather_contiguous_kv(kv_cache, metadata, k_scale, v_scale, query.dtype)
            # The Triton MHA ignores `out=` and returns a new tensor; it computes every row
            # (decode rows included, correctly), padded tokens stay 0.
            res = ops.flash_attn_varlen_func(
                query,
                k,
                v,
                metadata.query_start_loc,
                cu_k,
                metadata.max_query_len,
                metadata.max_seq_len,
                softmax_scale=c.scale,
                causal=True,
            )
            out.copy_(res)
        # pa_decode: one query row per request (its first token) over the HND view of the cache.
        qsl = metadata.query_start_loc
        first = qsl[:-1].to(torch.int64).clamp(max=t - 1)
        dec_q = query[first].contiguous()  # [R, H, D]
        dec_out = torch.zeros_like(dec_q)
        ops.paged_attention_decode(
            dec_out,
            dec_q,
            kv_cache[0].permute(0, 2, 1, 3),
            kv_cache[1].permute(0, 2, 1, 3),
            metadata.seq_lens,
            metadata.block_table,
            c.scale,
            c.max_model_len,
            getattr(tl, _TRITON_COMPUTE_TYPE[query.dtype]),
            k_scale,
            v_scale,
        )
        req, row = token_to_request(qsl, t)
        is_decode = (metadata.query_lens.to(torch.int64)[req] == 1) & (row == 0)
        out.copy_(torch.where(is_decode[:, None, None], dec_out[req], out))
        return output


class AiterTritonBackend(AttentionBackend):
    name: ClassVar[str] = "aiter-triton"
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16)
    jit_kernels: ClassVar[bool] = True  # AITER's Triton kernels compile on first use
    builder_cls = PersistentMetadataBuilder
    impl_cls = AiterTritonImpl

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        return triton_unavailable_reason(device)


class AiterTritonPABackend(AiterTritonBackend):
    name: ClassVar[str] = "aiter-triton-pa"
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    impl_cls = AiterTritonPAImpl
