"""What the planner needs to know about a provider, without importing it (start-up time).

The planner (orch plan, the driver of orch run) asks four things of every backend of a matrix: its
cudagraph support level, its kv cache dtypes, its model dtypes, and whether it can run on this
device class. For the builtin providers the answers are declared here, torch-free, so the driver
never imports torch, Triton or a kernel module; tests/backend/test_capabilities.py holds every
declaration to the class it describes (the class stays the authority: the worker uses it). A
plugin given as "package.module:Class" is imported and read (its module imports torch anyway).

Availability here may answer ASK_CLASS: "only the class can tell" (native AITER on a GPU machine
needs torch.version.hip and a JIT import), and then the caller loads the class after all.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from backend.attention.support import AttentionCGSupport

ASK_CLASS = "<ask the class>"

# Device nodes a GPU driver creates; none of them present means no GPU, so torch need not be
# imported to find out (NVIDIA, ROCm's kfd, WSL's dxg).
_GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


@functools.cache
def driver_gpu_count(kfd_topology: str = "/sys/class/kfd/kfd/topology/nodes") -> int | None:
    """The GPUs the driver offers this process, asked without importing torch (the
    driver of `orch run` and `orch plan` on a GPU machine spent seconds importing torch only to
    learn this). NVIDIA: libcuda's cuInit + cuDeviceGetCount, the calls torch's own check ends in
    (CUDA_VISIBLE_DEVICES is honoured by the driver). ROCm: GPU nodes of the KFD topology (nodes
    with a non-zero gfx_target_version). None when it cannot tell (no libcuda, a HIP/ROCR
    visibility mask that sysfs does not apply): the caller asks torch. Asked once per process,
    as the driver reads CUDA_VISIBLE_DEVICES once, at cuInit."""
    if os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0"):
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return None
        count = ctypes.c_int(0)
        if cuda.cuInit(0) != 0:  # e.g. CUDA_ERROR_NO_DEVICE (CUDA_VISIBLE_DEVICES="") or a broken driver
            return 0
        return count.value if cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 else 0
    if os.path.exists("/dev/kfd"):
        if any(v in os.environ for v in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")):
            return None
        return kfd_gpu_count(kfd_topology)
    return None


def driver_gpu_memory() -> int | None:
    """Bytes of memory of the first GPU the driver offers this process, asked as driver_gpu_count
    asks (libcuda: cuDeviceTotalMem_v2, no torch import); None where it cannot tell."""
    if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")):
        return None
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        if cuda.cuInit(0) != 0:
            return None
        dev, size = ctypes.c_int(0), ctypes.c_size_t(0)
        if cuda.cuDeviceGet(ctypes.byref(dev), 0) != 0 or cuda.cuDeviceTotalMem_v2(ctypes.byref(size), dev) != 0:
            return None
        return int(size.value)
    except (OSError, AttributeError):
        return None


def kfd_gpu_count(topology: str) -> int | None:
    """GPU nodes in a KFD topology directory (ROCm's sysfs view; CPU nodes have gfx_target_version
    0). None when the directory cannot be read."""
    try:
        nodes = os.listdir(topology)
    except OSError:
        return None
    gpus = 0
    for node in nodes:
        try:
            with open(os.path.join(topology, node, "properties")) as f:
                props = dict(line.split(None, 1) for line in f if len(line.split(None, 1)) == 2)
        except OSError:
            continue
        if props.get("gfx_target_version", "0").strip() not in ("", "0"):
            gpus += 1
    return gpus


def gpu_visible() -> bool:
    """torch.cuda.is_available(), torch-free where local_gpu_count can ask the driver."""
    return local_gpu_count() > 0


def local_gpu_count() -> int:
    """torch.cuda.device_count() (0 where CUDA/HIP is unavailable), without importing torch
    where no GPU driver is present or the driver can be asked directly (driver_gpu_count)."""
    if "torch" not in sys.modules:
        if not any(os.path.exists(p) for p in _GPU_NODES):
            return 0
        count = driver_gpu_count()
        if count is not None:
            return count
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver is "no GPU", not a crash
        return 0


@dataclass(frozen=True)
class Capabilities:
    """A provider's static capabilities, as the planner reads them (dtypes by torch name)."""

    name: str
    cudagraph_support: AttentionCGSupport
    kv_cache_dtypes: tuple[str, ...]
    dtypes: tuple[str, ...]  # "bfloat16", "float16", "float32"
    unavailable: Callable[[str], str | None]  # device class "cpu" | "gpu" -> reason, None, or ASK_CLASS
    # Kernels compiled on first use in each machine's cache (the class's `jit_kernels`): a local
    # GPU run warms them in helper processes and runs these cases after the others.
    jit_kernels: bool = False
    family: str = "gqa"  # the attention family this class implements (backend/families/)
    # What it supports beyond its family's core (the class's `features`): "sinks" (swa_sinks).
    features: tuple[str, ...] = ()

    def unavailable_reason(self, device_class: str) -> str | None:
        return self.unavailable(device_class)


def device_class(device) -> str:
    """ "gpu" for a CUDA/ROCm torch.device (or its string), else "cpu"."""
    return "gpu" if str(getattr(device, "type", device)).startswith("cuda") else "cpu"


def torch_unavailable(device_class: str) -> str | None:
    if device_class == "gpu" and not gpu_visible():
        return "unavailable: no CUDA/ROCm device visible"
    return None


def aiter_native_unavailable(device_class: str) -> str | None:
    if device_class != "gpu":
        return "unavailable: needs a ROCm GPU"
    if "torch" not in sys.modules and _installed_torch_hip() is None:
        # A CUDA (or CPU) build of torch, read from its version.py without importing it: importing
        # torch costs the planner seconds (docs/BENCHMARKS.md "Figures behind code choices").
        return "unavailable: needs ROCm (torch.version.hip is None)"
    return ASK_CLASS


_HIP_LINE = re.compile(r"^hip\s*(?::[^=]*)?=\s*(.+?)\s*$", re.MULTILINE)


def _installed_torch_hip() -> str | None:
    """torch.version.hip of the installed torch, from the text of torch/version.py (written at
    build time: `hip: Optional[str] = None` or `= '6.2.41133-...'`); "?" when it cannot be read,
    so the caller asks the class."""
    try:
        spec = importlib.util.find_spec("torch")
        origin = spec.origin if spec else None
        if not origin:
            return "?"
        with open(os.path.join(os.path.dirname(origin), "version.py")) as f:
            return hip_of_version_py(f.read())
    except (OSError, ImportError, ValueError):
        return "?"


def hip_of_version_py(text: str) -> str | None:
    """The `hip` value of a torch/version.py text: None, the version string, or "?" (no such line)."""
    m = _HIP_LINE.search(text)
    if m is None:
        return "?"
    value = m.group(1).strip()
    return None if value == "None" else value.strip("'\"")


def aiter_triton_unavailable(device_class: str) -> str | None:
    # aiter_loader.triton_unavailable_reason (the class's answer) is this function.
    if device_class != "gpu" or not gpu_visible():
        return "unavailable: needs a CUDA/ROCm GPU (Triton)"
    if _missing("aiter", package=True):
        return "unavailable: amd-aiter not installed (pip install amd-aiter)"
    if _missing("triton"):
        return "unavailable: triton not installed"
    return None


def _always(device_class: str) -> str | None:
    return None


_ALL = ("bfloat16", "float16", "float32")
_HALF = ("bfloat16", "float16")
_KV = ("auto", "fp8")

_CG = AttentionCGSupport
# (provider, family) -> what its class declares. A provider is a name with one class per family
# it implements (registry._BUILTIN_PATHS); MLA classes declare at most UNIFORM_BATCH, as vLLM's.
BUILTIN_CAPABILITIES: dict[tuple[str, str], Capabilities] = {
    (c.name, c.family): c
    for c in (
        Capabilities("torch", _CG.ALWAYS, _KV, _ALL, torch_unavailable),
        Capabilities("aiter", _CG.UNIFORM_BATCH, _KV, _HALF, aiter_native_unavailable),
        Capabilities("aiter-emulated", _CG.UNIFORM_BATCH, _KV, _ALL, _always),
        Capabilities("aiter-triton", _CG.ALWAYS, _KV, _HALF, aiter_triton_unavailable, jit_kernels=True),
        Capabilities(
            "aiter-triton-pa", _CG.UNIFORM_SINGLE_TOKEN_DECODE, _KV, _HALF, aiter_triton_unavailable, jit_kernels=True
        ),
        Capabilities("torch", _CG.UNIFORM_BATCH, _KV, _ALL, torch_unavailable, family="mla"),
        Capabilities("aiter", _CG.UNIFORM_BATCH, _KV, _HALF, aiter_native_unavailable, family="mla"),
        Capabilities("aiter-emulated", _CG.UNIFORM_BATCH, _KV, _ALL, _always, family="mla"),
        # decode_attention_fwd_grouped_rope takes no fp8 scales: a bf16/fp16 latent cache only.
        Capabilities(
            "aiter-triton",
            _CG.UNIFORM_BATCH,
            ("auto",),
            _HALF,
            aiter_triton_unavailable,
            jit_kernels=True,
            family="mla",
        ),
        # swa_sinks: ALWAYS, as vLLM's TRITON_ATTN and ROCM_AITER_UNIFIED_ATTN declare.
        Capabilities("torch", _CG.ALWAYS, _KV, _ALL, torch_unavailable, family="swa_sinks", features=("sinks",)),
        Capabilities(
            "aiter-triton",
            _CG.ALWAYS,
            _KV,
            _HALF,
            aiter_triton_unavailable,
            jit_kernels=True,
            family="swa_sinks",
            features=("sinks",),
        ),
        # hybrid_gdn: UNIFORM_BATCH, as vLLM's GDN backend declares (the minimum over the groups).
        Capabilities("torch", _CG.UNIFORM_BATCH, _KV, _ALL, torch_unavailable, family="hybrid_gdn"),
        # mla_sparse: UNIFORM_BATCH, as vLLM's sparse MLA backends declare.
        Capabilities("torch", _CG.UNIFORM_BATCH, (*_KV, "fp8_ds_mla"), _ALL, torch_unavailable, family="mla_sparse"),
    )
}


def builtin_families(name: str) -> tuple[str, ...]:
    """The attention families a builtin provider implements, in declaration order (() if none)."""
    return tuple(f for (n, f) in BUILTIN_CAPABILITIES if n == name)


def of_class(cls: type, label: str) -> Capabilities:
    """A loaded backend class's capabilities (plugins; and the reference the builtins are held to)."""

    def unavailable(device_class: str) -> str | None:
        import torch

        try:
            return cls.unavailable_reason(torch.device("cuda" if device_class == "gpu" else "cpu"))
        except Exception as e:  # noqa: BLE001 - a plugin's check that crashes means "cannot run here", said plainly
            return f"{getattr(cls, '__name__', cls)}.unavailable_reason raised {type(e).__name__}: {e}"

    dtypes = getattr(cls, "supported_dtypes", None)
    names = _ALL if dtypes is None else tuple(str(d).removeprefix("torch.") for d in dtypes)
    return Capabilities(
        label,
        AttentionCGSupport(int(cls.cudagraph_support)),
        tuple(getattr(cls, "supported_kv_cache_dtypes", ())),
        names,
        unavailable,
        bool(getattr(cls, "jit_kernels", False)),
        getattr(cls, "family", "gqa"),
        tuple(getattr(cls, "features", ())),
    )


def _missing(name: str, package: bool = False) -> bool:
    """Not installed (found without importing it; `package`: as a package, like aiter_package_dir)."""
    if name in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return True
    return spec is None or (package and not spec.submodule_search_locations)


def mismatches(
    declared: Capabilities, actual: Capabilities, device_classes: tuple[str, ...] = ("cpu", "gpu")
) -> list[str]:
    """How a declaration differs from what its class says (one line each; [] when they agree).
    ASK_CLASS agrees with any answer: the caller asks the class then."""
    out = [
        f"{declared.name}: {field} declared {getattr(declared, field)!r}, class says {getattr(actual, field)!r}"
        for field in ("cudagraph_support", "kv_cache_dtypes", "dtypes", "jit_kernels", "family", "features")
        if getattr(declared, field) != getattr(actual, field)
    ]
    for dc in device_classes:
        mine, theirs = declared.unavailable_reason(dc), actual.unavailable_reason(dc)
        if mine != ASK_CLASS and mine != theirs:
            out.append(f"{declared.name}: on {dc} declared {mine!r}, class says {theirs!r}")
    return out
