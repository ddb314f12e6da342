"""The family contract: everything the harness (backend/harness/) knows of attention families, and
all it imports of them. It sits below the harness and below every family; it imports neither.

    spec.py      Dim, FamilySpec: what a family declares, torch-free (the planner's side)
    family.py    AttentionFamily (the op, its KV cache, its test-model layer, its fp32
                 reference, its step plan and groups), StepState (state across steps and its
                 checks), KVCacheGroup, layer_metadata: what the harness calls
    registry.py  spec(name), family(name): builtins and plugins, each found by import path
    plugins.py   families from outside orch's tree (an import path, an `orch.families` entry point)

Families (backend/families/<name>.py) implement the contract and may use the harness's utilities
(its reference attention, rmsnorm, checks); the harness reaches a family only through family(name).
A new family is its module, its spec and one BUILTIN line in registry.py: no harness edit.
tests/backend/test_layering.py holds the import graph to this.
"""

from __future__ import annotations

from backend.families.contract.family import (
    AttentionFamily,
    KVCacheGroup,
    NormFn,
    SingleGroupBuilder,
    StepState,
    WeightFn,
    layer_metadata,
    split_by,
)
from backend.families.contract.registry import DEFAULT_FAMILY, FAMILY_NAMES, UnknownFamily, family, source, spec
from backend.families.contract.spec import Dim, FamilySpec

__all__ = [
    "DEFAULT_FAMILY",
    "FAMILY_NAMES",
    "AttentionFamily",
    "Dim",
    "FamilySpec",
    "KVCacheGroup",
    "NormFn",
    "SingleGroupBuilder",
    "StepState",
    "UnknownFamily",
    "WeightFn",
    "family",
    "layer_metadata",
    "source",
    "spec",
    "split_by",
]
