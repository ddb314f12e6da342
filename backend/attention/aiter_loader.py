"""The ONE place that imports AITER's Triton kernels (amd-aiter, aiter/ops/triton/).

On ROCm: plain imports (`aiter/__init__.py` runs; it JIT-compiles native ops with hipcc).

On NVIDIA: `aiter/__init__.py` is ROCm-only (it builds HIP extensions at import), but the Triton
kernels under aiter/ops/triton/ are portable. Three steps make them load and launch there
(seen working on an H200, DESIGN.md §3):
 1. Bypass the package init: register namespace stub modules for `aiter` and `aiter.ops` whose
    __path__ points at the installed package directory (found with importlib.util.find_spec, which
    does not execute aiter/__init__.py). `aiter.ops.triton` and below are then imported normally.
 2. Report the arch as gfx950: aiter's utils/types.py evaluates `get_arch() in ("gfx950")` at
    import, and Triton's CUDA target arch is an int (e.g. 90), so as shipped it raises TypeError.
    gfx950 also selects fp8 = float8_e4m3fn, the NVIDIA format, and the MI350X config files.
 3. Strip the AMD-only launch options (waves_per_eu, matrix_instr_nonkdim, kpack) that the
    wrappers pass to kernel launches (select_*_config in unified_attention.py, the MHA json
    configs); Triton's CUDA backend rejects unknown launch options.
Nothing here is vendored: the installed package is used as is, only wrapped.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types

import torch

AMD_ONLY_LAUNCH_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
# Modules whose kernel launches we use; their module-level kernel references get wrapped on NVIDIA.
_LAUNCHER_MODULES = (
    "aiter.ops.triton.unified_attention",
    "aiter.ops.triton.pa_decode",
    "aiter.ops.triton.mha",
)


class AiterLoadError(RuntimeError):
    """amd-aiter's Triton kernels cannot be loaded here (one-line message)."""


def aiter_package_dir() -> str | None:
    """Directory of the installed `aiter` package, without importing it (None if not installed)."""
    if "aiter" in sys.modules and getattr(sys.modules["aiter"], "__path__", None):
        return list(sys.modules["aiter"].__path__)[0]
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _register_namespace_stubs(package_dir: str) -> None:
    # Stub modules stand in for aiter/__init__.py and aiter/ops/__init__.py; submodules resolve
    # through __path__ as for any package.
    for name, path in (("aiter", package_dir), ("aiter.ops", f"{package_dir}/ops")):
        if name in sys.modules:
            continue
        stub = types.ModuleType(name)
        stub.__path__ = [path]
        stub.__package__ = name
        stub.__file__ = None
        sys.modules[name] = stub
    sys.modules["aiter"].ops = sys.modules["aiter.ops"]


def _report_gfx950() -> None:
    arch_info = importlib.import_module("aiter.ops.triton.utils._triton.arch_info")
    arch_info.get_arch = lambda: "gfx950"  # noqa: E731  (module global: get_device() etc. see it too)


class _NvidiaLaunch:
    """Wraps a Triton kernel so `kernel[grid](..., waves_per_eu=2)` launches without the AMD-only
    options. Everything else (attributes, autotuner state) passes through to the kernel."""

    def __init__(self, kernel):
        self._kernel = kernel

    def __getitem__(self, grid):
        launch = self._kernel[grid]

        def run(*args, **kwargs):
            for option in AMD_ONLY_LAUNCH_OPTIONS:
                kwargs.pop(option, None)
            return launch(*args, **kwargs)

        return run

    def __getattr__(self, name):
        return getattr(self._kernel, name)


def _strip_amd_launch_options(module) -> None:
    from triton.runtime import KernelInterface

    for name, obj in list(vars(module).items()):
        if isinstance(obj, KernelInterface):
            setattr(module, name, _NvidiaLaunch(obj))


@functools.lru_cache(maxsize=1)
def load_aiter_triton() -> types.SimpleNamespace:
    """unified_attention, paged_attention_decode (pa_decode) and the Triton MHA
    flash_attn_varlen_func from the installed amd-aiter. Raises AiterLoadError."""
    package_dir = aiter_package_dir()
    if package_dir is None:
        raise AiterLoadError("amd-aiter not installed (pip install amd-aiter)")
    try:
        if torch.version.hip is None:
            _register_namespace_stubs(package_dir)
            _report_gfx950()
        modules = {name: importlib.import_module(name) for name in _LAUNCHER_MODULES}
        if torch.version.hip is None:
            for module in modules.values():
                _strip_amd_launch_options(module)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise AiterLoadError(f"loading aiter's Triton kernels failed: {type(exc).__name__}: {first}") from exc
    return types.SimpleNamespace(
        unified_attention=modules["aiter.ops.triton.unified_attention"].unified_attention,
        paged_attention_decode=modules["aiter.ops.triton.pa_decode"].paged_attention_decode,
        flash_attn_varlen_func=modules["aiter.ops.triton.mha"].flash_attn_varlen_func,
    )


def triton_unavailable_reason(device: torch.device) -> str | None:
    """Why aiter's Triton kernels cannot run on `device` here, or None. Cheap (no import of the
    kernels: the planner calls it in the driver for every backend of a matrix). A package that is
    installed but does not load is not "unavailable": the cases error with the AiterLoadError, so
    a broken install turns the gate red instead of skipping silently."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "unavailable: needs a CUDA/ROCm GPU (Triton)"
    if aiter_package_dir() is None:
        return "unavailable: amd-aiter not installed (pip install amd-aiter)"
    if importlib.util.find_spec("triton") is None:
        return "unavailable: triton not installed"
    return None
