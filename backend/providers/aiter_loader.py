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

The installed source is also read without importing it (ast, aiter_source.py), so CPU tests and `orch doctor` can
check what we rely on against the exact amd-aiter installed: the signatures of every function we
call (source_signature) and that each of the three patches is still needed and still valid
(patch_findings). A patch that no longer applies makes load_aiter_triton fail with one line naming
the aiter version instead of an obscure error in a kernel launch.
"""

from __future__ import annotations

import ast
import functools
import importlib
import os
import sys
import types
from dataclasses import dataclass

import torch

# The source reading lives in aiter_source.py; its public names are re-exported here, where
# doctor and the conformance tests have always found them.
from backend.providers.aiter_source import (
    NATIVE_FUNCTIONS,
    TRITON_FUNCTIONS,
    AiterLoadError,
    _parse,
    _top_level_names,
    _torch_utils,
    aiter_package_dir,
    installed_aiter_version,
    native_binding,
    native_registration_problems,
    source_signature,
)

__all__ = [
    "AMD_ONLY_LAUNCH_OPTIONS",
    "NATIVE_FUNCTIONS",
    "TRITON_FUNCTIONS",
    "AiterLoadError",
    "PatchCheck",
    "_torch_utils",
    "aiter_package_dir",
    "installed_aiter_version",
    "load_aiter_triton",
    "native_binding",
    "native_registration_problems",
    "patch_checks",
    "source_signature",
    "triton_unavailable_reason",
]

AMD_ONLY_LAUNCH_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
# Modules whose kernel launches we use; their module-level kernel references get wrapped on NVIDIA.
_LAUNCHER_MODULES = (
    "aiter.ops.triton.unified_attention",
    "aiter.ops.triton.pa_decode",
    "aiter.ops.triton.mha",
    "aiter.ops.triton.mla_decode_rope",
)


_ARCH_INFO = "ops/triton/utils/_triton/arch_info.py"
_TYPES = "ops/triton/utils/types.py"
_MHA_CONFIG = "ops/triton/configs/MI350X-MHA-DEFAULT.json"  # what get_device() picks for gfx950


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
    arch_info.get_arch = lambda: "gfx950"  # a module global: get_device() etc. see it too


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


@dataclass(frozen=True)
class PatchCheck:
    """One loader patch against the installed source: still needed (else it can go) and still
    valid (else it silently does nothing and the kernels fail later, obscurely)."""

    patch: str
    needed: bool
    valid: bool
    detail: str  # one line, naming the aiter version


def _imports_jit(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "jit" and node.level == 1:
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiter.jit"):
            return True
    return False


def _calls(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            out.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return out


def _check_stubs(pkg: str, v: str) -> PatchCheck:
    needed = _imports_jit(_parse(pkg, "__init__.py"))
    missing = [
        m
        for m in (
            "ops/triton/__init__.py",
            *(m.replace("aiter.", "").replace(".", "/") + ".py" for m in _LAUNCHER_MODULES),
        )
        if not os.path.isfile(os.path.join(pkg, m))
    ]
    detail = (
        f"amd-aiter {v}: namespace stubs: aiter/__init__.py "
        f"{'imports the ROCm JIT (aiter.jit), bypassed' if needed else 'no longer imports the ROCm JIT: the stubs may be dropped'}"
        + (f"; missing {', '.join(missing)}" if missing else "")
    )
    return PatchCheck("namespace-stubs", needed, not missing, detail)


def _check_arch(pkg: str, v: str) -> PatchCheck:
    arch = _parse(pkg, _ARCH_INFO)
    arch_names = _top_level_names(arch)
    types_tree = _parse(pkg, _TYPES)
    # needed: types.py calls get_arch() while importing (directly or through its own functions)
    via = {n.name for n in types_tree.body if isinstance(n, ast.FunctionDef) and "get_arch" in _calls(n)}
    at_import = set().union(*(_calls(n) for n in types_tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))))
    needed = "get_arch" in at_import or bool(via & at_import)
    gfx950_fn = any(isinstance(n, ast.Constant) and n.value == "gfx950" for n in ast.walk(types_tree))
    device_map = any(isinstance(n, ast.Constant) and n.value == "gfx950" for n in ast.walk(arch))
    problems = [
        why
        for ok, why in (
            ("get_arch" in arch_names, f"aiter/{_ARCH_INFO} defines no get_arch()"),
            (gfx950_fn, f"aiter/{_TYPES} no longer selects fp8 by 'gfx950'"),
            (device_map, f"aiter/{_ARCH_INFO} maps no 'gfx950' device"),
            (os.path.isfile(os.path.join(pkg, _MHA_CONFIG)), f"aiter/{_MHA_CONFIG} missing"),
        )
        if not ok
    ]
    detail = f"amd-aiter {v}: arch reported as gfx950: " + (
        "; ".join(problems)
        if problems
        else "types.py calls get_arch() at import"
        if needed
        else "types.py no longer calls get_arch() at import: the patch may be dropped"
    )
    return PatchCheck("arch-gfx950", needed, not problems, detail)


def _check_launch_options(pkg: str, v: str) -> PatchCheck:
    sources = [m.replace("aiter.", "").replace(".", "/") + ".py" for m in _LAUNCHER_MODULES]
    kernels = [s.replace("ops/triton/", "ops/triton/_triton_kernels/") for s in sources]
    text = ""
    for rel in [*sources, *kernels, _MHA_CONFIG]:
        path = os.path.join(pkg, rel)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                text += f.read()
    found = [o for o in AMD_ONLY_LAUNCH_OPTIONS if o in text]
    # valid: every `kernel[grid](...)` in the launcher modules names a module global (what
    # _strip_amd_launch_options replaces) or a local; `mod.kernel[grid]` would bypass the wrapper.
    unreachable = []
    for rel in sources:
        tree = _parse(pkg, rel)
        top = _top_level_names(tree)
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            local = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)):
                target = call.func.value
                if isinstance(target, ast.Name) and (target.id in top or target.id in local):
                    continue
                unreachable.append(f"{rel}:{call.lineno} {ast.unparse(target)}[...]")
    detail = f"amd-aiter {v}: AMD-only launch options: " + (
        f"launches the wrapper cannot reach: {', '.join(unreachable)}"
        if unreachable
        else f"still passed: {', '.join(found)}"
        if found
        else "none passed any more: the patch may be dropped"
    )
    return PatchCheck("launch-options", bool(found), not unreachable, detail)


def patch_checks(package_dir: str | None = None) -> tuple[PatchCheck, ...]:
    """The three NVIDIA loader patches checked against the installed source (nothing imported)."""
    package_dir = package_dir or aiter_package_dir()
    if package_dir is None:
        raise AiterLoadError("amd-aiter not installed (pip install amd-aiter)")
    version = installed_aiter_version(package_dir)
    checks = []
    for check in (_check_stubs, _check_arch, _check_launch_options):
        try:
            checks.append(check(package_dir, version))
        except (OSError, SyntaxError) as exc:
            name = check.__name__.removeprefix("_check_")
            checks.append(PatchCheck(name, True, False, f"amd-aiter {version}: {name}: cannot read the source: {exc}"))
    return tuple(checks)


@functools.lru_cache(maxsize=1)
def load_aiter_triton() -> types.SimpleNamespace:
    """unified_attention, paged_attention_decode (pa_decode), the Triton MHA
    flash_attn_varlen_func and the MLA decode decode_attention_fwd_grouped_rope from the installed
    amd-aiter. Raises AiterLoadError."""
    package_dir = aiter_package_dir()
    if package_dir is None:
        raise AiterLoadError("amd-aiter not installed (pip install amd-aiter)")
    try:
        if torch.version.hip is None:
            broken = [c for c in patch_checks(package_dir) if not c.valid]
            if broken:
                raise AiterLoadError(broken[0].detail)
            _register_namespace_stubs(package_dir)
            _report_gfx950()
        modules = {name: importlib.import_module(name) for name in _LAUNCHER_MODULES}
        if torch.version.hip is None:
            for module in modules.values():
                _strip_amd_launch_options(module)
    except AiterLoadError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise AiterLoadError(f"loading aiter's Triton kernels failed: {type(exc).__name__}: {first}") from exc
    mha = modules["aiter.ops.triton.mha"]
    return types.SimpleNamespace(
        unified_attention=modules["aiter.ops.triton.unified_attention"].unified_attention,
        paged_attention_decode=modules["aiter.ops.triton.pa_decode"].paged_attention_decode,
        flash_attn_varlen_func=(
            mha.flash_attn_varlen_func
            if torch.version.hip is not None
            else _mha_within_cuda_smem(mha.flash_attn_varlen_func, mha._get_config)
        ),
        decode_attention_fwd_grouped_rope=modules["aiter.ops.triton.mla_decode_rope"].decode_attention_fwd_grouped_rope,
    )


def _mha_within_cuda_smem(varlen, get_config):
    """The Triton MHA with q wider than v (MLA's prefill: nope + rope against v) picks the json's
    "pe" tiles, tuned for gfx950's LDS: 256 query rows and 5 stages, 296 KiB of shared memory where
    an H100 has 227 KiB (OutOfResources, seen on an H100). On NVIDIA such calls get the json's own
    non-pe tiles instead (128 x 64, one stage); a caller's explicit config= is left alone."""

    @functools.wraps(varlen)
    def launch(q, k, v, *args, **kwargs):
        if kwargs.get("config") is None and q.shape[-1] != v.shape[-1]:
            kwargs["config"] = get_config(kwargs.get("dropout_p", 0.0) > 0.0, q.dtype, has_pe=False)
        return varlen(q, k, v, *args, **kwargs)

    return launch


def triton_unavailable_reason(device: torch.device) -> str | None:
    """Why aiter's Triton kernels cannot run on `device` here, or None. Cheap (no import of the
    kernels: the planner calls it in the driver for every backend of a matrix). A package that is
    installed but does not load is not "unavailable": the cases error with the AiterLoadError, so
    a broken install turns the gate red instead of skipping silently. The answer is the torch-free
    declaration the planner reads (capabilities.py), so the two cannot drift."""
    from backend.attention.capabilities import aiter_triton_unavailable, device_class

    return aiter_triton_unavailable(device_class(device))
