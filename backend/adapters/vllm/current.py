"""vLLM's current attention-backend interface (>=0.33,<0.35): one of its v1 backends
(FLEX_ATTENTION, TRITON_ATTN, ...) found by `AttentionBackendEnum[name].get_class()`, with

- its support level from the builder's `get_cudagraph_support(vllm_config, spec)` where a config is
  at hand, else its `_cudagraph_support` class attribute;
- the KV cache in vLLM's own layout: logical [num_blocks, Hkv, block_size, 2 * D] (K | V in the
  content dim), physical order from the backend's supported_kv_cache_layouts() (LBNHC when it
  states none), seen by the checker through a strided view (cache.py);
- CommonAttentionMetadata as the V2 model runner hands it over (padded counts for a FULL step,
  `seq_lens_cpu_upper_bound`; metadata.py);
- the KV write through `do_kv_cache_update` when `forward_includes_kv_cache_update` is False, then
  `forward` on the step's padded rows; the query as the Attention layer hands it (fp8 where the
  Impl declares `supports_quant_query_input`, query.py).

On CPU, FLEX_ATTENTION runs torch's eager flex (fixups.py) and host copies are not pinned; on a
CUDA machine with the Python-only wheel vllm._C_stable_libtorch is an empty stub (native.py).
"""

from __future__ import annotations

import functools
import sys
from typing import Any, ClassVar

import torch

from backend.adapters.vllm import cache as caches
from backend.adapters.vllm import errors, fixups, native
from backend.adapters.vllm import metadata as meta
from backend.adapters.vllm.config import build_vllm_config
from backend.adapters.vllm.query import quantize_query
from backend.adapters.vllm.release import SUPPORTED_RANGE
from backend.adapters.vllm.roles import Interface, VllmContext
from backend.attention.interface import AttentionCGSupport, AttentionConfig
from backend.attention.kv_cache import kv_cache_torch_dtype

# Backends whose kernels run on a CPU torch (FLEX_ATTENTION is pure torch).
CPU_BACKENDS = ("FLEX_ATTENTION",)
_TRITON = ("TRITON_ATTN", "ROCM_AITER_UNIFIED_ATTN")


@functools.cache
def load(name: str) -> tuple[Any, str | None]:
    """(vLLM's backend class, None), or (None, why it cannot be used here)."""
    try:
        native.stub_platform_native()  # before anything resolves vllm.platforms.current_platform
        with errors.quiet_vllm_import():
            from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except Exception as exc:  # noqa: BLE001 - an import that fails for any reason is "unavailable"
        return None, errors.vllm_import_failed(exc)
    fixups.pin_memory_off()
    try:
        member = AttentionBackendEnum[name]
    except (KeyError, ValueError):
        return None, errors.no_such_backend(name)
    try:
        with errors.quiet_vllm_import():
            cls = member.get_class()
    except Exception as exc:  # noqa: BLE001 - e.g. a kernel package missing on this platform
        return None, errors.backend_import_failed(name, exc)
    eager = fixups.cpu_flex_eager(sys.modules[cls.__module__]) if name == "FLEX_ATTENTION" else None
    if eager:
        native.note(eager)
    native.ensure_cache_ops()  # here, so that emulated() is final once the class is loaded
    return cls, None


# vLLM's backend registries: attention backends, and the Mamba-type ones (GDN_ATTN, MAMBA2, ...)
# that hybrid models' state layers use, kept apart from them. A `vllm:` name may be in either.
REGISTRIES = ("AttentionBackendEnum", "MambaAttentionBackendEnum")


@functools.lru_cache(maxsize=1)
def registry_names() -> tuple[str, ...] | None:
    """The members of every backend registry vLLM has (None when its registry module does not import
    here); a registry a release lacks adds nothing."""
    try:
        native.stub_platform_native()
        with errors.quiet_vllm_import():
            from vllm.v1.attention.backends import registry
    except Exception:  # noqa: BLE001 - the name check falls back to the names orch knows
        return None
    enums = [getattr(registry, name, None) for name in REGISTRIES]
    return tuple(dict.fromkeys(m for enum in enums if enum is not None for m in enum.__members__))


def support_level(cls, ctx: VllmContext | None) -> AttentionCGSupport:
    """vLLM's own support level (get_cudagraph_support, else _cudagraph_support), as ours."""
    builder = cls.get_builder_cls()
    level = None
    if ctx is not None:
        try:
            level = builder.get_cudagraph_support(ctx.vllm_config, ctx.kv_cache_spec)
        except Exception:  # noqa: BLE001 - fall back to the class attribute
            level = None
    if level is None:
        level = getattr(builder, "_cudagraph_support", None)
    return AttentionCGSupport[level.name] if level is not None else AttentionCGSupport.NEVER


@functools.lru_cache(maxsize=8)
def vllm_context(name: str, config: AttentionConfig) -> VllmContext:
    """The VllmConfig, KV cache spec and cache layout vLLM's builder and Impl see for one rank."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.kv_cache_layout import KVCacheLayout

    cls, why = load(name)
    if cls is None:
        raise RuntimeError(why)
    vc = build_vllm_config(config, scheduler_kwargs={"is_encoder_decoder": False}, spec_tokens=config.spec_tokens)
    spec = FullAttentionSpec(
        block_size=config.block_size,
        num_kv_heads=config.num_kv_heads,
        head_size=config.head_size,
        dtype=kv_cache_torch_dtype(config),
    )
    layouts = cls.supported_kv_cache_layouts() or (KVCacheLayout.LBNHC,)
    return VllmContext(vc, spec, layouts[0])


class CurrentInterface(Interface):
    name: ClassVar[str] = "current"
    range: ClassVar[tuple[str, str]] = SUPPORTED_RANGE
    cpu_backends: ClassVar[tuple[str, ...]] = CPU_BACKENDS
    sizes_by_spec_tokens: ClassVar[bool] = True  # its VllmConfig carries the case's speculative_config

    def load(self, name):
        return load(name)

    def names(self):
        return registry_names()

    def support(self, name, cls):
        return support_level(cls, None), None

    def context(self, name, config):
        return vllm_context(name, config)

    def allocate_kv_cache(self, name, config):
        return caches.allocate_in_layout(config, vllm_context(name, config).layout)

    def common(self, md):
        from vllm.v1.attention.backend import CommonAttentionMetadata

        c = meta.v2_counts(md)
        return CommonAttentionMetadata(
            query_start_loc=c.query_start_loc,
            query_start_loc_cpu=meta.host(c.query_start_loc),
            seq_lens=c.seq_lens,
            num_reqs=c.num_reqs,
            num_actual_tokens=c.num_tokens,
            max_query_len=md.max_query_len,
            max_seq_len=md.max_seq_len,
            block_table_tensor=c.block_table,
            slot_mapping=c.slot_mapping,
            seq_lens_cpu_upper_bound=meta.host(c.seq_lens),
        )

    def run(self, wrapper, query, key, value, kv_cache, metadata, output):
        cache = caches.as_vllm_view(kv_cache)
        t = metadata.num_padded_tokens
        if not wrapper.includes_update:  # the engine's unified_kv_cache_update, before attention
            wrapper.impl.do_kv_cache_update(wrapper.layer, key[:t], value[:t], cache, metadata.slot_mapping)
        q = query[:t]
        if wrapper.query_quant is not None:  # the layer's fp8 query (K/V stay in the model dtype)
            q = quantize_query(wrapper.query_quant, q, wrapper.layer._q_scale)
        wrapper.impl.forward(wrapper.layer, q, key[:t], value[:t], cache, metadata.vllm, output[:t])
        return output

    def unsupported(self, name, cls, config):
        reasons = []
        if not cls.supports_head_size(config.head_size):
            reasons.append(f"head_size {config.head_size} not supported by vllm:{name}")
        if not cls.supports_block_size(config.block_size):
            reasons.append(f"block_size {config.block_size} not supported by vllm:{name}")
        return reasons

    def platform_reason(self, name, device):
        if name.startswith("ROCM_") and torch.version.hip is None:
            return f"unavailable: vllm:{name} runs on ROCm only"
        if device.type != "cuda" and name not in CPU_BACKENDS:
            kind = "Triton" if name in _TRITON else "CUDA/HIP"
            return f"unavailable: vllm:{name} launches {kind} kernels: it needs a GPU (--devices gpu)"
        missing = native.native_missing(name)
        if missing:
            return f"unavailable: vllm:{name} needs {missing}, which this vllm install lacks (a Python-only wheel?)"
        return None


CURRENT = CurrentInterface()
