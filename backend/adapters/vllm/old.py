"""vLLM's old attention-backend interface (>=0.10.2,<0.12: the seed's releases, 0.10.2 with #22721
and without #25104, 0.11.0 the first with it; docs/VLLM.md "The seed's release"), read from the
released wheels. What differs from the current interface (current.py), and how it is bridged:

- **Lookup and names.** No AttentionBackendEnum.get_class(): the `_Backend` enum is in
  vllm/platforms/interface.py, and a platform's get_attn_backend_cls() turns it into a class path
  (ROCM_AITER_FA only on ROCm with VLLM_ROCM_USE_AITER/_MHA on gfx9). CLASS_PATHS holds those
  paths, as the platforms (rocm.py, cuda.py) of both releases spell them; a name is checked
  against the release's `_Backend` (0.10.2 spells some with a `_VLLM_V1` suffix: TRITON_ATTN is
  its TRITON_ATTN_VLLM_V1; either spelling is accepted). The backend's own get_name() is not its
  lookup name (0.10.2's AITER FA calls itself FLASH_ATTN_VLLM_V1, 0.11.0's FLASH_ATTN).
- **Support level.** The builder's `cudagraph_support` class attribute (not `_cudagraph_support`,
  not get_cudagraph_support): read, and a builder without it is a skip with that reason, never NEVER.
- **Cache.** get_kv_cache_shape() is (2, num_blocks, block_size, Hkv, D): orch's own layout, one
  tensor for both sides (cache.py). An fp8 cache holds the format the Impl reads (FP8_READ_AS).
- **Metadata.** CommonAttentionMetadata needs `seq_lens_cpu` and `num_computed_tokens_cpu`, and is
  handed over with the V1 runner's real counts (metadata.v1_counts).
- **Cache dtypes.** Not declared: an Impl refuses a cache dtype it does not take when it is built
  (0.10.2's FLEX: quantized caches), so impl_kv_dtypes asks it (a skip with the reason, not an ERROR).
- **Impl call.** The KV write is inside `forward` (reshape_and_cache_flash, emulated where vllm._C
  is absent: native.py); the layer hands the padded rows and the Impl slices its real tokens by
  num_actual_tokens, as the V1 model runner runs it. 0.10.2's layer quantises no query; 0.11.0's
  reads `supports_quant_query_input` on the backend class (False for ROCM_AITER_FA).
- **Kernels.** ROCM_AITER_FA's ops exist only on ROCm: off ROCm they are registered over orch's
  AITER emulation (rocm_ops.py), and results say `kernels: emulated`.
- **Config.** ModelConfig(use_async_output_proc=False): V0's async output check asks the platform,
  which off CUDA/ROCm ("unspecified") raises NotImplementedError; V1 never uses it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any, ClassVar

import torch

from backend.adapters.vllm import cache as caches
from backend.adapters.vllm import errors, fixups, native, rocm_ops
from backend.adapters.vllm import metadata as meta
from backend.adapters.vllm.config import build_vllm_config
from backend.adapters.vllm.query import quantize_query
from backend.adapters.vllm.release import OLD_RANGE
from backend.adapters.vllm.roles import Interface, VllmContext
from backend.attention.interface import AttentionCGSupport, AttentionConfig
from backend.attention.kv_cache import kv_cache_torch_dtype

# orch's name (the current interface's) -> the class path the release's platforms resolve it to.
CLASS_PATHS = {
    "ROCM_AITER_FA": "vllm.v1.attention.backends.rocm_aiter_fa:AiterFlashAttentionBackend",  # rocm.py
    "TRITON_ATTN": "vllm.v1.attention.backends.triton_attn:TritonAttentionBackend",  # cuda.py, rocm.py
    "FLASH_ATTN": "vllm.v1.attention.backends.flash_attn:FlashAttentionBackend",  # cuda.py
    "FLEX_ATTENTION": "vllm.v1.attention.backends.flex_attention:FlexAttentionBackend",  # cuda.py
    "FLASHINFER": "vllm.v1.attention.backends.flashinfer:FlashInferBackend",  # cuda.py
    "TREE_ATTN": "vllm.v1.attention.backends.tree_attn:TreeAttentionBackend",  # cuda.py
}
# Backends whose kernels run here without a GPU: ROCM_AITER_FA's, emulated (rocm_ops.py), and
# FLEX_ATTENTION's (pure torch; eager on CPU as for the current interface, fixups.py).
CPU_BACKENDS = ("ROCM_AITER_FA", "FLEX_ATTENTION")
# How an fp8 cache is read, where the Impl does not read what the platform writes: 0.10.2's
# AiterFlashAttentionImpl.forward views it as float8_e4m3fnuz on every platform (the gfx942
# format); 0.11.0 as current_platform.fp8_dtype() (e4m3fn off ROCm, as the platform writes it).
FP8_READ_AS = {("ROCM_AITER_FA", "0.10"): torch.float8_e4m3fnuz}


def _release() -> str:
    from backend.adapters import vllm as package

    return package.installed_version() or ""


def _enum_member(name: str):
    """The release's `_Backend` member for orch's `name` (or its `_VLLM_V1` spelling), or None."""
    from vllm.platforms.interface import _Backend

    for candidate in (name, f"{name}_VLLM_V1"):
        if candidate in _Backend.__members__:
            return _Backend[candidate]
    return None


def _base_name(name: str) -> str:
    return name.removesuffix("_VLLM_V1")


@functools.cache
def load(name: str) -> tuple[Any, str | None]:
    """(vLLM's backend class, None), or (None, why it cannot be used here)."""
    try:
        native.stub_platform_native(names=native.PLATFORM_NATIVE_OLD)  # before current_platform resolves
        with errors.quiet_vllm_import():
            from vllm.platforms import current_platform
    except Exception as exc:  # noqa: BLE001 - an import that fails for any reason is "unavailable"
        return None, errors.vllm_import_failed(exc)
    base = _base_name(name)
    if _enum_member(base) is None:
        return None, errors.no_such_backend(name, _release())
    path = CLASS_PATHS.get(base)
    if path is None:
        from backend.adapters.vllm import family_reason

        return None, family_reason(base) or (
            f"unavailable: vllm:{base} is not bridged for vLLM {_release()} (the old interface knows "
            f"{', '.join(CLASS_PATHS)}: backend/adapters/vllm/old.py)"
        )
    module_name, _, attr = path.partition(":")
    try:
        with errors.quiet_vllm_import():
            module = importlib.import_module(module_name)
        cls = getattr(module, attr)
    except Exception as exc:  # noqa: BLE001 - e.g. a kernel package missing on this platform
        return None, errors.backend_import_failed(base, exc)
    if base == "ROCM_AITER_FA" and not current_platform.is_rocm():
        rocm_ops.ensure_rocm_aiter_fa_ops()
    eager = fixups.cpu_flex_eager(module) if base == "FLEX_ATTENTION" else None
    if eager:
        native.note(eager)
    native.ensure_cache_ops()  # here, so that emulated() is final once the class is loaded
    return cls, None


def support_level(name: str, cls) -> tuple[AttentionCGSupport, str | None]:
    """The builder's `cudagraph_support` (the old attribute), as ours; never a silent NEVER."""
    level = getattr(cls.get_builder_cls(), "cudagraph_support", None)
    if level is None or not hasattr(level, "name") or level.name not in AttentionCGSupport.__members__:
        return AttentionCGSupport.NEVER, errors.no_support_attribute(name, "cudagraph_support")
    return AttentionCGSupport[level.name], None


def fp8_read_as(name: str) -> torch.dtype | None:
    minor = ".".join(_release().split(".")[:2])
    if (name, minor) in FP8_READ_AS:
        return FP8_READ_AS[(name, minor)]
    if name == "ROCM_AITER_FA":
        from vllm.platforms import current_platform

        return current_platform.fp8_dtype()
    return None


@functools.cache
def impl_kv_dtypes(cls) -> tuple[str, ...]:
    """The old interface declares no cache dtypes; an Impl refuses the ones it does not take when
    it is built (0.10.2's FlexAttentionImpl: NotImplementedError "does not support quantized
    kv-cache"). Asked of vLLM's own Impl, built small for each dtype: a refusal makes that kv dtype
    a skip with the reason, not an ERROR in every case. Anything else it raises here is not an
    answer about the dtype (the real build, with the case's shape, will say)."""
    from backend.adapters.vllm.config import KV_DTYPES

    taken = []
    for theirs in KV_DTYPES.values():
        try:
            cls.get_impl_cls()(
                num_heads=2,
                head_size=64,
                scale=0.125,
                num_kv_heads=1,
                alibi_slopes=None,
                sliding_window=None,
                kv_cache_dtype=theirs,
                logits_soft_cap=None,
            )
        except NotImplementedError:
            continue
        except Exception:  # noqa: BLE001 - not a refusal of the dtype
            pass
        taken.append(theirs)
    return tuple(taken)


@functools.lru_cache(maxsize=8)
def vllm_context(name: str, config: AttentionConfig) -> VllmContext:
    """The VllmConfig and KV cache spec vLLM's builder and Impl see for one rank's config."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    cls, why = load(name)
    if cls is None:
        raise RuntimeError(why)
    vc = build_vllm_config(config, model_kwargs={"use_async_output_proc": False})
    fields = {f.name for f in dataclasses.fields(FullAttentionSpec)}
    extra = {"use_mla": False} if "use_mla" in fields else {}
    spec = FullAttentionSpec(
        block_size=config.block_size,
        num_kv_heads=config.num_kv_heads,
        head_size=config.head_size,
        dtype=kv_cache_torch_dtype(config),
        **extra,
    )
    return VllmContext(vc, spec, None)


class OldInterface(Interface):
    name: ClassVar[str] = "old"
    range: ClassVar[tuple[str, str]] = OLD_RANGE
    cpu_backends: ClassVar[tuple[str, ...]] = CPU_BACKENDS

    def load(self, name):
        return load(_base_name(name))

    def names(self):
        try:
            native.stub_platform_native(names=native.PLATFORM_NATIVE_OLD)
            with errors.quiet_vllm_import():
                from vllm.platforms.interface import _Backend
        except Exception:  # noqa: BLE001 - the name check falls back to the names orch knows
            return None
        return tuple(dict.fromkeys(_base_name(n) for n in _Backend.__members__))

    def support(self, name, cls):
        return support_level(_base_name(name), cls)

    def context(self, name, config):
        return vllm_context(_base_name(name), config)

    def allocate_kv_cache(self, name, config):
        cls, why = self.load(name)
        if cls is None:
            raise RuntimeError(why)
        shape = cls.get_kv_cache_shape(config.num_blocks, config.block_size, config.num_kv_heads, config.head_size)
        return caches.allocate_plain(config, shape, fp8_read_as(_base_name(name)))

    def common(self, md):
        from vllm.v1.attention.backends.utils import CommonAttentionMetadata

        c = meta.v1_counts(md)
        qsl_cpu, seq_cpu = meta.host(c.query_start_loc), meta.host(c.seq_lens)
        return CommonAttentionMetadata(
            query_start_loc=c.query_start_loc,
            query_start_loc_cpu=qsl_cpu,
            seq_lens=c.seq_lens,
            seq_lens_cpu=seq_cpu,
            num_computed_tokens_cpu=seq_cpu - (qsl_cpu[1:] - qsl_cpu[:-1]),
            num_reqs=c.num_reqs,
            num_actual_tokens=c.num_tokens,
            max_query_len=md.max_query_len,
            max_seq_len=md.max_seq_len,
            block_table_tensor=c.block_table,
            slot_mapping=c.slot_mapping,
            causal=True,
        )

    def query_declarer(self, cls, impl):
        return cls  # 0.11.0's layer reads the backend class's flag; 0.10.2's has none (and none declares it)

    def run(self, wrapper, query, key, value, kv_cache, metadata, output):
        q = query
        if wrapper.query_quant is not None:
            q = quantize_query(wrapper.query_quant, q, wrapper.layer._q_scale)
        wrapper.impl.forward(wrapper.layer, q, key, value, kv_cache, metadata.vllm, output=output)
        return output

    def kv_dtypes(self, cls):
        return impl_kv_dtypes(cls)

    def dtypes(self, cls):
        if hasattr(cls, "get_supported_dtypes"):
            return tuple(cls.get_supported_dtypes())
        return (torch.bfloat16, torch.float16, torch.float32)

    def unsupported(self, name, cls, config):
        reasons = []
        sizes = cls.get_supported_head_sizes() if hasattr(cls, "get_supported_head_sizes") else None
        if sizes and config.head_size not in sizes:
            reasons.append(
                f"head_size {config.head_size} not supported by vllm:{_base_name(name)} "
                f"(vLLM {_release()}: {', '.join(map(str, sizes))})"
            )
        try:
            cls.get_kv_cache_shape(config.num_blocks, config.block_size, config.num_kv_heads, config.head_size)
        except ValueError as exc:
            reasons.append(f"block_size {config.block_size} not supported by vllm:{_base_name(name)}: {exc}")
        return reasons

    def platform_reason(self, name, device):
        base = _base_name(name)
        if base in CPU_BACKENDS:
            return None
        if device.type != "cuda":
            kind = "Triton" if base == "TRITON_ATTN" else "CUDA/HIP"
            return f"unavailable: vllm:{base} launches {kind} kernels: it needs a GPU (--devices gpu)"
        missing = native.native_missing(base)
        if missing:
            return f"unavailable: vllm:{base} needs {missing}, which this vllm install lacks (a Python-only wheel?)"
        return None

    def kernels(self, name):
        if _base_name(name) != "ROCM_AITER_FA":
            return None
        from vllm.platforms import current_platform

        return None if current_platform.is_rocm() else "emulated"


OLD = OldInterface()
