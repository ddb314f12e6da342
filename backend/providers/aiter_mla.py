"""`aiter` provider of the MLA family: AITER's MLA decode as vLLM's ROCM_AITER_MLA drives it, and
`aiter-emulated`: the same wrapper with AITER's ops replaced by torch implementations of their
documented semantics (aiter_ops_emulated.py), so its metadata and graph safety run on CPU.

Per step (vllm/v1/attention/backends/mla/rocm_aiter_mla.py, simplified to one form):
- decode tokens: the builder lays out AITER's paged-KV metadata over page size 1 (one cache slot
  a "page": vLLM expands block-table entries to token slots, _expand_page_indices_kernel), one
  row per decode token (a verify row of q = 1 + k is q rows, each over its causal KV prefix, as
  TritonMLA flattens them): qo_indptr = 0..rows, kv_indptr the cumulative prefix lengths,
  kv_indices the token slots, kv_last_page_lens 1, in persistent buffers sized for
  max_num_seqs x (1 + k) rows of max_model_len keys, written [:n] each build, so a FULL graph
  replays each step's layout. Then mla_decode_fwd(q' [rows, Hl, L + R], kv_buffer [slots, 1, 1,
  L + R], o [rows, Hl, L], ..., max_seqlen_q = 1, sm_scale, kv_scale) and o W_UV.
- prefill requests: their sequences' latent rows gathered contiguous, decompressed (K = [kv_c
  W_UK | k_pe], V = kv_c W_UV) and flash_attn_varlen_func(causal) over them (vLLM's forward_mha
  on ROCm runs AITER's FA).
Support UNIFORM_BATCH, as vLLM's AiterMLAMetadataBuilder declares.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from typing import ClassVar

import torch

from backend.attention.interface import AttentionConfig
from backend.attention.kv_cache import dequantize
from backend.attention.mla import MLABackend, MLAImpl, MLAMetadata, MLAMetadataBuilder
from backend.host_copy import copy_into
from backend.providers import aiter_ops_emulated, mla_ops


@dataclass
class AiterMLAMetadata(MLAMetadata):
    """MLAMetadata plus AITER's paged-KV layout of the decode rows (views of persistent buffers)."""

    qo_indptr: torch.Tensor | None = None  # [rows + 1] int32
    kv_indptr: torch.Tensor | None = None  # [rows + 1] int32
    kv_indices: torch.Tensor | None = None  # [capacity] int32, token slots
    kv_last_page_lens: torch.Tensor | None = None  # [rows] int32, all 1 (page size 1)


class AiterMLAMetadataBuilder(MLAMetadataBuilder):
    def __init__(self, config: AttentionConfig):
        super().__init__(config)
        dev = config.device
        self.max_rows = config.max_num_seqs * self.reorder_threshold
        self.capacity = self.max_rows * config.max_model_len
        self.qo_indptr = torch.arange(self.max_rows + 1, dtype=torch.int32, device=dev)
        self.kv_indptr = torch.zeros(self.max_rows + 1, dtype=torch.int32, device=dev)
        self.kv_indices = torch.zeros(self.capacity, dtype=torch.int32, device=dev)
        self.kv_last_page_lens = torch.ones(self.max_rows, dtype=torch.int32, device=dev)

    def _write(self, query_lens, seq_lens, block_table, slot_mapping, padded_tokens, padded_reqs, for_capture):
        md = super()._write(query_lens, seq_lens, block_table, slot_mapping, padded_tokens, padded_reqs, for_capture)
        rows = md.num_decode_tokens
        if rows > self.max_rows:
            raise ValueError(f"{rows} decode rows exceed the builder's {self.max_rows} (max_num_seqs x (1 + k))")
        # The real decode requests' tokens, each over its causal prefix; padded rows get no keys.
        nd = min(md.num_decodes, len(query_lens))
        q = torch.tensor(list(query_lens[:nd]), dtype=torch.int64)
        s = torch.tensor(list(seq_lens[:nd]), dtype=torch.int64)
        req = torch.repeat_interleave(torch.arange(nd), q)
        pos = torch.arange(req.numel()) - (torch.cumsum(q, 0) - q)[req]
        extent = (s[req] - q[req] + pos + 1).clamp(min=0)
        indptr = torch.zeros(req.numel() + 1, dtype=torch.int64)
        torch.cumsum(extent, 0, out=indptr[1:])
        total = int(indptr[-1])
        row = torch.repeat_interleave(torch.arange(req.numel()), extent)
        j = torch.arange(total) - indptr[row]
        bs = self.config.block_size
        slots = block_table.to(torch.int64)[req[row], j // bs] * bs + j % bs
        copy_into(self.kv_indptr[: req.numel() + 1], indptr.to(torch.int32))
        self.kv_indptr[req.numel() + 1 :].fill_(total)
        if total:
            copy_into(self.kv_indices[:total], slots.to(torch.int32))
        return AiterMLAMetadata(
            **vars(md),
            qo_indptr=self.qo_indptr[: rows + 1],
            kv_indptr=self.kv_indptr[: rows + 1],
            kv_indices=self.kv_indices,
            kv_last_page_lens=self.kv_last_page_lens[:rows],
        )


def gather_sequences(kv_cache: torch.Tensor, md: MLAMetadata, k_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefill requests' latent rows, packed: ([num_prefills * max_seq_len, L + R] fp32,
    cu_seqlens_k [num_prefills + 1] int32). Sized by host ints (eager prefill only); entries past
    cu_seqlens_k[-1] are filler no request reads."""
    block_size = kv_cache.shape[1]
    reqs = slice(md.num_decodes, md.num_decodes + md.num_prefills)
    seq = md.seq_lens[reqs].to(torch.int64)
    cu_k = torch.zeros(seq.shape[0] + 1, dtype=torch.int64, device=seq.device)
    torch.cumsum(seq, 0, out=cu_k[1:])
    total = max(md.num_prefills * md.max_seq_len, 1)
    j = torch.arange(total, device=seq.device)
    req = torch.searchsorted(cu_k[1:], j, right=True).clamp(max=max(seq.shape[0] - 1, 0))
    pos = (j - cu_k[req]).clamp(0, md.block_table.shape[1] * block_size - 1)
    table = md.block_table[reqs]
    slot = table[req, pos // block_size].to(torch.int64).clamp_min(0) * block_size + pos % block_size  # filler: block 0
    return dequantize(kv_cache.flatten(0, 1)[slot], k_scale), cu_k.to(torch.int32)


class AiterMLAImpl(MLAImpl):
    """The wrapper; `ops` provides mla_decode_fwd and flash_attn_varlen_func."""

    ops: ClassVar[object] = None

    def _ops(self):
        return type(self).ops

    def forward(self, q, kv_c, k_pe, kv_cache, metadata, k_scale, output, w_uk_t, w_uv):
        ops, dims, scale, md = self._ops(), self.dims, self.config.scale, metadata
        mla_ops.write_latent(kv_cache, kv_c, k_pe, md.slot_mapping, k_scale)
        dt, npt = md.num_decode_tokens, md.num_prefill_tokens
        fp8 = self.config.kv_cache_dtype == "fp8"
        if dt:
            qq = mla_ops.absorb_query(q[:dt], w_uk_t, dims)
            o_lat = torch.zeros(dt, qq.shape[1], dims.kv_lora_rank, dtype=q.dtype, device=q.device)
            ops.mla_decode_fwd(
                qq,
                kv_cache.view(-1, 1, 1, dims.row),
                o_lat,
                md.qo_indptr,
                md.kv_indptr,
                md.kv_indices,
                md.kv_last_page_lens,
                1,
                sm_scale=scale,
                kv_scale=k_scale if fp8 else None,
            )
            output[:dt].copy_(mla_ops.up_project(o_lat, w_uv))
        if npt:
            latent, cu_k = gather_sequences(kv_cache, md, k_scale)
            k, v = mla_ops.decompress(latent, w_uk_t, w_uv, dims, q.dtype)
            qsl = md.query_start_loc[md.num_decodes : md.num_decodes + md.num_prefills + 1]
            out = torch.zeros(npt, q.shape[1], dims.v_head_dim, dtype=q.dtype, device=q.device)
            ops.flash_attn_varlen_func(
                q=q[dt : dt + npt],
                k=k,
                v=v,
                cu_seqlens_q=qsl - qsl[0],
                cu_seqlens_k=cu_k,
                max_seqlen_q=md.max_query_len,
                max_seqlen_k=md.max_seq_len,
                min_seqlen_q=0,
                dropout_p=0.0,
                softmax_scale=scale,
                causal=True,
                out=out,
            )
            output[dt : dt + npt].copy_(out)
        return output


class AiterNativeMLAImpl(AiterMLAImpl):
    def _ops(self):
        return _native_ops()


class AiterEmulatedMLAImpl(AiterMLAImpl):
    ops = aiter_ops_emulated


@functools.lru_cache(maxsize=1)
def _native_ops():
    import aiter
    from aiter.mla import mla_decode_fwd

    return types.SimpleNamespace(mla_decode_fwd=mla_decode_fwd, flash_attn_varlen_func=aiter.flash_attn_varlen_func)


class AiterMLABackend(MLABackend):
    name: ClassVar[str] = "aiter"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16)
    builder_cls = AiterMLAMetadataBuilder
    impl_cls = AiterNativeMLAImpl

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        from backend.providers.aiter_backend import AiterBackend

        return AiterBackend.unavailable_reason(device)  # the same native AITER as its GQA class


class AiterEmulatedMLABackend(AiterMLABackend):
    name: ClassVar[str] = "aiter-emulated"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16, torch.float32)
    impl_cls = AiterEmulatedMLAImpl

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        return None

    @classmethod
    def unsupported_reasons(cls, config: AttentionConfig) -> list[str]:
        # Its torch mla_decode_fwd scores every slot of kv_indices' capacity (max_num_seqs x (1 + k)
        # rows of max_model_len keys) in fp32 each call: fine at CPU shapes, GBs at GPU ones.
        from backend.providers.aiter_backend import emulated_workset_reason

        dense = config.max_num_seqs * (1 + config.spec_tokens) * config.max_model_len * config.head_size * 4
        why = emulated_workset_reason(config, dense, "mla_decode_fwd scores")
        return super().unsupported_reasons(config) + ([why] if why else [])
