"""What a family declares, torch-free (the matrix loader, the planner and the driver read it):
its model dimensions (Dim), its default shapes per device class, the tp layouts it can shard and
the shapes it accepts (FamilySpec). The builtin families' declarations are backend/families/specs.py;
a plugin's are its own module (registry.py finds both)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Dim:
    """One family-specific model dimension: an int in [lo, hi], or one of `choices` (a string)."""

    name: str
    default: int | str
    lo: int = 0
    hi: int = 1 << 20
    choices: tuple[str, ...] = ()
    doc: str = ""

    def check(self, value: Any) -> str | None:
        """Why `value` is not valid for this dim (one line), or None."""
        if self.choices:
            if value not in self.choices:
                return f"{self.name} {value!r} is not one of {', '.join(self.choices)}"
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{self.name} must be an integer, got {value!r}"
        if not self.lo <= value <= self.hi:
            return f"{self.name} {value} is outside [{self.lo}, {self.hi}]"
        return None


@dataclass(frozen=True)
class FamilySpec:
    name: str
    description: str
    impl: str  # "module:attribute" of the AttentionFamily implementation (imports torch)
    dims: tuple[Dim, ...] = ()
    # Generic ModelShape fields this family fixes from its dims (not to be written in a matrix):
    # fn(dims) -> {field: value}.
    derive: Callable[[Mapping[str, Any]], dict[str, Any]] = lambda dims: {}
    # Model keys (generic or dims) a matrix's shape starts from before its own block, per device
    # class: what "the family's shape" is when a matrix names the family and says nothing more.
    defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Every reason a shape of this family cannot be sharded over tp ranks: fn(shape, tp) -> [str].
    layout_reasons: Callable[[Any, int], list[str]] = lambda shape, tp: []
    # Every reason a shape is not a valid model of this family at all: fn(shape) -> [str].
    shape_reasons: Callable[[Any], list[str]] = lambda shape: []
    # Backend features a shape needs (a provider's Capabilities.features): fn(shape) -> (str, ...).
    requires: Callable[[Any], tuple[str, ...]] = lambda shape: ()
    # vLLM's V2 runner: a row with no context (a prompt's first chunk, even of one token) makes the
    # batch a prefill batch, never a FULL decode graph's, and stays a prompt under spec decode
    # (no verify row). Families whose backends class such rows as prefills say so; gqa, mla and
    # swa_sinks keep the query-len rule their verdicts were taken on.
    fresh_prompts_are_prefills: bool = False

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    def dim(self, name: str) -> Dim:
        return next(d for d in self.dims if d.name == name)

    def derived_fields(self) -> tuple[str, ...]:
        return tuple(self.derive({d.name: d.default for d in self.dims}))
