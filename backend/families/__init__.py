"""Attention families: what a case's attention computes, apart from which provider computes it.

A family is one module (gqa.py, mla.py): its model dimensions and default shapes (declared
torch-free in specs.py, for the matrix and the planner), its KV-cache layout, its test-model
layer (projections around the attention op), its step plan (e.g. decodes first), its fp32
reference and its rules for graphs. The harness (backend/harness/) knows families only through
the contract (contract/: AttentionFamily, StepState, FamilySpec and the registry), which imports
no family; so adding a family is a module here, a spec in specs.py and its line in the registry,
the providers that implement it (backend/providers/) and matrices.

    family("mla") -> the AttentionFamily (imports torch)
    spec("mla") -> its FamilySpec (torch-free)
"""

from __future__ import annotations

from backend.families.contract import DEFAULT_FAMILY, FAMILY_NAMES, UnknownFamily, family, spec

__all__ = ["DEFAULT_FAMILY", "FAMILY_NAMES", "UnknownFamily", "family", "spec"]
