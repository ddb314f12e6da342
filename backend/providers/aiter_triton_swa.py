"""`aiter-triton` provider of the swa_sinks family: amd-aiter's Triton unified_attention with a
sliding window and sinks, the call vLLM's ROCM_AITER_UNIFIED_ATTN makes for gpt-oss on MI355X
(loaded through aiter_loader.py; it runs on NVIDIA too, DESIGN.md §9b).

window_size = (W - 1, 0) for a window of W keys ((-1, -1): full), sinks fp32 one per query head,
causal. Unlike the gqa class (which passes fixed host ints so that every launch is the same),
this one passes the metadata's host max_seqlen_q / max_seqlen_k as vLLM's backend does: AITER
picks its 2-D or 3-D kernel on them (a window: always 2-D; max_seqlen_k <= 512: 2-D; else by
program count), and a graph freezes its capture's max_seqlen_k = max_model_len, so a short eager
batch may run 2-D where the graph runs 3-D. The 3-D path's segment-0 sink and its reduce over
padded requests (0 segments: 0/0) are what such batches reach; padded rows are zeroed here.
Support ALWAYS, as vLLM declares for ROCM_AITER_UNIFIED_ATTN.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from backend.attention.kv_cache import write_kv
from backend.attention.swa import SWABackend, SWAImpl
from backend.providers.aiter_loader import load_aiter_triton, triton_unavailable_reason
from backend.providers.aiter_triton_backend import keep_padded_rows_finite


class AiterTritonSWAImpl(SWAImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output, window=None, sinks=None):
        c, ops, md = self.config, load_aiter_triton(), metadata
        write_kv(kv_cache, key, value, md.slot_mapping, k_scale, v_scale)
        t = md.num_padded_tokens
        out = output[:t]
        ops.unified_attention(
            q=query[:t],
            k=kv_cache[0],
            v=kv_cache[1],
            out=out,
            cu_seqlens_q=md.query_start_loc,
            max_seqlen_q=max(int(md.max_query_len), 1),
            seqused_k=md.seq_lens,
            max_seqlen_k=max(int(md.max_seq_len), 1),
            softmax_scale=c.scale,
            causal=True,
            window_size=(window - 1, 0) if window else (-1, -1),
            block_table=md.block_table,
            softcap=0.0,
            q_descale=None,
            k_descale=k_scale,
            v_descale=v_scale,
            sinks=None if sinks is None else sinks.float(),
        )
        keep_padded_rows_finite(out, md.query_start_loc)
        return output


class AiterTritonSWABackend(SWABackend):
    name: ClassVar[str] = "aiter-triton"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16)
    jit_kernels: ClassVar[bool] = True
    impl_cls = AiterTritonSWAImpl

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        return triton_unavailable_reason(device)
