"""The torch-free capability declarations the planner uses (backend/attention/capabilities.py) say
what the builtin classes say; a declaration that drifts from its class is caught here."""

from __future__ import annotations

import dataclasses

import pytest

from backend.attention.capabilities import ASK_CLASS, BUILTIN_CAPABILITIES, builtin_families, mismatches, of_class
from backend.attention.registry import BUILTIN_BACKENDS, family_reason, get_backend, get_capabilities
from backend.attention.support import AttentionCGSupport


def test_every_builtin_is_declared():
    assert tuple(dict.fromkeys(name for name, _ in BUILTIN_CAPABILITIES)) == BUILTIN_BACKENDS


@pytest.mark.parametrize("name, family", sorted(BUILTIN_CAPABILITIES))
def test_declaration_agrees_with_its_class(name, family):
    declared = BUILTIN_CAPABILITIES[(name, family)]
    assert declared.name == name and declared.family == family and get_capabilities(name, family) is declared
    cls = get_backend(name, family)
    assert cls.family == family
    assert mismatches(declared, of_class(cls, name)) == []


# (provider, family, implemented?): a provider names its kernels; it implements a family only
# where it has a class for it, and says so before anything is imported.
FAMILY_SUPPORT = [
    ("torch", "gqa", True),
    ("torch", "mla", True),
    ("aiter-emulated", "mla", True),
    ("aiter-triton", "mla", True),
    ("aiter", "mla", True),
    ("aiter-triton-pa", "mla", False),
]


@pytest.mark.parametrize("name, family, implemented", FAMILY_SUPPORT)
def test_a_provider_declares_the_families_it_implements(name, family, implemented):
    assert (family in builtin_families(name)) == implemented
    why = family_reason(name, family)
    assert (why is None) == implemented
    if not implemented:
        assert family in why and "gqa" in why  # names what it lacks and what it has


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("cudagraph_support", AttentionCGSupport.NEVER, "cudagraph_support declared"),
        ("kv_cache_dtypes", ("auto",), "kv_cache_dtypes declared"),
        ("dtypes", ("float32",), "dtypes declared"),
        ("jit_kernels", True, "jit_kernels declared True"),
        ("unavailable", lambda dc: "unavailable: nope", "on cpu declared 'unavailable: nope'"),
    ],
)
def test_a_drifted_declaration_is_reported(field, value, needle):
    declared = dataclasses.replace(BUILTIN_CAPABILITIES[("torch", "gqa")], **{field: value})
    found = mismatches(declared, of_class(get_backend("torch"), "torch"))
    assert any(needle in m for m in found), found


def test_a_class_changed_under_its_declaration_is_reported(monkeypatch):
    cls = get_backend("aiter-triton-pa")
    monkeypatch.setattr(cls, "cudagraph_support", AttentionCGSupport.ALWAYS)
    found = mismatches(BUILTIN_CAPABILITIES[("aiter-triton-pa", "gqa")], of_class(cls, "aiter-triton-pa"))
    assert found and "UNIFORM_SINGLE_TOKEN_DECODE" in found[0]


def test_native_aiter_on_a_gpu_is_left_to_its_class():
    for family in ("gqa", "mla"):
        assert BUILTIN_CAPABILITIES[("aiter", family)].unavailable_reason("gpu") == ASK_CLASS
        assert BUILTIN_CAPABILITIES[("aiter", family)].unavailable_reason("cpu") == "unavailable: needs a ROCm GPU"


def test_plugins_are_read_from_their_class():
    caps = get_capabilities("tests.matrix.plugins:CrashingCheckBackend")
    assert caps.unavailable_reason("cpu").startswith("CrashingCheckBackend.unavailable_reason raised RuntimeError")


@pytest.mark.parametrize(
    "nodes, expected",
    [
        ({"0": "cpu_cores_count 16\ngfx_target_version 0\n"}, 0),  # a CPU node only
        (
            {
                "0": "gfx_target_version 0\n",
                "1": "simd_count 304\ngfx_target_version 90402\n",
                "2": "gfx_target_version 90402\n",
            },
            2,
        ),  # MI300X-style: 2 GPUs
        ({"0": "gfx_target_version 0\n", "1": "no version line\n"}, 0),  # nothing claims a GPU
        (None, None),  # no topology: cannot tell
    ],
)
def test_kfd_topology_counts_gpu_nodes(tmp_path, nodes, expected):
    # The driver of orch run asks ROCm's sysfs instead of importing torch.
    from backend.attention.capabilities import kfd_gpu_count

    root = tmp_path / "nodes"
    if nodes is not None:
        for name, text in nodes.items():
            (root / name).mkdir(parents=True)
            (root / name / "properties").write_text(text)
    assert kfd_gpu_count(str(root)) == expected


@pytest.mark.parametrize(
    "text, want",
    [
        ("__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n", None),  # CUDA build
        ("__version__ = '2.9.0+rocm6.4'\nhip: Optional[str] = '6.4.43482-0f2d60242'\n", "6.4.43482-0f2d60242"),
        ("hip = None\n", None),
        ("__version__ = '2.4.0'\n", "?"),  # no hip line: ask the class
    ],
)
def test_torch_hip_read_without_importing_torch(text, want):
    # The planner on a CUDA machine answers "needs ROCm" for native aiter from torch/version.py.
    from backend.attention.capabilities import hip_of_version_py

    assert hip_of_version_py(text) == want
