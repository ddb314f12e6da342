"""The ops vLLM 0.10.2/0.11.0's ROCM_AITER_FA (vllm/v1/attention/backends/rocm_aiter_fa.py) defines
only under `if current_platform.is_rocm()`, registered off ROCm over orch's AITER emulation
(backend/providers/aiter_ops_emulated.py: the documented semantics of AITER's two native ops, host
ints honoured as a graph freezes them). Off ROCm the module imports, but its Impl calls ops that
do not exist:

    torch.ops.vllm.flash_attn_varlen_func   the module's flash_attn_varlen_func_impl, registered with
                                            direct_register_custom_op: `vllm_layout_trans` (a Triton
                                            gather of each prefill request's K/V out of the paged
                                            cache) + aiter.flash_attn_varlen_func(min_seqlen_q=1,
                                            causal=True)
    torch.ops.aiter.paged_attention_v1      registered by `import aiter` (a compiled HIP kernel)

`current_platform.is_rocm()` is not forced: it changes far more than this module (the platform
class, its fp8 dtype, its ops, the backend selection). So what runs is vLLM's builder and Impl
(its metadata, its Python branch on max_query_len, the order and arguments of its calls, the
tensors it freezes into a graph) over our stand-ins for AITER's kernels and vLLM's Triton gather:
every result says so (versions["emulated"], versions["kernels"] = "emulated"). That is where the
seed bug lived (#22721/#25104); AITER's kernels themselves are not under test here.

The stand-ins are graph-safe (no host sync; shapes from host ints and static shapes only), so the
CPU graph emulation and real CUDA graphs capture them as they would vLLM's kernels. Registered as
CompositeImplicitAutograd: they decompose into aten ops, which the CPU graph emulation records.
"""

from __future__ import annotations

import torch

from backend.adapters.vllm.native import note
from backend.providers import aiter_ops_emulated

_LIBRARIES: dict[str, torch.library.Library] = {}

# vLLM's schema for the op (what direct_register_custom_op infers from flash_attn_varlen_func_impl's
# signature, mutates_args=["out"]); host ints are SymInt as torch infers them.
_VARLEN_SCHEMA = (
    "flash_attn_varlen_func(Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) out, Tensor cu_seqlens_q, "
    "Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, float softmax_scale, SymInt[]? window_size, "
    "float[]? alibi_slopes, Tensor block_table, Tensor k_scale, Tensor v_scale, SymInt total_tokens=0) -> Tensor"
)
# AITER's paged_attention_v1 as vLLM 0.10.2 calls it (18 positional arguments) and
# aiter_ops_emulated.paged_attention_v1 takes them.
_PAGED_SCHEMA = (
    "paged_attention_v1(Tensor(a!) out, Tensor(b!) workspace_buffer, Tensor query, Tensor key_cache, "
    "Tensor value_cache, float scale, Tensor block_tables, Tensor? cu_query_lens, Tensor context_lens, "
    "SymInt max_context_len, Tensor? alibi_slopes, str kv_cache_dtype, str kv_cache_layout, float logits_soft_cap, "
    "Tensor k_scale, Tensor v_scale, Tensor? fp8_out_scale=None, SymInt partition_size=256, SymInt mtp=1, "
    "SymInt sliding_window=0) -> ()"
)

EMULATED_NAMES = (
    "vllm.flash_attn_varlen_func (vllm_layout_trans + aiter varlen: orch's AITER emulation)",
    "aiter.paged_attention_v1 (orch's AITER emulation)",
)


def vllm_layout_trans(
    b_query_lens_loc,
    b_seq_lens_loc,
    block_table,
    k_cache,
    v_cache,
    max_seq_len: int,
    k_scale,
    v_scale,
    output_dtype,
    total_tokens: int,
):
    """vLLM's Triton `vllm_layout_trans` (0.10.2 rocm_aiter_fa.py), in torch: for each request b of
    the launch grid (block_table.shape[0] requests x cdiv(max_seq_len, block_size) blocks, host ints)
    whose query len (from b_query_lens_loc) is > 1, its positions p < seq_len (from b_seq_lens_loc)
    are read from the paged cache through block_table and stored, in `output_dtype` (fp8 times its
    scale), at row b_seq_lens_loc[b] + p of k/v_values [total_tokens, Hkv, D]. Rows nobody writes
    keep torch.empty's contents, as the kernel leaves them. Device values are read live; the grid
    and total_tokens are what the call was made with (frozen by a graph)."""
    block_size, hkv, d = v_cache.shape[1], v_cache.shape[2], v_cache.shape[3]
    n = block_table.shape[0]
    nblocks = -(-max_seq_len // block_size)
    length = nblocks * block_size
    k_values = torch.empty((total_tokens + 1, hkv, d), dtype=output_dtype, device=k_cache.device)
    v_values = torch.empty((total_tokens + 1, hkv, d), dtype=output_dtype, device=v_cache.device)
    # (The extra row takes the stores the kernel masks off, so the scatter needs no host sync.)
    qsl = b_query_lens_loc[: n + 1].to(torch.int64)
    csl = b_seq_lens_loc[: n + 1].to(torch.int64)
    qlen, start, seq = qsl[1:] - qsl[:-1], csl[:-1], csl[1:] - csl[:-1]
    pos = torch.arange(length, device=k_cache.device)
    stored = (qlen[:, None] > 1) & (pos[None, :] < seq[:, None])  # [n, length]
    dest = torch.where(stored, start[:, None] + pos[None, :], total_tokens).clamp(max=total_tokens).reshape(-1)
    blocks = block_table[:, :nblocks].to(torch.int64)
    slots = (blocks[:, pos // block_size] * block_size + pos % block_size).reshape(-1)
    for cache, scale, out in ((k_cache, k_scale, k_values), (v_cache, v_scale, v_values)):
        vals = cache.flatten(0, 1).index_select(0, slots)
        if vals.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
            vals = (vals.float() * scale.float()).to(output_dtype)
        else:
            vals = vals.to(output_dtype)
        out.index_copy_(0, dest, vals)
    return k_values[:total_tokens], v_values[:total_tokens]


def flash_attn_varlen_func_impl(
    q,
    k_cache,
    v_cache,
    out,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    window_size,
    alibi_slopes,
    block_table,
    k_scale,
    v_scale,
    total_tokens: int = 0,
):
    """The module's flash_attn_varlen_func_impl (0.10.2 and 0.11.0 alike), over the stand-ins: the
    same calls with the same arguments."""
    if total_tokens == 0:
        total_tokens = int(cu_seqlens_k[-1].item())
    k, v = vllm_layout_trans(
        cu_seqlens_q, cu_seqlens_k, block_table, k_cache, v_cache, max_seqlen_k, k_scale, v_scale, q.dtype, total_tokens
    )
    return aiter_ops_emulated.flash_attn_varlen_func(
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=cu_seqlens_q,
        max_seqlen_q=max_seqlen_q,
        min_seqlen_q=1,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_k=max_seqlen_k,
        softmax_scale=softmax_scale,
        causal=True,
        alibi_slopes=alibi_slopes,
        window_size=tuple(window_size) if window_size is not None else (-1, -1),
        out=out,
    )


def _paged_attention_v1(*args, **kwargs) -> None:
    aiter_ops_emulated.paged_attention_v1(*args, **kwargs)


def _has(namespace: str, op: str) -> bool:
    try:
        getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return False
    return True


def _register(namespace: str, schema: str, fn) -> bool:
    op = schema.split("(", 1)[0]
    if _has(namespace, op):
        return False
    lib = _LIBRARIES.setdefault(namespace, torch.library.Library(namespace, "FRAGMENT"))
    lib.define(schema)
    lib.impl(op, fn, "CompositeImplicitAutograd")
    return True


def ensure_rocm_aiter_fa_ops() -> tuple[str, ...]:
    """Register the two ops where they do not exist (off ROCm); what is emulated, for the results."""
    _register("vllm", _VARLEN_SCHEMA, flash_attn_varlen_func_impl)
    _register("aiter", _PAGED_SCHEMA, _paged_attention_v1)
    for what in EMULATED_NAMES:
        note(what)
    return EMULATED_NAMES
