"""What the adapter changes in vLLM on a machine its code was not built for (CPU), each in one
place and named in the results where it changes what runs (native.EMULATED)."""

from __future__ import annotations

import torch


def pin_memory_off() -> None:
    """0.33/0.34 on CPU: without a GPU vLLM's platform is "unspecified" (its CPU platform needs
    triton-cpu and a CPU build), which still stages host->device copies in pinned memory: a
    CPU-only torch has no pinned allocator. Host copies stay plain (a module constant vLLM reads at
    call time). The old interface's ROCM_AITER_FA path pins nothing, so it needs no such change."""
    if torch.cuda.is_available():
        return
    import sys

    import vllm.utils.torch_utils as tu

    tu.PIN_MEMORY = False
    # Modules that imported the constant by name keep their own copy (GDN's builder's helpers:
    # vllm/v1/attention/backends/utils.py compute_causal_conv1d_metadata).
    utils = sys.modules.get("vllm.v1.attention.backends.utils")
    if utils is not None and hasattr(utils, "PIN_MEMORY"):
        utils.PIN_MEMORY = False


def cpu_flex_eager(module) -> str | None:
    """FLEX_ATTENTION on CPU: torch.compile's CPU lowering of flex attention asserts that the
    block mask spans the whole KV (flex_cpu.py: seq_len_kv <= kv_indices width x KV block), and
    vLLM's direct block mask is as wide as the batch's pages, not the cache: every step fails
    inside inductor. Run torch's eager flex_attention with vLLM's own block mask and mask_mod
    instead (a module global of vLLM's; the result's versions["emulated"] says so)."""
    if torch.cuda.is_available() or not hasattr(module, "flex_attention_compiled"):
        return None
    import torch.nn.attention.flex_attention as fa

    # Eager flex still wraps its op in torch.compile(backend="eager"), which refuses to trace
    # under the CPU graph emulation's dispatch mode; torch's debug switch calls the op directly.
    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    module.flex_attention_compiled = module.flex_attention
    return "flex_attention eager (CPU)"
