"""`aiter` provider: AITER's native ops as vLLM's ROCM_AITER_FA backend uses them, and
`aiter-emulated`: the same wrapper with the two native ops replaced by torch implementations of
their documented semantics (aiter_ops_emulated.py), so this wrapper's metadata handling and graph
safety are tested on CPU.

Per step (vllm/v1/attention/backends/rocm_aiter_fa.py):
- prefill/extend rows: K/V gathered from the paged cache into contiguous buffers, then
  flash_attn_varlen_func(..., min_seqlen_q=1, causal=True, out=output): decode rows are skipped.
- decode rows: paged_attention_v1 over every request with cu_query_lens = query_start_loc, so rows
  with query len > 1 return early; max_context_len = max_model_len and a persistent workspace sized
  for it, so the captured partition count covers every later step.
Support: UNIFORM_BATCH, as vLLM's ROCM_AITER_FA declares now (0.11.0 had lowered it to
UNIFORM_SINGLE_TOKEN_DECODE, #25104). The varlen launch takes max_query_len/max_seq_len as host
ints (frozen by a graph): a uniform graph is captured with max_query_len = q (every replay has
q too) and max_seq_len = max_model_len (an upper bound of every replay), and the packed gather
is sized by the capture's num_padded_reqs x max_model_len, which the replays keep. So a FULL
decode graph of spec-decode verify rows (q = 1 + k) is sound; a mixed batch is not uniform and
keeps PIECEWISE/NONE.
"""

from __future__ import annotations

import functools
import types
from typing import ClassVar

import torch

from backend.attention.builder import PersistentMetadataBuilder
from backend.attention.interface import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionConfig,
    AttentionImpl,
    AttentionMetadata,
)
from backend.attention.kv_cache import dequantize, write_kv
from backend.providers import aiter_ops_emulated

PARTITION_SIZE = 256  # vLLM's _PARTITION_SIZE_ROCM


def gather_contiguous_kv(
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    dtype: torch.dtype,
):
    """Each request's K/V, packed: (k, v [num_padded_reqs * max_seq_len, Hkv, D] in `dtype`,
    cu_seqlens_k [R+1] int32). Sized by host ints (eager prefill only); entries past
    cu_seqlens_k[-1] are filler that no request reads."""
    block_size = kv_cache.shape[2]
    seq = metadata.seq_lens.to(torch.int64)
    cu_k = torch.zeros(seq.shape[0] + 1, dtype=torch.int64, device=seq.device)
    torch.cumsum(seq, 0, out=cu_k[1:])
    total = max(metadata.num_padded_reqs * metadata.max_seq_len, 1)
    j = torch.arange(total, device=seq.device)
    req = torch.searchsorted(cu_k[1:], j, right=True).clamp(max=seq.shape[0] - 1)
    pos = (j - cu_k[req]).clamp(0, metadata.block_table.shape[1] * block_size - 1)
    block = metadata.block_table[req, pos // block_size].to(torch.int64).clamp_min(0)  # filler reads block 0, not -1
    slot = block * block_size + pos % block_size
    k = dequantize(kv_cache[0].flatten(0, 1)[slot], k_scale).to(dtype)
    v = dequantize(kv_cache[1].flatten(0, 1)[slot], v_scale).to(dtype)
    return k, v, cu_k.to(torch.int32)


class AiterImpl(AttentionImpl):
    """The wrapper; `ops` provides flash_attn_varlen_func and paged_attention_v1."""

    ops: ClassVar[object] = None  # resolved by subclasses / _native_ops()

    def __init__(self, config: AttentionConfig):
        super().__init__(config)
        rows = max(config.max_num_seqs, config.max_num_tokens)
        nbytes = aiter_ops_emulated.workspace_bytes(
            rows, config.num_heads, config.head_size, config.max_model_len, config.dtype, PARTITION_SIZE
        )
        # Persistent: a graph captured with it keeps using the same storage.
        self.workspace = torch.empty(nbytes, dtype=torch.uint8, device=config.device)

    def _ops(self):
        return type(self).ops

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        c, ops = self.config, self._ops()
        write_kv(kv_cache, key, value, metadata.slot_mapping, k_scale, v_scale)
        t = metadata.num_padded_tokens
        query, out = query[:t], output[:t]
        out.zero_()  # padded rows finite; a row no kernel writes shows up as wrong, not as garbage
        if metadata.max_query_len > 1:  # host branch: one query len per graph at UNIFORM_BATCH
            k, v, cu_k = gather_contiguous_kv(kv_cache, metadata, k_scale, v_scale, query.dtype)
            ops.flash_attn_varlen_func(
                q=query,
                k=k,
                v=v,
                cu_seqlens_q=metadata.query_start_loc,
                cu_seqlens_k=cu_k,
                max_seqlen_q=metadata.max_query_len,
                max_seqlen_k=metadata.max_seq_len,
                min_seqlen_q=1,
                dropout_p=0.0,
                softmax_scale=c.scale,
                causal=True,
                out=out,
            )
        ops.paged_attention_v1(
            out,
            self.workspace,
            query,
            kv_cache[0],
            kv_cache[1],
            c.scale,
            metadata.block_table,
            metadata.query_start_loc,
            metadata.seq_lens,
            c.max_model_len,
            None,
            c.kv_cache_dtype,
            "NHD",
            0.0,
            k_scale,
            v_scale,
            None,
            PARTITION_SIZE,
        )
        return output


class AiterNativeImpl(AiterImpl):
    def _ops(self):
        return _native_ops()


class AiterEmulatedImpl(AiterImpl):
    ops = aiter_ops_emulated


@functools.lru_cache(maxsize=1)
def _probe_native() -> str | None:
    if torch.version.hip is None:
        return "unavailable: needs ROCm (torch.version.hip is None)"
    try:
        import aiter  # noqa: F401  (JIT-compiles with hipcc at import; fails off ROCm)
    except Exception as exc:  # noqa: BLE001 - ImportError, or the JIT build failing
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"unavailable: import aiter failed: {first}"
    return None


@functools.lru_cache(maxsize=1)
def _native_ops():
    import aiter

    # paged_attention_v1 is registered as torch.ops.aiter.paged_attention_v1 by `import aiter`.
    return types.SimpleNamespace(
        flash_attn_varlen_func=aiter.flash_attn_varlen_func, paged_attention_v1=torch.ops.aiter.paged_attention_v1
    )


class AiterBackend(AttentionBackend):
    name: ClassVar[str] = "aiter"
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16)
    builder_cls = PersistentMetadataBuilder
    impl_cls = AiterNativeImpl

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        from backend.attention.capabilities import ASK_CLASS, aiter_native_unavailable, device_class

        why = aiter_native_unavailable(device_class(device))
        return _probe_native() if why == ASK_CLASS else why


# aiter-emulated's torch stand-ins beyond this working set are unsupported on a GPU (where
# aiter-triton runs AITER's own kernels); CPU shapes are tiny.
EMULATED_GPU_WORKSET_LIMIT_BYTES = 1 << 30


def emulated_workset_reason(config: AttentionConfig, nbytes: int, what: str, shape: str = "") -> str | None:
    """Why aiter-emulated does not run this shape on a GPU (its stand-ins' fp32 working set over
    the limit), or None."""
    if torch.device(config.device).type == "cpu" or nbytes <= EMULATED_GPU_WORKSET_LIMIT_BYTES:
        return None
    return (
        f"aiter-emulated's {what} ~{nbytes / 2**30:.1f} GiB at this shape{' ' + shape if shape else ''}, "
        f"over its {EMULATED_GPU_WORKSET_LIMIT_BYTES >> 30} GiB limit on a GPU: use aiter-triton there"
    )


class AiterEmulatedBackend(AiterBackend):
    name: ClassVar[str] = "aiter-emulated"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16, torch.float32)
    impl_cls = AiterEmulatedImpl

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        return None

    @classmethod
    def unsupported_reasons(cls, config: AttentionConfig) -> list[str]:
        # Its torch stand-ins gather every request's K/V densely up to the host max_seqlen (the
        # whole max_model_len in a captured graph), in fp32: at full.yaml's GPU shape one case asked
        # the H200 for 132 GiB, and the OOMs that followed failed innocent cases.
        dense = config.max_num_seqs * config.max_model_len * config.num_kv_heads * config.head_size * 4 * 2
        why = emulated_workset_reason(config, dense, "dense K/V gathers need", "(max_num_seqs x max_model_len)")
        return super().unsupported_reasons(config) + ([why] if why else [])
