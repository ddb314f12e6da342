"""Which `vllm:NAME`s exist: checked before anything runs, so a typo is bad input, not 75 skips.

`vllm:NOPE` (or `vllm:flex_attention`) used to be a skip with "vLLM has no attention backend" in
every cell, and a run of nothing but skips passed. A name is checked against every backend registry
of the vLLM this process imports (from 0.33 AttentionBackendEnum and, apart from it, the Mamba-type
MambaAttentionBackendEnum that holds GDN_ATTN; `_Backend` for the seed's releases: each interface's
`names()`), and where those cannot be read (vllm not installed, or it does not import here) against
the names orch knows: vLLM 0.34.0's two registries. The answer is one line with the closest name.
Names are case-sensitive, as vLLM's enums are.
"""

from __future__ import annotations

import difflib

# vLLM 0.34.0's AttentionBackendEnum members (vllm/v1/attention/backends/registry.py of the wheel).
ATTENTION_034 = (
    "FLASH_ATTN", "FLASH_ATTN_DIFFKV", "TRITON_ATTN", "TRITON_ATTN_DIFFKV", "TRITON_FLASH_ATTN", "ROCM_ATTN",
    "ROCM_SEGMENTED_ATTN", "ROCM_AITER_MLA", "ROCM_AITER_TRITON_MLA", "ROCM_AITER_FA", "ROCM_AITER_MLA_SPARSE",
    "XPU_MLA_SPARSE", "TORCH_SDPA", "FLASHINFER", "FLASHINFER_TS", "TRITON_FLASHINFER", "FLASHINFER_MLA",
    "TOKENSPEED_MLA", "FLASHINFER_MLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM120", "FLASHINFER_MLA_SPARSE_SM90",
    "TRITON_MLA", "CUTLASS_MLA", "FLASHMLA", "FLASHMLA_SPARSE", "FLASHMLA_SPARSE_DSV4", "FLASHINFER_MLA_SPARSE_DSV4",
    "ROCM_FLASHMLA_SPARSE_DSV4", "FLASHMLA_SPARSE_DSV41", "FLASHINFER_MLA_SPARSE_DSV41", "ROCM_FLASHMLA_SPARSE_DSV41",
    "FLASHMLA_MEGA_ATTN_DSV41", "B12X", "FLASH_ATTN_MLA", "FLASH_ATTN_MLA_SPARSE", "FLASH_ATTN_MLA_SPARSE_FA4",
    "MINIMAX_M3_SPARSE", "CUTLASS_MSA", "TRITON_MSA", "STEP5_DSA", "KIMI_K3_KV_BALANCED_MLA", "NO_ATTENTION",
    "FLEX_ATTENTION", "HPC_ATTN", "ROCM_AITER_UNIFIED_ATTN", "CPU_ATTN", "CPU_MLA", "AMX_MLA", "TURBOQUANT",
    "ROCM_OCTAVE", "ULTRAQUANT", "CUSTOM",
)  # fmt: skip # vLLM's names in its enum's order, packed
# Its MambaAttentionBackendEnum members (same file): the state layers' backends of hybrid models.
MAMBA_034 = ("MAMBA1", "MAMBA2", "SHORT_CONV", "LINEAR", "GDN_ATTN", "CUSTOM")
KNOWN_034 = tuple(dict.fromkeys(ATTENTION_034 + MAMBA_034))


def registry() -> tuple[tuple[str, ...], str]:
    """(the names a `vllm:` backend may have here, whose names they are)."""
    from backend.adapters import vllm as package

    iface, _ = package.current_interface()  # torch-free when vllm is not installed
    names = iface.names() if iface is not None else None
    if names is None:
        return KNOWN_034, "vLLM 0.34.0 (vllm is not importable here: the names orch knows)"
    return names, f"vLLM {package.installed_version()}"


def name_error(name: str) -> str | None:
    """Why `name` (the part after `vllm:`) names no backend, with the closest one; None if it does."""
    names, whose = registry()
    if name in names:
        return None
    same = [n for n in names if n.lower() == name.lower()]
    close = same or difflib.get_close_matches(name.upper(), names, n=1, cutoff=0.6)
    hint = f"did you mean vllm:{close[0]}?" if close else "`orch doctor` lists the ones orch bridges"
    return f"vllm:{name} is not an attention backend of {whose} ({hint})"
