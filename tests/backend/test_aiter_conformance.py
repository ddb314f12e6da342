"""AITER API conformance: every call our providers make, bound against the signatures of the
installed amd-aiter (read from its source with ast: `import aiter` fails off ROCm), so a renamed
keyword, a shifted positional argument or a missing registration fails here, not on a cluster.

The calls are recorded by running the real wrappers (aiter's through the emulated ops, aiter-triton's
with recording stand-ins for the kernels, which cannot run on CPU) over mixed and fp8 batches.
Re-run against another aiter: docs/PROVIDERS.md ("AITER conformance").
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import types
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from backend.attention.registry import get_backend
from backend.providers import aiter_loader as L
from backend.providers import aiter_ops_emulated
from tests.backend.attn_batches import make_config, make_step, run_backend

# The amd-aiter versions this file has been run against (pyproject.toml's `test` extra pins them).
CHECKED_VERSIONS = ("0.1.7.post2.dev18",)

pytestmark = pytest.mark.skipif(
    L.aiter_package_dir() is None, reason="amd-aiter not installed (pip install -e '.[test]')"
)


@dataclass(frozen=True)
class Call:
    api: str  # "native" | "triton"
    name: str
    args: tuple
    kwargs: dict


def real_signature(api: str, name: str) -> inspect.Signature:
    rel, fn = (L.NATIVE_FUNCTIONS if api == "native" else L.TRITON_FUNCTIONS)[name]
    return L.source_signature(rel, fn)


def _type_ok(value, annotation: str) -> bool:
    # The annotations aiter uses on the functions we call; torch's schema inference reads them too.
    optional = annotation.startswith("Optional[")
    inner = annotation[len("Optional[") : -1] if optional else annotation
    if value is None:
        return optional
    checks = {
        "torch.Tensor": lambda x: isinstance(x, torch.Tensor),
        "float": lambda x: isinstance(x, (float, int)) and not isinstance(x, bool),
        "int": lambda x: isinstance(x, int) and not isinstance(x, bool),
        "str": lambda x: isinstance(x, str),
        "bool": lambda x: isinstance(x, bool),
    }
    return checks[inner](value) if inner in checks else True


def conformance_errors(call: Call) -> list[str]:
    """Why `call` would fail against the installed aiter: TypeError from binding (unknown or
    missing names, too many positionals), or a value whose type contradicts the annotation (what
    an argument in the wrong position usually produces)."""
    sig = real_signature(call.api, call.name)
    try:
        bound = sig.bind(*call.args, **call.kwargs)
    except TypeError as exc:
        return [f"{call.name}: {exc}"]
    errors = []
    for pname, value in bound.arguments.items():
        ann = sig.parameters[pname].annotation
        if isinstance(ann, str) and not _type_ok(value, ann):
            errors.append(f"{call.name}: {pname}: {type(value).__name__} where the signature says {ann}")
    return errors


class Recorder:
    """Stands in for an ops namespace: records each call, then runs `impls[name]` on it."""

    def __init__(self, api: str, impls: dict):
        self.api, self.impls, self.calls = api, impls, []

    def __getattr__(self, name):
        if name not in self.impls:
            raise AttributeError(name)

        def call(*args, **kwargs):
            self.calls.append(Call(self.api, name, args, dict(kwargs)))
            return self.impls[name](*args, **kwargs)

        return call


# name -> (query_lens, seq_lens, config overrides, k_scale, v_scale): every branch of the wrappers
SCENARIOS = {
    "mixed-bf16": ([1, 6, 1, 12], [33, 6, 2, 25], {}, 1.0, 1.0),
    "decode-only": ([1, 1, 1], [50, 3, 64], {}, 1.0, 1.0),
    "mixed-fp8": ([1, 6, 1, 12], [33, 6, 2, 25], {"kv_cache_dtype": "fp8"}, 0.5, 2.0),
    "decode-fp16": ([1, 1], [20, 9], {"dtype": torch.float16}, 1.0, 1.0),
}


def record_native(scenario: str) -> list[Call]:
    qlens, slens, overrides, ks, vs = SCENARIOS[scenario]
    config = make_config(**overrides)
    backend = get_backend("aiter-emulated")
    recorder = Recorder(
        "native",
        {
            "flash_attn_varlen_func": aiter_ops_emulated.flash_attn_varlen_func,
            "paged_attention_v1": aiter_ops_emulated.paged_attention_v1,
        },
    )
    impl_cls = type("RecordingImpl", (backend.impl_cls,), {"ops": recorder})
    step = make_step(config, qlens, slens, k_scale=ks, v_scale=vs)
    run_backend(
        type("RecordingBackend", (backend,), {"impl_cls": impl_cls}),
        config,
        step,
        num_padded_tokens=sum(qlens) + 2,
        num_padded_reqs=len(qlens) + 1,
    )
    return recorder.calls


def record_triton(scenario: str, provider: str, monkeypatch) -> list[Call]:
    from backend.providers import aiter_triton_backend

    if importlib.util.find_spec("triton") is None:
        # Fake, labelled: only the dtype names AiterTritonPAImpl reads from triton.language.
        tl = types.SimpleNamespace(bfloat16="bfloat16", float16="float16", float32="float32")
        monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(language=tl))
        monkeypatch.setitem(sys.modules, "triton.language", tl)
    recorder = Recorder(
        "triton",
        {
            "unified_attention": lambda *a, **k: None,
            "paged_attention_decode": lambda *a, **k: None,
            "flash_attn_varlen_func": lambda q, *a, **k: torch.zeros_like(q),
        },
    )
    monkeypatch.setattr(aiter_triton_backend, "load_aiter_triton", lambda: recorder)
    qlens, slens, overrides, ks, vs = SCENARIOS[scenario]
    config = make_config(**overrides)
    step = make_step(config, qlens, slens, k_scale=ks, v_scale=vs)
    run_backend(get_backend(provider), config, step, num_padded_tokens=sum(qlens) + 2, num_padded_reqs=len(qlens) + 1)
    return recorder.calls


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_native_calls_bind_to_installed_aiter(scenario):
    calls = record_native(scenario)
    names = {c.name for c in calls}
    assert "paged_attention_v1" in names
    assert ("flash_attn_varlen_func" in names) == any(q > 1 for q in SCENARIOS[scenario][0])
    assert [e for c in calls for e in conformance_errors(c)] == []


@pytest.mark.parametrize(
    "provider,expected",
    [
        ("aiter-triton", {"unified_attention"}),
        ("aiter-triton-pa", {"paged_attention_decode", "flash_attn_varlen_func"}),
    ],
)
@pytest.mark.parametrize("scenario", ["mixed-bf16", "mixed-fp8"])
def test_triton_calls_bind_to_installed_aiter(provider, expected, scenario, monkeypatch):
    calls = record_triton(scenario, provider, monkeypatch)
    assert {c.name for c in calls} == expected
    assert [e for c in calls for e in conformance_errors(c)] == []


def _mutated(call: Call, how: str) -> Call:
    args, kwargs = list(call.args), dict(call.kwargs)
    if how == "renamed-keyword":
        kwargs["scale"] = kwargs.pop("softmax_scale")
    elif how == "unknown-keyword":
        kwargs["min_seqlen_k"] = 1
    elif how == "missing-required":
        del kwargs["cu_seqlens_k"]
    elif how == "swapped-positionals":  # scale (float) and block_tables (Tensor) trade places
        args[5], args[6] = args[6], args[5]
    elif how == "dropped-positional":  # everything after cu_query_lens shifts left by one
        del args[7]
    elif how == "too-many-positionals":
        args += [0] * (len(real_signature(call.api, call.name).parameters) - len(args) + 1)
    elif how == "host-int-as-tensor":  # max_context_len given as a device tensor
        args[9] = torch.tensor(args[9])
    return Call(call.api, call.name, tuple(args), kwargs)


@pytest.mark.parametrize(
    "name,how",
    [
        ("flash_attn_varlen_func", "renamed-keyword"),
        ("flash_attn_varlen_func", "unknown-keyword"),
        ("flash_attn_varlen_func", "missing-required"),
        ("paged_attention_v1", "swapped-positionals"),
        ("paged_attention_v1", "dropped-positional"),
        ("paged_attention_v1", "too-many-positionals"),
        ("paged_attention_v1", "host-int-as-tensor"),
    ],
)
def test_a_deliberately_wrong_call_is_caught(name, how):
    call = next(c for c in record_native("mixed-bf16") if c.name == name)
    assert conformance_errors(call) == []
    assert conformance_errors(_mutated(call, how)), f"{how} call to {name} was not caught"


@pytest.mark.parametrize("name", sorted(L.NATIVE_FUNCTIONS))
def test_emulated_ops_take_the_real_signatures(name):
    real = real_signature("native", name)
    ours = inspect.signature(getattr(aiter_ops_emulated, name))

    def shape(sig):  # names, kinds, order and defaults; annotations are documentation here
        return [(p.name, p.kind, p.default) for p in sig.parameters.values()]

    assert shape(ours) == shape(real), f"aiter_ops_emulated.{name}{ours} != aiter {name}{real}"


def _schema_prototype(sig: inspect.Signature):
    ns = {"torch": torch, "Optional": Optional}
    params = [p.replace(annotation=eval(p.annotation, ns)) for p in sig.parameters.values()]

    def prototype(*args, **kwargs):
        raise AssertionError("never called")

    prototype.__signature__ = sig.replace(parameters=params, return_annotation=torch.Tensor)
    return prototype


@pytest.fixture(scope="module")
def pa_op():
    """torch.ops.<test lib>.paged_attention_v1 registered as aiter registers it (the schema
    inferred from the real signature, mutating out and workspace_buffer), its CPU kernel the
    emulated op: calling it checks our arguments against the op schema the way
    torch.ops.aiter.paged_attention_v1 will on ROCm (types, positions, host ints)."""
    sig = real_signature("native", "paged_attention_v1")
    schema = torch.library.infer_schema(_schema_prototype(sig), mutates_args=["out", "workspace_buffer"])
    lib = torch.library.Library("orch_aiter_conformance", "FRAGMENT")
    lib.define("paged_attention_v1" + schema)
    lib.impl("paged_attention_v1", aiter_ops_emulated.paged_attention_v1, "CPU")
    yield torch.ops.orch_aiter_conformance.paged_attention_v1
    lib._destroy()


def test_paged_attention_v1_is_registered_as_torch_ops_aiter():
    assert L.native_registration_problems() == ()
    assert L.native_binding("flash_attn_varlen_func") == "ops/mha.py"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_paged_attention_v1_calls_pass_the_op_schema(scenario, pa_op):
    for call in (c for c in record_native(scenario) if c.name == "paged_attention_v1"):
        pa_op(*call.args, **call.kwargs)


def test_op_schema_rejects_a_shifted_argument(pa_op):
    call = next(c for c in record_native("decode-only") if c.name == "paged_attention_v1")
    with pytest.raises((RuntimeError, TypeError)):
        pa_op(*_mutated(call, "swapped-positionals").args)


def test_installed_aiter_is_a_checked_version():
    version = L.installed_aiter_version()
    if os.environ.get("ORCH_AITER_ANY_VERSION") == "1":
        pytest.skip(f"checking amd-aiter {version} (ORCH_AITER_ANY_VERSION=1)")
    assert version in CHECKED_VERSIONS, (
        f"amd-aiter {version} installed, conformance checked against {CHECKED_VERSIONS}: run this file "
        "with ORCH_AITER_ANY_VERSION=1 and add the version once it passes (docs/PROVIDERS.md)"
    )


@pytest.mark.parametrize("patch", ["namespace-stubs", "arch-gfx950", "launch-options"])
def test_loader_patch_is_still_needed_and_valid(patch):
    check = {c.patch: c for c in L.patch_checks()}[patch]
    assert check.valid and check.needed, check.detail
    assert L.installed_aiter_version() in check.detail


def _edited_copy(tmp_path, rel: str, old: str, new: str) -> str:
    """A copy of the parts of the installed package the checks read, with one edit in `rel`."""
    import shutil

    src = L.aiter_package_dir()
    dst = tmp_path / "aiter"
    shutil.copytree(
        os.path.join(src, "ops", "triton"),
        dst / "ops" / "triton",
        ignore=shutil.ignore_patterns("__pycache__", "gemm", "moe", "hstu_attn", "gluon"),
    )
    for name in ("__init__.py", "_version.py"):
        shutil.copy(os.path.join(src, name), dst / name)
    path = dst / rel
    text = path.read_text()
    assert old in text, f"{old!r} not in aiter/{rel}: the scenario needs updating"
    path.write_text(text.replace(old, new))
    return str(dst)


# scenario -> (file, old text, new text, patch, expected (needed, valid))
PATCH_SCENARIOS = {
    "get_arch-renamed": (L._ARCH_INFO, "def get_arch(", "def get_target_arch(", "arch-gfx950", (True, False)),
    "fp8-no-longer-by-arch": (
        L._TYPES,
        "e5m2_dtype, e4m3_dtype = get_fp8_dtypes()",
        "e5m2_dtype, e4m3_dtype = None, None",
        "arch-gfx950",
        (False, True),
    ),
    "launch-through-attribute": (
        "ops/triton/unified_attention.py",
        "reduce_segments[(",
        "kernels.reduce_segments[(",
        "launch-options",
        (True, False),
    ),
    "init-without-jit": (
        "__init__.py",
        "from .jit import core as core",
        "core = None",
        "namespace-stubs",
        (False, True),
    ),
}


@pytest.mark.parametrize("scenario", sorted(PATCH_SCENARIOS))
def test_patch_checks_see_an_edited_aiter(scenario, tmp_path):
    rel, old, new, patch, expected = PATCH_SCENARIOS[scenario]
    pkg = _edited_copy(tmp_path, rel, old, new)
    check = {c.patch: c for c in L.patch_checks(pkg)}[patch]
    assert (check.needed, check.valid) == expected, check.detail
    assert L.installed_aiter_version() in check.detail and "\n" not in check.detail


def test_an_invalid_patch_fails_the_nvidia_load_with_one_line(tmp_path, monkeypatch):
    pkg = _edited_copy(tmp_path, L._ARCH_INFO, "def get_arch(", "def get_target_arch(")
    monkeypatch.setattr(L, "aiter_package_dir", lambda: pkg)
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(L.AiterLoadError) as info:
        L.load_aiter_triton.__wrapped__()
    message = str(info.value)
    assert message.startswith(f"amd-aiter {L.installed_aiter_version()}: arch reported as gfx950")
    assert "get_arch" in message and "\n" not in message
    assert "aiter" not in sys.modules or getattr(sys.modules["aiter"], "__file__", 0) is not None


def _accepted_strings(path: str, arg: str) -> set[str]:
    """The string literals `path` compares `arg` with (`arg == "auto"`, `arg in ("fp8", ...)`)."""
    import ast

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == arg:
            for comp in node.comparators:
                out.update(n.value for n in ast.walk(comp) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return out


def test_paged_attention_v1_string_arguments_are_values_it_accepts():
    """Beyond the signature: the kernel launcher (csrc/cpp_itfs/pa/pa_v1.py, which
    ops/attention.py's paged_attention_v1 calls) raises ValueError on a kv_cache_dtype it does not
    know and picks strides by kv_cache_layout; every value we pass must be one it tests for."""
    utils = L._torch_utils(L.aiter_package_dir())
    assert utils is not None, "csrc/cpp_itfs/torch_utils.py not found next to the aiter package"
    launcher = os.path.join(os.path.dirname(utils), "pa", "pa_v1.py")
    dtypes, layouts = _accepted_strings(launcher, "kv_cache_dtype"), _accepted_strings(launcher, "kv_cache_layout")
    assert {"auto", "fp8"} <= dtypes, dtypes
    sig = real_signature("native", "paged_attention_v1")
    for scenario in SCENARIOS:
        for call in (c for c in record_native(scenario) if c.name == "paged_attention_v1"):
            bound = sig.bind(*call.args, **call.kwargs).arguments
            assert bound["kv_cache_dtype"] in dtypes, scenario
            # the launcher tests for "HND" and takes NHD strides otherwise
            assert bound["kv_cache_layout"] == "NHD" and (layouts == {"HND"} or "NHD" in layouts), layouts
            # num_seqs is block_tables.size(0) in the launcher: one row per context length
            assert bound["block_tables"].shape[0] == bound["context_lens"].shape[0]
            assert (
                bound["query"].dtype in (torch.bfloat16, torch.float16) and bound["out"].dtype == bound["query"].dtype
            )
