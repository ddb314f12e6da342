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

The installed source is also read without importing it (ast), so CPU tests and `orch doctor` can
check what we rely on against the exact amd-aiter installed: the signatures of every function we
call (source_signature) and that each of the three patches is still needed and still valid
(patch_findings). A patch that no longer applies makes load_aiter_triton fail with one line naming
the aiter version instead of an obscure error in a kernel launch.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import types
from dataclasses import dataclass

import torch

AMD_ONLY_LAUNCH_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
# Modules whose kernel launches we use; their module-level kernel references get wrapped on NVIDIA.
_LAUNCHER_MODULES = (
    "aiter.ops.triton.unified_attention",
    "aiter.ops.triton.pa_decode",
    "aiter.ops.triton.mha",
    "aiter.ops.triton.mla_decode_rope",
)


# What we call: (file under the package dir, function name). The native pair is what `aiter` calls
# on ROCm; the Triton three are what aiter_loader returns.
NATIVE_FUNCTIONS = {
    "flash_attn_varlen_func": ("ops/mha.py", "flash_attn_varlen_func"),
    "paged_attention_v1": ("ops/attention.py", "paged_attention_v1"),
    "mla_decode_fwd": ("mla.py", "mla_decode_fwd"),  # the mla family's decode (aiter_mla.py)
}
TRITON_FUNCTIONS = {
    "unified_attention": ("ops/triton/unified_attention.py", "unified_attention"),
    "paged_attention_decode": ("ops/triton/pa_decode.py", "paged_attention_decode"),
    "flash_attn_varlen_func": ("ops/triton/mha.py", "flash_attn_varlen_func"),
    "decode_attention_fwd_grouped_rope": ("ops/triton/mla_decode_rope.py", "decode_attention_fwd_grouped_rope"),
}
_ARCH_INFO = "ops/triton/utils/_triton/arch_info.py"
_TYPES = "ops/triton/utils/types.py"
_MHA_CONFIG = "ops/triton/configs/MI350X-MHA-DEFAULT.json"  # what get_device() picks for gfx950


class AiterLoadError(RuntimeError):
    """amd-aiter's Triton kernels cannot be loaded here (one-line message)."""


def aiter_package_dir() -> str | None:
    """Directory of the installed `aiter` package, without importing it (None if not installed)."""
    if "aiter" in sys.modules and getattr(sys.modules["aiter"], "__path__", None):
        return next(iter(sys.modules["aiter"].__path__))
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def installed_aiter_version(package_dir: str | None = None) -> str | None:
    """amd-aiter's version from its _version.py (read, not imported), else the dist metadata."""
    package_dir = package_dir or aiter_package_dir()
    if package_dir is None:
        return None
    try:
        for node in _parse(package_dir, "_version.py").body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
                return str(ast.literal_eval(node.value))
    except (OSError, SyntaxError, ValueError):
        pass
    try:
        return importlib.metadata.version("amd-aiter")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=64)
def _parse_cached(path: str, mtime: float) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), filename=path)


def _parse(package_dir: str, relpath: str) -> ast.Module:
    path = os.path.join(package_dir, relpath)
    return _parse_cached(path, os.path.getmtime(path))


class _SourceDefault:
    """A default that is not a literal (e.g. a module constant): kept as its source text."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other) -> bool:
        return isinstance(other, _SourceDefault) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def _default(node: ast.expr):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _SourceDefault(ast.unparse(node))


def source_signature(relpath: str, name: str, package_dir: str | None = None) -> inspect.Signature:
    """inspect.Signature of the module-level function `name` in the installed package's `relpath`,
    built from its ast: names, kinds, positional order, literal defaults; annotations as source
    text ("torch.Tensor", "Optional[torch.Tensor]", "float"). Raises AiterLoadError (one line)."""
    package_dir = package_dir or aiter_package_dir()
    version = installed_aiter_version(package_dir)
    if package_dir is None:
        raise AiterLoadError("amd-aiter not installed (pip install amd-aiter)")
    try:
        tree = _parse(package_dir, relpath)
    except (OSError, SyntaxError) as exc:
        raise AiterLoadError(f"amd-aiter {version}: cannot read aiter/{relpath}: {type(exc).__name__}: {exc}") from exc
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    if not defs:
        raise AiterLoadError(f"amd-aiter {version}: aiter/{relpath} no longer defines {name}()")
    a = defs[-1].args  # the last definition is the one the module ends up binding
    P = inspect.Parameter

    def ann(node):
        return P.empty if node is None else ast.unparse(node)

    params: list[inspect.Parameter] = []
    positional = [(x, P.POSITIONAL_ONLY) for x in a.posonlyargs] + [(x, P.POSITIONAL_OR_KEYWORD) for x in a.args]
    pos_defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for (arg, kind), dflt in zip(positional, pos_defaults):
        params.append(
            P(arg.arg, kind, default=P.empty if dflt is None else _default(dflt), annotation=ann(arg.annotation))
        )
    if a.vararg:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL, annotation=ann(a.vararg.annotation)))
    for arg, dflt in zip(a.kwonlyargs, a.kw_defaults):
        params.append(
            P(
                arg.arg,
                P.KEYWORD_ONLY,
                default=P.empty if dflt is None else _default(dflt),
                annotation=ann(arg.annotation),
            )
        )
    if a.kwarg:
        params.append(P(a.kwarg.arg, P.VAR_KEYWORD, annotation=ann(a.kwarg.annotation)))
    return inspect.Signature(params)


def _module_file(package_dir: str, dotted: str) -> str | None:
    base = os.path.join(package_dir, *dotted.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return os.path.relpath(path, package_dir)
    return None


def _exports(tree: ast.Module, name: str) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            try:
                return name in ast.literal_eval(node.value)
            except ValueError:
                break
    return not name.startswith("_") and name in _top_level_names(tree)


def native_binding(name: str, package_dir: str | None = None) -> str | None:
    """The file under the package whose definition `aiter.<name>` ends up bound to after
    `import aiter`, following aiter/__init__.py's top-level `from .x import *` / `from .x import
    name` statements in order (the last one wins); None if it binds nothing of that name."""
    package_dir = package_dir or aiter_package_dir()
    bound = None
    for node in _parse(package_dir, "__init__.py").body:
        if not (isinstance(node, ast.ImportFrom) and node.level == 1 and node.module):
            continue
        rel = _module_file(package_dir, node.module)
        if rel is None:
            continue
        names = [a.asname or a.name for a in node.names]
        if (names == ["*"] and _exports(_parse(package_dir, rel), name)) or name in names:
            bound = rel.replace(os.sep, "/")
    return bound


def _torch_utils(package_dir: str) -> str | None:
    for base in (
        package_dir,
        os.path.join(os.path.dirname(package_dir), "aiter_meta"),
        os.path.join(package_dir, "aiter_meta"),
    ):
        path = os.path.join(base, "csrc", "cpp_itfs", "torch_utils.py")
        if os.path.isfile(path):
            return path
    return None


def native_registration_problems(package_dir: str | None = None) -> tuple[str, ...]:
    """What the `aiter` provider relies on after `import aiter`, checked in the source: the two
    functions bound where NATIVE_FUNCTIONS says, and paged_attention_v1 registered as
    torch.ops.aiter.paged_attention_v1 (direct_register_custom_op into the "aiter" Library, its
    schema inferred from the Python signature). One line per problem, naming the version."""
    package_dir = package_dir or aiter_package_dir()
    if package_dir is None:
        return ("amd-aiter not installed (pip install amd-aiter)",)
    v = installed_aiter_version(package_dir)
    problems = []
    for name in ("flash_attn_varlen_func",):
        where = native_binding(name, package_dir)
        if where != NATIVE_FUNCTIONS[name][0]:
            problems.append(f"amd-aiter {v}: aiter.{name} is bound from {where}, not {NATIVE_FUNCTIONS[name][0]}")
    rel, fn = NATIVE_FUNCTIONS["paged_attention_v1"]
    registered = False
    for node in _parse(package_dir, rel).body:
        call = node.value if isinstance(node, ast.Expr) else None
        if (
            isinstance(call, ast.Call)
            and getattr(call.func, "id", None) == "direct_register_custom_op"
            and call.args
            and isinstance(call.args[0], ast.Constant)
            and call.args[0].value == fn
        ):
            other_lib = any(k.arg == "target_lib" for k in call.keywords) or len(call.args) > 4
            registered = not other_lib and len(call.args) > 1 and getattr(call.args[1], "id", None) == fn
    if not registered:
        problems.append(
            f"amd-aiter {v}: aiter/{rel} no longer registers {fn} with "
            f"direct_register_custom_op into the default library: torch.ops.aiter.{fn} may not exist"
        )
    utils = _torch_utils(package_dir)
    lib_ok = False
    if utils is not None:
        with open(utils, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        lib_ok = any(
            isinstance(n, ast.Assign)
            and any(getattr(t, "id", None) == "aiter_lib" for t in n.targets)
            and isinstance(n.value, ast.Call)
            and n.value.args
            and isinstance(n.value.args[0], ast.Constant)
            and n.value.args[0].value == "aiter"
            for n in tree.body
        )
    if not lib_ok:
        problems.append(
            f'amd-aiter {v}: csrc/cpp_itfs/torch_utils.py does not define aiter_lib = Library("aiter", ...)'
        )
    return tuple(problems)


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


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


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
