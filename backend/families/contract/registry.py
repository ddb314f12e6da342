"""Where the harness, the planner and the driver find a family: by name, its FamilySpec (torch-free)
and its AttentionFamily (imports torch). Every family is reached through an import path, never a
static import: the builtins through BUILTIN below (their declarations are
backend/families/specs.py), a plugin through its own path or entry point (plugins.py). So the
contract imports no family, and the harness, importing only the contract, none either.

    spec("mla") -> its FamilySpec
    family("mla") -> the AttentionFamily (one instance per process; they hold no state)
"""

from __future__ import annotations

import difflib
import functools
import importlib
from typing import TYPE_CHECKING

import backend.families.contract.plugins as plugins

if TYPE_CHECKING:
    from backend.families.contract.family import AttentionFamily
    from backend.families.contract.spec import FamilySpec

DEFAULT_FAMILY = "gqa"
# name -> "module:ATTR" of its FamilySpec; a new builtin family is one line here.
BUILTIN: dict[str, str] = {
    "gqa": "backend.families.specs:GQA",
    "mla": "backend.families.specs:MLA",
    "swa_sinks": "backend.families.specs:SWA_SINKS",
    "hybrid_gdn": "backend.families.specs:HYBRID_GDN",
    "mla_sparse": "backend.families.specs:MLA_SPARSE",
}
FAMILY_NAMES: tuple[str, ...] = tuple(BUILTIN)


class UnknownFamily(ValueError):
    """A family name that is neither a builtin (FAMILY_NAMES) nor a plugin's (one line)."""


def _load(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


@functools.cache
def _builtin(name: str) -> FamilySpec:
    found = _load(BUILTIN[name])
    if found.name != name:  # a table entry pointing at another family's spec
        raise UnknownFamily(f"{BUILTIN[name]} declares family {found.name!r}, not {name!r}")
    return found


def spec(name: str) -> FamilySpec:
    """A builtin family's spec, or a plugin's (by import path "package.module:ATTR", or by the
    name of one loaded or of an `orch.families` entry point)."""
    if name in BUILTIN:
        return _builtin(name)
    try:
        found = plugins.find(name, reserved=FAMILY_NAMES)
    except plugins.PluginError as e:
        raise UnknownFamily(str(e)) from None
    if found is None:
        known = [*FAMILY_NAMES, *plugins.names()]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f": did you mean {close[0]!r}?" if close else ""
        raise UnknownFamily(
            f"unknown attention family {name!r}{hint} (families: {', '.join(known)}, or a plugin's "
            f"'package.module:SPEC')"
        )
    return found


def source(name: str) -> str:
    """Where a plugin family loaded by import path came from ("" otherwise): what a worker needs
    to find it again (ModelShape.family_source)."""
    return "" if name in BUILTIN else plugins.source(name)


@functools.cache
def family(name: str) -> AttentionFamily:
    """The family's implementation, by its spec's `impl` path."""
    return _load(spec(name).impl)()
