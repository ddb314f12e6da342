"""Backend lookup: a builtin provider name or an import path "package.module:Class".

Builtins are imported lazily, so naming `torch` never imports the AITER loaders. Every failure is a
BackendLoadError whose message is one line (it ends up in a CaseResult reason / a CLI error).
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backend.attention.capabilities import BUILTIN_CAPABILITIES, Capabilities, builtin_families, of_class

if TYPE_CHECKING:
    from backend.attention.interface import AttentionBackend


class BackendLoadError(Exception):
    """A backend name or import path that cannot be turned into a backend class (one-line message)."""


# (name, attention family) -> "module:Class"; imported only when asked for. A provider name is the
# same kernel source across families (AITER, plain torch), one class per family it implements.
_BUILTIN_PATHS: dict[tuple[str, str], str] = {
    ("torch", "gqa"): "backend.providers.torch_backend:TorchBackend",
    ("aiter", "gqa"): "backend.providers.aiter_backend:AiterBackend",
    ("aiter-emulated", "gqa"): "backend.providers.aiter_backend:AiterEmulatedBackend",
    ("aiter-triton", "gqa"): "backend.providers.aiter_triton_backend:AiterTritonBackend",
    ("aiter-triton-pa", "gqa"): "backend.providers.aiter_triton_backend:AiterTritonPABackend",
    ("torch", "mla"): "backend.providers.torch_mla:TorchMLABackend",
    ("aiter", "mla"): "backend.providers.aiter_mla:AiterMLABackend",
    ("aiter-emulated", "mla"): "backend.providers.aiter_mla:AiterEmulatedMLABackend",
    ("aiter-triton", "mla"): "backend.providers.aiter_triton_mla:AiterTritonMLABackend",
    ("torch", "swa_sinks"): "backend.providers.torch_swa:TorchSWABackend",
    ("aiter-triton", "swa_sinks"): "backend.providers.aiter_triton_swa:AiterTritonSWABackend",
    ("torch", "hybrid_gdn"): "backend.providers.torch_gdn:TorchHybridGDNBackend",
    ("torch", "mla_sparse"): "backend.providers.torch_mla_sparse:TorchSparseMLABackend",
}
BUILTIN_BACKENDS: tuple[str, ...] = tuple(dict.fromkeys(name for name, _ in _BUILTIN_PATHS))
# "vllm:NAME" is vLLM's own backend NAME run in place (backend/adapters/vllm/); reserved, so it
# is never read as the import path "module vllm, attribute NAME". Doctor lists these.
VLLM_PREFIX = "vllm:"
VLLM_BACKENDS: tuple[str, ...] = (
    "vllm:FLEX_ATTENTION",
    "vllm:TRITON_ATTN",
    "vllm:FLASH_ATTN",
    "vllm:ROCM_AITER_FA",
    "vllm:TRITON_MLA",
    "vllm:ROCM_AITER_UNIFIED_ATTN",
    "vllm:GDN_ATTN",
    "vllm:FLASHMLA_SPARSE",
    "vllm:ROCM_AITER_MLA_SPARSE",
)
# The family a vLLM backend of that list is bridged for, where it is not gqa (what doctor asks).
VLLM_FAMILIES: dict[str, str] = {
    "vllm:TRITON_MLA": "mla",
    "vllm:GDN_ATTN": "hybrid_gdn",
    "vllm:FLASHMLA_SPARSE": "mla_sparse",
    "vllm:ROCM_AITER_MLA_SPARSE": "mla_sparse",
}


def family_providers(family: str) -> tuple[str, ...]:
    """Every provider orch ships for attention `family`: its builtins (one class per family they
    implement), then the vLLM backends bridged for it (the unlisted ones are gqa's). What doctor
    lists per family; torch-free."""
    builtins = tuple(name for (name, fam) in _BUILTIN_PATHS if fam == family)
    return builtins + tuple(name for name in VLLM_BACKENDS if VLLM_FAMILIES.get(name, "gqa") == family)


# What a duck-typed plugin must provide (checked when it does not subclass AttentionBackend).
_REQUIRED_ATTRS = ("name", "cudagraph_support", "builder_cls", "impl_cls", "supported_kv_cache_dtypes")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _import_class(path: str) -> type:
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise BackendLoadError(
            f"unknown backend {path!r}: expected one of {', '.join(BUILTIN_BACKENDS)} or 'package.module:Class'"
        )
    # Like pytest/uvicorn: resolve import paths relative to the working directory, so that
    # `tests.mutants.x:Cls` works from the repo root without installing anything.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises while importing
        raise BackendLoadError(f"cannot import {module_name!r}: {_one_line(exc)}") from exc
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BackendLoadError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def validate_backend_class(obj: object, label: str) -> type[AttentionBackend]:
    """Return obj if it is a backend class (subclass, or duck-typed with the required attributes)."""
    if not isinstance(obj, type):
        raise BackendLoadError(f"{label!r} is not an AttentionBackend subclass: not a class")
    from backend.attention.interface import AttentionBackend

    if issubclass(obj, AttentionBackend):
        return obj
    missing = [a for a in _REQUIRED_ATTRS if not hasattr(obj, a)]
    if missing:
        raise BackendLoadError(f"{label!r} is not an AttentionBackend subclass: missing {', '.join(missing)}")
    return obj  # type: ignore[return-value]


def get_backend(name: str, family: str = "gqa") -> type[AttentionBackend]:
    """The backend class for a builtin provider name or an import path "package.module:Class",
    implementing attention `family` (a builtin: its class for that family, BackendLoadError when
    it has none; an import path names one class: see class_family_reason)."""
    if not isinstance(name, str) or not name.strip():
        raise BackendLoadError(f"empty backend name: expected one of {', '.join(BUILTIN_BACKENDS)}")
    name = name.strip()
    if name.startswith(VLLM_PREFIX):  # vLLM's own backend by its registry name
        vllm_name = name[len(VLLM_PREFIX) :].strip()
        if not vllm_name:
            raise BackendLoadError(f"empty vLLM backend name in {name!r}: expected e.g. vllm:FLEX_ATTENTION")
        from backend.adapters.vllm import make_backend  # imports vllm only when the class is used

        return make_backend(vllm_name, family)
    if name in BUILTIN_BACKENDS:
        path = _BUILTIN_PATHS.get((name, family))
        if path is None:
            raise BackendLoadError(family_reason(name, family) or f"{name} does not implement {family}")
        return validate_backend_class(_import_class(path), name)
    return validate_backend_class(_import_class(name), name)


def family_reason(name: str, family: str) -> str | None:
    """Why builtin provider `name` cannot run attention `family` (None when it can, or when `name`
    is not a builtin: a plugin class says its own family, class_family_reason)."""
    families = builtin_families(name.strip()) if isinstance(name, str) else ()
    if not families or family in families:
        return None
    return f"{name} does not implement the {family} attention family (it implements {', '.join(families)})"


def class_family_reason(cls: type, label: str, family: str) -> str | None:
    """Why a loaded class cannot run attention `family` (its `family` ClassVar, default gqa)."""
    own = getattr(cls, "family", "gqa")
    return None if own == family else f"{label} implements the {own} attention family, not {family}"


def get_capabilities(name: str, family: str = "gqa") -> Capabilities:
    """What the planner needs of a backend for one attention family: declared (torch-free) for a
    builtin name, else read from the class that `name` imports (BackendLoadError as get_backend;
    a builtin without the family raises it too: ask family_reason first)."""
    key = (name.strip(), family) if isinstance(name, str) else None
    if key in BUILTIN_CAPABILITIES:
        return BUILTIN_CAPABILITIES[key]
    return of_class(get_backend(name, family), name.strip() if isinstance(name, str) else name)


def check_name(name: str) -> None:
    """BackendLoadError for a `vllm:NAME` that names no backend of the vLLM here (or, without one,
    of the names orch knows), with the closest name (backend/adapters/vllm/names.py): a typo is bad
    input, in a matrix as on the command line, never a run of skips. Other names load later."""
    if isinstance(name, str) and name.strip().startswith(VLLM_PREFIX):
        vllm_name = name.strip()[len(VLLM_PREFIX) :].strip()
        if not vllm_name:
            raise BackendLoadError(f"empty vLLM backend name in {name!r}: expected e.g. vllm:FLEX_ATTENTION")
        from backend.adapters.vllm.names import name_error

        why = name_error(vllm_name)
        if why:
            raise BackendLoadError(why)


def check_explicit(name: str) -> None:
    """A backend named on the command line (`--backend`): BackendLoadError where naming it is bad
    input rather than a skip. For `vllm:NAME`, a vllm release outside every range the adapter
    bridges (or an ORCH_VLLM that cannot be applied): one line naming the release and the ranges;
    and a NAME that is no backend of it (check_name). No vllm at all stays a skip with the reason,
    as for a matrix that lists vllm: backends."""
    if isinstance(name, str) and name.strip().startswith(VLLM_PREFIX):
        from backend.adapters.vllm import release  # torch-free

        line = release.bad_input_line()
        if line:
            raise BackendLoadError(line)
        check_name(name)


@dataclass(frozen=True)
class Availability:
    """Whether a provider can run on a device here, and why not (one line; "" when it can)."""

    provider: str
    device: str
    available: bool
    reason: str


def availability(name: str, device, family: str = "gqa") -> Availability:
    """The provider's own unavailable_reason(device), as the planner asks it; a name that does not
    load or a check that raises is "unavailable" with the error, never an exception."""
    import torch

    device = torch.device(device)
    try:
        cls = get_backend(name, family)
    except BackendLoadError as exc:
        return Availability(name, str(device), False, f"unavailable: {exc}")
    try:
        why = cls.unavailable_reason(device)
    except Exception as exc:  # noqa: BLE001 - a plugin's check that crashes: cannot run here, said plainly
        why = f"{getattr(cls, '__name__', cls)}.unavailable_reason raised {type(exc).__name__}: {_one_line(exc)}"
    return Availability(name, str(device), why is None, why or "")
