"""The model shape of each attention family a matrix runs: one stage of loading a matrix.

    family_shape(tree, doc, "mla", device_class) -> ModelShape

A family's shape is built in layers, each over the last (the later wins):
  1. the matrix's `model:` block, less the fields the family derives from its dims (MLA's
     num_kv_heads and head_size: one latent row per token);
  2. the family's own default shape for the device class (backend/families/specs.py: MLA's is
     DeepSeek-V3's per-rank shape on a GPU, a small one on a CPU); gqa has none;
  3. the matrix's `families.<name>.model` block.
Its keys are then split into generic ModelShape fields (validated with the schema's ModelBlock)
and the family's dims (validated against the spec's Dim bounds); the derived fields come from the
dims. Every error is an InputError at the file and line of the key at fault. Torch-free.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import ValidationError

from backend.case import ModelShape
from backend.families.contract import FamilySpec, source, spec
from orchestrator import matrix_schema as S
from orchestrator import matrix_tree as T
from orchestrator.errors import InputError

_GENERIC = tuple(S.ModelBlock.model_fields)


def family_shape(tree: T.Node, doc: S.MatrixDoc, family: str, device_class: str) -> ModelShape:
    fs = spec(family)
    derived = set(fs.derived_fields())
    block = doc.families.get(family)
    own = dict(block.model) if block is not None else {}
    loc_own = ("families", family, "model")
    for key in own:
        if key in derived:
            raise _err(
                tree, (*loc_own, key), f"{key} is derived for the {family} family ({_derived_note(fs)}); remove it"
            )
        if key not in _GENERIC and key not in fs.dim_names:
            close = difflib.get_close_matches(key, [*_GENERIC, *fs.dim_names], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _err(tree, (*loc_own, key), f"unknown key {key!r} for a {family} model{hint}")
    base = {k: v for k, v in doc.model.model_dump().items() if v is not None and k not in derived}
    merged = {**base, **fs.defaults.get(device_class, {}), **own}
    dims: dict[str, Any] = {}
    for d in fs.dims:
        value = merged.pop(d.name, d.default)
        why = d.check(value)
        if why:
            loc: tuple[str | int, ...] = (
                (*loc_own, d.name) if d.name in own else (("families", family) if block else ("axes", "attention"))
            )
            raise _err(tree, loc, why)
        dims[d.name] = value
    generic = {**merged, **fs.derive(dims)}
    missing = [k for k in ("num_kv_heads", "head_size") if generic.get(k) is None]
    if missing:
        loc = loc_own if block is not None else ("model",)
        raise _err(tree, loc, f"the {family} family needs {' and '.join(missing)} in its model")
    try:
        S.ModelBlock.model_validate(generic)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        bad = first["loc"][0] if first.get("loc") else None
        loc = (*loc_own, bad) if bad in own else (loc_own if block is not None else ("model",))
        msg = first.get("msg", "invalid").removeprefix("Value error, ")
        raise _err(tree, loc, f"{family} model: {key + ': ' if key else ''}{msg}") from None
    shape = ModelShape(**generic, attention=family, dims=tuple(dims.items()), family_source=source(family))
    reasons = fs.shape_reasons(shape)
    if reasons:
        raise _err(tree, loc_own if block is not None else ("model",), f"{family} model: {reasons[0]}")
    return shape


def _derived_note(fs: FamilySpec) -> str:
    example = fs.derive({d.name: d.default for d in fs.dims})
    return ", ".join(f"{k} from its dims" for k in example)


def _err(tree: T.Node, loc: tuple, message: str) -> InputError:
    field = T.field_path(tree, loc)
    return T.error_at(tree, loc, f"{field}: {message}" if field else message)
