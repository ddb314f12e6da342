"""amd-aiter's installed source read without importing it (ast): where the package is, its
version, the signatures of the functions we call (source_signature) and what the `aiter` provider
relies on after `import aiter` (native_registration_problems). CPU tests and `orch doctor` check
the exact amd-aiter installed with it; aiter_loader.py imports the kernels and checks its patches
with it.
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
