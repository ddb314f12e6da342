"""Attention families from outside orch's tree, found without editing specs.py, registry.py or
capabilities.py. Torch-free, as specs.py.

Two routes to a family's FamilySpec (specs.py says what one declares; docs/BACKENDS.md "A family
of your own" walks through one):
- an import path, `package.module:ATTR`, where a matrix names the family (`attention:
  [mypkg.fam:SPEC]`); the family's name is then `SPEC.name` everywhere else (case ids, filters,
  `families:` keys), and ModelShape.family_source carries the path to the workers, which import
  it from the driver's working directory as they do plugin backends;
- an entry point in the group `orch.families` of an installed distribution, whose name is the
  family's (`attention: [mqa]`), found wherever that distribution is installed.
Its providers are plugin backends (`package.module:Class` with `family = SPEC.name`); a builtin
provider skips its cases with the reason, as for any family it does not implement.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from collections.abc import Collection

from backend.families.contract.spec import FamilySpec

ENTRY_POINT_GROUP = "orch.families"
# name -> (spec, its import path; "" for an entry point: found again by name anywhere)
_LOADED: dict[str, tuple[FamilySpec, str]] = {}


class PluginError(ValueError):
    """A family plugin that cannot be loaded (one line)."""


def _check(obj: object, where: str, reserved: Collection[str]) -> FamilySpec:
    if not isinstance(obj, FamilySpec):
        raise PluginError(f"{where} is not a FamilySpec (backend/families/contract/spec.py), got {type(obj).__name__}")
    if obj.name in reserved:
        raise PluginError(f"{where} names its family {obj.name!r}, a builtin family's name")
    if not obj.name.replace("_", "").isalnum():
        raise PluginError(f"{where}: family name {obj.name!r} must be letters, digits and _ (it leads case ids)")
    return obj


def load_path(path: str, reserved: Collection[str] = ()) -> FamilySpec:
    """The FamilySpec at "package.module:ATTR" (the working directory on sys.path, as for plugin
    backends), registered under its name; PluginError in one line."""
    for spec, source in _LOADED.values():
        if source == path:
            return spec
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise PluginError(f"{path!r} is not a family plugin path: expected 'package.module:ATTR'")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # ImportError, AttributeError, or anything the module raises
        text = str(exc).strip().splitlines()
        raise PluginError(
            f"cannot load family plugin {path!r}: {type(exc).__name__}: {text[0] if text else ''}"
        ) from exc
    spec = _check(obj, path, reserved)
    known = _LOADED.get(spec.name)
    if known is not None and known[0] is not spec:
        raise PluginError(f"{path} names its family {spec.name!r}, as {known[1] or 'an entry point'} does")
    _LOADED[spec.name] = (spec, path)
    return spec


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def find(name: str, reserved: Collection[str] = ()) -> FamilySpec | None:
    """A plugin family by name: loaded already (either route), or an `orch.families` entry point;
    by import path when `name` is one. None when there is none of that name. A plugin may not
    take a `reserved` name (the builtins')."""
    if name in _LOADED:
        return _LOADED[name][0]
    if ":" in name:
        return load_path(name, reserved)
    ep = _entry_points().get(name)
    if ep is None:
        return None
    where = f"entry point {ep.name} = {ep.value} ({ENTRY_POINT_GROUP})"
    try:
        obj = ep.load()
    except Exception as exc:
        raise PluginError(f"cannot load {where}: {type(exc).__name__}: {exc}") from exc
    spec = _check(obj, where, reserved)
    if spec.name != name:
        raise PluginError(f"{where} names its family {spec.name!r}: the entry point's name must be the family's")
    _LOADED[name] = (spec, "")
    return spec


def source(name: str) -> str:
    """The import path a plugin family was loaded from ("" for builtins and entry points)."""
    return _LOADED.get(name, (None, ""))[1]


def names() -> tuple[str, ...]:
    """Plugin families known here: loaded ones and every `orch.families` entry point."""
    return tuple(dict.fromkeys([*_LOADED, *_entry_points()]))
