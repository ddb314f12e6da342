"""Attention families: what a case's attention computes, apart from which provider computes it.

A family is one module (gqa.py, mla.py): its model dimensions and default shapes (declared
torch-free in specs.py, for the matrix and the planner), its KV-cache layout, its test-model
layer (projections around the attention op), its step plan (e.g. decodes first), its fp32
reference and its rules for graphs. The harness (backend/harness/) asks a family through
base.AttentionFamily and never names one, so adding a family is a module here, a spec in
specs.py, the providers that implement it (backend/providers/) and matrices.

    family("mla") -> the AttentionFamily (imports torch)
    specs.spec("mla") -> its FamilySpec (torch-free)
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

from backend.families.specs import DEFAULT_FAMILY, FAMILY_NAMES, UnknownFamily, spec

if TYPE_CHECKING:
    from backend.families.base import AttentionFamily

__all__ = ["DEFAULT_FAMILY", "FAMILY_NAMES", "UnknownFamily", "family", "spec"]


@functools.cache
def family(name: str) -> "AttentionFamily":
    """The family's implementation (one instance per process; they hold no state)."""
    module, _, attr = spec(name).impl.partition(":")
    return getattr(importlib.import_module(module), attr)()
