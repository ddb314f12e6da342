"""vLLM's compiled code where this install lacks it, shared by both interfaces: the KV write
(`torch.ops._C_cache_ops.reshape_and_cache_flash`, in vllm._C, which the Python-only wheel does not
ship and the full wheel builds for another torch), and empty stubs for the compiled modules
vLLM's platform classes import at module level. Everything that runs in place of vLLM's own code
is listed in EMULATED, which every result carries (versions["emulated"])."""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
import sys
import types

import torch

from backend.attention.kv_cache import write_slots

# What runs in place of vLLM's own code in this process, in the order it was put in place.
EMULATED: list[str] = []

# Compiled modules a backend's kernels live in, beyond vLLM's Python: absent from the trimmed
# Python-only wheel (benchmarks/build_vllm_wheel.py).
NATIVE = {
    "FLASH_ATTN": ("vllm.vllm_flash_attn._vllm_fa2_C", "vllm.vllm_flash_attn._vllm_fa3_C"),
    "FLASHINFER": ("flashinfer",),
}

# Compiled modules vLLM's platform classes import at module level, stubbed where a Python-only
# install lacks them: vllm/platforms/cuda.py runs `import vllm._C_stable_libtorch` (0.33/0.34; its
# import_kernels() treats the same module as optional) or `import vllm._C` (0.10.2/0.11.0, line
# 18) at import, so without a stub no backend that reads current_platform (TRITON_ATTN does at
# import; every backend of the old interface does through vllm.config) loads on a CUDA machine.
# The stub registers no op: a backend that needs one of its ops fails on that op, by name. The same
# applies to the full wheel's module when it cannot load (built for vLLM's pinned torch).
PLATFORM_NATIVE = ("vllm._C_stable_libtorch",)
PLATFORM_NATIVE_OLD = ("vllm._C",)


def note(what: str) -> None:
    if what not in EMULATED:
        EMULATED.append(what)


def _install_stub(name: str, label: str) -> None:
    """An empty module for `name`, labelled in results (versions['emulated'])."""
    sys.modules[name] = types.ModuleType(name, "stub: absent from a Python-only vllm (backend/adapters/vllm/native.py)")
    note(f"{name} ({label})")


def native_missing_module(name: str) -> bool:
    """The compiled module does not load here: absent (Python-only wheel) or built for another
    torch / a CUDA driver this machine lacks (what vLLM's own import would hit)."""
    try:
        importlib.import_module(name)
    except (ImportError, OSError):
        return True
    return False


def stub_platform_native(force: bool = False, names: tuple[str, ...] = PLATFORM_NATIVE) -> tuple[str, ...]:
    """Empty modules for the absent `names` (on a CUDA machine, or `force`); the names stubbed."""
    if not (force or torch.cuda.is_available()):
        return ()
    stubbed = []
    for name in names:
        if name in sys.modules:
            continue
        if native_missing_module(name):
            _install_stub(name, "empty stub")
            stubbed.append(name)
    return tuple(stubbed)


# Capability queries vLLM's quantization utilities answer at import on CUDA through compiled ops
# (w8a8_utils: CUTLASS_BLOCK_FP8_SUPPORTED = cutlass_block_fp8_supported()), which a Python-only
# wheel lacks: the GDN layer module reaches them through its quantization configs. Answered False
# (no compiled CUTLASS kernel is here to run), and labelled.
CAPABILITY_QUERIES = (
    "cutlass_scaled_mm_supports_fp8",
    "cutlass_scaled_mm_supports_block_fp8",
    "cutlass_group_gemm_supported",
)


def _compiled_op(name: str) -> bool:
    try:
        getattr(torch.ops._C, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _unsupported(*_args: object, **_kwargs: object) -> bool:
    return False


def stub_capability_queries(force: bool = False) -> tuple[str, ...]:
    """vllm._custom_ops' CUTLASS capability queries answer False where their compiled op is absent
    (on a CUDA machine, or `force`); the names answered."""
    if not (force or torch.cuda.is_available()):
        return ()
    try:
        ops = importlib.import_module("vllm._custom_ops")
    except ImportError:
        return ()
    done = tuple(n for n in CAPABILITY_QUERIES if hasattr(ops, n) and not _compiled_op(n))
    for name in done:
        setattr(ops, name, _unsupported)
    if done:
        note(f"vllm._custom_ops.{{{', '.join(done)}}} (False: no compiled CUTLASS kernel)")
    return done


# vLLM's MLA common module imports vllm.vllm_flash_attn on CUDA (for forward_mha, the prefill),
# whose package init raises without a compiled FlashAttention. vllm:TRITON_MLA's decode needs none
# of it and its prefill is orch's (adapters/vllm/mla.py), so where the wheel has neither extension
# file, an empty FA2 module lets the import through; a call into it fails on the op, by name.
FLASH_ATTN_EXTENSIONS = ("_vllm_fa2_C", "_vllm_fa3_C")


def stub_flash_attn_extension(force: bool = False) -> tuple[str, ...]:
    """An empty vllm.vllm_flash_attn._vllm_fa2_C where the installed vllm ships neither FlashAttention
    extension (a Python-only wheel), on a CUDA machine or `force`; the names stubbed. Decided by the
    files, not by importing: a failed import of the package would leave its interface module cached
    with FA2_AVAILABLE False."""
    if not (force or torch.cuda.is_available()):
        return ()
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return ()
    package = os.path.join(os.path.dirname(spec.origin), "vllm_flash_attn")
    if not os.path.isdir(package) or any(glob.glob(os.path.join(package, f"{ext}*")) for ext in FLASH_ATTN_EXTENSIONS):
        return ()
    name = f"vllm.vllm_flash_attn.{FLASH_ATTN_EXTENSIONS[0]}"
    if name in sys.modules:
        return ()
    if "vllm.vllm_flash_attn" not in sys.modules:  # a failed import before: its half-made interface goes too
        sys.modules.pop("vllm.vllm_flash_attn.flash_attn_interface", None)
    _install_stub(name, "empty stub: import only, the prefill is orch's")
    return (name,)


def native_missing(name: str) -> str | None:
    """The compiled module backend `name` needs when none of its candidates is importable, else None."""
    candidates = NATIVE.get(name, ())
    for module in candidates:
        try:
            if importlib.util.find_spec(module) is not None:
                return None
        except (ImportError, ValueError):
            continue
    return " or ".join(candidates) or None


_LIBRARY = None


def _reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """vLLM's reshape_and_cache_flash semantics: token i's K/V go to slot slot_mapping[i] of the
    caches [num_blocks, block_size, Hkv, D] (strided views allowed); slot -1 writes nothing; the
    number of tokens written is slot_mapping's length (the old interface hands the padded key with
    the real tokens' slots). fp8 is written in the cache tensor's own fp8 format."""
    write_slots(key_cache, key, slot_mapping, k_scale)
    write_slots(value_cache, value, slot_mapping, v_scale)


def ensure_cache_ops() -> tuple[str, ...]:
    """Register the emulated KV write when vLLM's compiled one is not loaded; what is emulated in
    this process."""
    global _LIBRARY
    try:
        torch.ops._C_cache_ops.reshape_and_cache_flash  # noqa: B018 - present when vllm._C loaded
    except (AttributeError, RuntimeError):
        if _LIBRARY is None:
            lib = torch.library.Library("_C_cache_ops", "FRAGMENT")
            lib.define(
                "reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, "
                "Tensor(b!) value_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, "
                "Tensor v_scale) -> ()"
            )
            # Composite: it decomposes into aten ops, which the CPU graph emulation records.
            lib.impl("reshape_and_cache_flash", _reshape_and_cache_flash, "CompositeImplicitAutograd")
            _LIBRARY = lib
            note("reshape_and_cache_flash")
    return tuple(EMULATED)
