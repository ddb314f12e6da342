"""`orch doctor`'s pure decisions about the environment (orchestrator/commands/doctor.py collects
and renders them): which variables pick GPUs and switch collectives and Ray's token auth, what Ray
sets per platform and how the variables conflict with it, and each GPU arch's fp8 format.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

# Variables that pick visible GPUs, and Ray's switches that stop it from setting them.
VISIBLE_DEVICE_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES",
)
# NCCL reads these; RCCL (torch's "nccl" backend on ROCm) reads the same NCCL_* names.
COLLECTIVE_VARS = (
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_SOCKET_IFNAME",
    "NCCL_DEBUG",
    "TORCH_NCCL_BLOCKING_WAIT",
    "RCCL_MSCCL_ENABLE",
    "HSA_FORCE_FINE_GRAIN_PCIE",
)
RAY_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def fp8_dtype_for_arch(arch: str | None) -> str:
    """The fp8 format a GPU uses: e4m3fnuz on gfx942 (MI300X/MI325X), e4m3fn elsewhere (NVIDIA,
    gfx950 MI350X/MI355X, CPU). e4m3fnuz's max is 240, e4m3fn's 448."""
    return "float8_e4m3fnuz" if (arch or "").split(":")[0] == "gfx942" else "float8_e4m3fn"


def platform_name(hip_version: str | None, cuda_version: str | None, gpu_available: bool) -> str:
    if not gpu_available:
        return "CPU"
    return "ROCm" if hip_version else "CUDA" if cuda_version else "CPU"


def ray_visible_var(platform: str) -> str | None:
    """The variable Ray sets for a GPU worker (ray/_private/accelerators: HIP_VISIBLE_DEVICES on
    AMD since 2.45, CUDA_VISIBLE_DEVICES on NVIDIA)."""
    return {"ROCm": "HIP_VISIBLE_DEVICES", "CUDA": "CUDA_VISIBLE_DEVICES"}.get(platform)


def visible_device_findings(env: Mapping[str, str], platform: str) -> tuple[str, ...]:
    """Conflicts between the visible-device variables and what Ray 2.60 does with them."""
    out = []
    hip, rocr, cuda = (env.get(k) for k in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"))
    if platform == "ROCm":
        if rocr is not None and hip is None:
            out.append(
                "error: ROCR_VISIBLE_DEVICES is set without HIP_VISIBLE_DEVICES: Ray raises "
                "'Please use HIP_VISIBLE_DEVICES instead of ROCR_VISIBLE_DEVICES' when it assigns GPUs"
            )
        elif rocr is not None:
            out.append(
                "warning: ROCR_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES both set: HIP indexes into the "
                "devices ROCR leaves, so Ray's HIP ids may name other GPUs; unset ROCR_VISIBLE_DEVICES"
            )
        if cuda is not None:
            out.append(
                "warning: CUDA_VISIBLE_DEVICES is set on ROCm: HIP honours it too, and Ray sets only "
                "HIP_VISIBLE_DEVICES, so workers may see fewer or other GPUs; unset it"
            )
        if env.get("RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES", "").lower() in ("1", "true"):
            out.append("warning: RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES is on: every worker sees every GPU")
    elif platform == "CUDA":
        for var in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
            if env.get(var) is not None:
                out.append(f"note: {var} is set but ignored on NVIDIA")
        if env.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "").lower() in ("1", "true"):
            out.append("warning: RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES is on: every worker sees every GPU")
    return tuple(out)


def ray_auth_state(env: Mapping[str, str], home: Path) -> str:
    """Token auth as a new local cluster will have it (Ray >= 2.59 turns it on unless
    RAY_AUTH_MODE says otherwise). Names and file presence only, never a token's value."""
    mode = env.get("RAY_AUTH_MODE")
    token = (
        "RAY_AUTH_TOKEN set"
        if env.get("RAY_AUTH_TOKEN")
        else "RAY_AUTH_TOKEN_PATH set"
        if env.get("RAY_AUTH_TOKEN_PATH")
        else "~/.ray/auth_token present"
        if (home / ".ray" / "auth_token").is_file()
        else "no token yet"
    )
    if mode is None:
        return f"token (default for a new local cluster; RAY_AUTH_MODE unset; {token})"
    return f"{mode.lower()} (RAY_AUTH_MODE={mode}; {token})"
