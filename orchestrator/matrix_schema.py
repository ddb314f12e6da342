"""The matrix schema: pydantic models over the located tree (orchestrator/matrix_tree.py).

`validate_doc` turns the first validation error into an InputError at the offending value's file
and line. Nothing here knows about backends or cases; the expansion lives in
orchestrator/matrix.py. The model block mirrors backend.case.ModelShape field by field (a new
ModelShape field gets one line in ModelBlock). Syntax reference: docs/MATRIX.md.
"""

from __future__ import annotations

import difflib
import itertools
import os
import typing
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from backend.case import CUDAGRAPH_MODES, KV_CACHE_DTYPES, MODEL_DTYPES, TP_SIZES
from backend.families.contract import UnknownFamily
from backend.families.contract import spec as family_spec
from orchestrator.errors import InputError
from orchestrator.matrix_tree import Node, error_at, field_path, to_plain

# `attention` first: the product runs family by family (each with its own axes: FamilyBlock), and
# gqa's combinations keep the order they had before the axis existed.
AXES = ("attention", "tp", "cudagraph_mode", "kv_cache_dtype", "batch", "backend", "seed", "spec_tokens", "cg_padding")
MAX_SPEC_TOKENS = 64


def _one_of(allowed: tuple, what: str):
    def check(v):
        if v not in allowed:
            raise ValueError(f"{v!r} is not a valid {what}; expected one of {', '.join(map(str, allowed))}")
        return v

    return AfterValidator(check)


TpValue = Annotated[int, _one_of(TP_SIZES, "tp")]


def _family(v: str) -> str:
    """A builtin family's name, or a plugin's (by name or "package.module:SPEC": the family's name
    from then on; backend/families/contract/plugins.py)."""
    try:
        return family_spec(v).name
    except UnknownFamily as e:
        raise ValueError(str(e)) from None


FamilyValue = Annotated[str, AfterValidator(_family)]
ModeValue = Annotated[str, _one_of(CUDAGRAPH_MODES, "cudagraph_mode")]
KvValue = Annotated[str, _one_of(KV_CACHE_DTYPES, "kv_cache_dtype")]
# Batch names end up in case ids: keep them id-safe so ids stay readable and distinct.
BatchName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
BackendName = Annotated[str, Field(min_length=1, max_length=200)]
Seed = Annotated[int, Field(ge=0, lt=2**63)]
# k speculative tokens; vLLM has no hard cap, 64 guards against a typo. Whether k fits the model
# and each batch (verify rows of 1 + k tokens) is checked per combination in orchestrator/matrix.py.
SpecTokens = Annotated[int, Field(ge=0, le=MAX_SPEC_TOKENS)]
# The values padded requests get (backend/attention/padding.py): "declared" (the backend's
# builders' own) or "SEQ_LEN/BLOCK" crossing them, e.g. "1/0" (FlashMLA fp8's) or "0/-1" (vLLM's default).
PadValue = Annotated[str, Field(pattern=r"^(declared|[0-9]{1,4}/-?[0-9]{1,6})$")]
Len = Annotated[int, Field(ge=-(2**31), le=2**31)]  # range is checked against the model, with a message
ToleranceKey = Literal["bfloat16", "float16", "float32", "fp8"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelBlock(_Model):
    num_heads: int = Field(ge=1, le=1024)
    # The KV cache's heads and head size: gqa's own (a family that derives them, MLA, must not be
    # given them; orchestrator/matrix_models.py builds each family's shape from this block).
    num_kv_heads: int | None = Field(None, ge=1, le=1024)
    head_size: int | None = Field(None, ge=1, le=1024)
    block_size: int = Field(16, ge=1, le=4096)
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    num_layers: int = Field(1, ge=1, le=256)
    max_model_len: int = Field(ge=1, le=1 << 22)
    max_num_seqs: int = Field(ge=1, le=65536)
    num_blocks: int = Field(0, ge=0, le=1 << 24)
    # vLLM's scheduler token budget (caps the default capture sizes); 0 = unbounded.
    max_num_batched_tokens: int = Field(0, ge=0, le=1 << 24)
    capture_style: Literal["v1", "v2"] = "v2"  # vLLM model runner whose capture is reproduced

    @model_validator(mode="after")
    def _gqa(self):
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        return self


assert set(MODEL_DTYPES) == {"bfloat16", "float16", "float32"}

PrefillRow = Annotated[list[Len], Field(min_length=2, max_length=2)]


class BatchBlock(_Model):
    """Compact: `decode: N` rows of query len 1 (`seq_len`: one int for all, or N ints) followed
    by `prefill: [[query_len, seq_len], ...]` rows. Explicit: `query_lens` + `seq_lens`."""

    decode: int = Field(0, ge=0, le=65536)
    seq_len: Len | list[Len] | None = None
    prefill: list[PrefillRow] = Field(default_factory=list, max_length=65536)
    query_lens: list[Len] | None = Field(None, max_length=65536)
    seq_lens: list[Len] | None = Field(None, max_length=65536)
    description: str = ""

    @model_validator(mode="after")
    def _shape(self):
        explicit = self.query_lens is not None or self.seq_lens is not None
        compact = self.decode or self.prefill or self.seq_len is not None
        if explicit and compact:
            raise ValueError("give either query_lens + seq_lens, or decode/seq_len/prefill, not both")
        if explicit:
            if self.query_lens is None or self.seq_lens is None:
                raise ValueError("query_lens and seq_lens must be given together")
            if len(self.query_lens) != len(self.seq_lens):
                raise ValueError(f"query_lens has {len(self.query_lens)} entries but seq_lens has {len(self.seq_lens)}")
            if not self.query_lens:
                raise ValueError("a batch needs at least one request")
            return self
        if self.decode and self.seq_len is None:
            raise ValueError("decode rows need seq_len (one int, or one per decode row)")
        if not self.decode and self.seq_len is not None:
            raise ValueError("seq_len is for decode rows; prefill rows are [query_len, seq_len] pairs")
        if isinstance(self.seq_len, list) and len(self.seq_len) != self.decode:
            raise ValueError(f"seq_len lists {len(self.seq_len)} lengths for {self.decode} decode rows")
        if not self.decode and not self.prefill:
            raise ValueError("a batch needs at least one request (decode: N and/or prefill: [[q, s], ...])")
        return self

    def rows(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(query_lens, seq_lens), decode rows first (as vLLM reorders a batch)."""
        if self.query_lens is not None:
            return tuple(self.query_lens), tuple(self.seq_lens or ())
        if isinstance(self.seq_len, list):
            seqs = self.seq_len
        else:  # one int for every decode row (the validator asks for it when there are any)
            seqs = [self.seq_len] * self.decode if self.seq_len is not None else []
        q = [1] * self.decode + [r[0] for r in self.prefill]
        s = list(seqs) + [r[1] for r in self.prefill]
        return tuple(q), tuple(s)


class TolBlock(_Model):
    atol: float = Field(ge=0, le=1e6, allow_inf_nan=False)
    rtol: float = Field(ge=0, le=1e6, allow_inf_nan=False)


def _no_duplicates(values: list) -> list:
    seen = set()
    for v in values:
        if v in seen:
            raise ValueError(f"duplicate value {v!r}")
        seen.add(v)
    return values


class Axes(_Model):
    attention: list[FamilyValue] = Field(["gqa"], min_length=1)
    tp: list[TpValue] = Field([1], min_length=1)
    cudagraph_mode: list[ModeValue] = Field(min_length=1)
    kv_cache_dtype: list[KvValue] = Field(["auto"], min_length=1)
    batch: list[BatchName] = Field(min_length=1)
    backend: list[BackendName] = Field(min_length=1)
    seed: list[Seed] = Field([0], min_length=1, max_length=10_000)
    spec_tokens: list[SpecTokens] = Field([0], min_length=1)
    cg_padding: list[PadValue] = Field(["declared"], min_length=1)

    _dups = field_validator("*")(_no_duplicates)


_T = typing.TypeVar("_T")
# A value, or a non-empty list of them meaning "any of" (exclude, include, constraints); held as a
# list either way (a plain value is a list of one).
AnyOf = Annotated[
    list[_T],
    BeforeValidator(lambda v: v if isinstance(v, list) else [v]),
    Field(min_length=1, max_length=10_000),
    AfterValidator(_no_duplicates),
]


class _Match(_Model):
    """A partial assignment of the axes but `attention`: matches a combination when every given
    key has one of its values (a plain value, or a list: "any of"). So one entry with lists stands
    for one entry per combination of its lists."""

    tp: AnyOf[TpValue] | None = None
    cudagraph_mode: AnyOf[ModeValue] | None = None
    kv_cache_dtype: AnyOf[KvValue] | None = None
    batch: AnyOf[BatchName] | None = None
    backend: AnyOf[BackendName] | None = None
    seed: AnyOf[Seed] | None = None
    spec_tokens: AnyOf[SpecTokens] | None = None
    cg_padding: AnyOf[PadValue] | None = None

    @model_validator(mode="after")
    def _not_empty(self):
        if not self.axes():
            keys = [k for k in AXES if k in type(self).model_fields]
            raise ValueError(f"empty entry: give at least one axis ({', '.join(keys)})")
        return self

    def axes(self) -> dict[str, list]:
        """The given axis keys, each with its values ("any of")."""
        return {k: list(getattr(self, k)) for k in AXES if getattr(self, k, None) is not None}

    def values(self, key: str) -> list:
        """The values this entry names for `key` ([] when it names none)."""
        return list(getattr(self, key, None) or ())

    def combinations(self) -> list[dict[str, Any]]:
        """One plain assignment per combination of the entry's lists (what a list stands for)."""
        axes = self.axes()
        return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


class FamilyMatch(_Match):
    """An exclude entry of a family block: matches within that family only."""


class AxisMatch(_Match):
    """An exclude entry, a constraint's `when:`, or an include entry's axis part."""

    attention: AnyOf[FamilyValue] | None = None


class IncludeEntry(AxisMatch):
    """GitHub Actions `include`: axis keys select or add combinations; the rest is merged in."""

    steps: int | None = Field(None, ge=3, le=1000)
    timeout_s: float | None = Field(None, gt=0, le=7 * 86400, allow_inf_nan=False)

    def extras(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("steps", "timeout_s") if getattr(self, k) is not None}


class Constraint(_Model):
    when: AxisMatch
    reason: str = Field(min_length=1, max_length=500)


class FamilyAxes(_Model):
    """A family's own axis values: they replace the matrix's for that family's combinations."""

    tp: list[TpValue] | None = Field(None, min_length=1)
    cudagraph_mode: list[ModeValue] | None = Field(None, min_length=1)
    kv_cache_dtype: list[KvValue] | None = Field(None, min_length=1)
    batch: list[BatchName] | None = Field(None, min_length=1)
    backend: list[BackendName] | None = Field(None, min_length=1)
    seed: list[Seed] | None = Field(None, min_length=1, max_length=10_000)
    spec_tokens: list[SpecTokens] | None = Field(None, min_length=1)
    cg_padding: list[PadValue] | None = Field(None, min_length=1)

    _dups = field_validator("*")(lambda v: v if v is None else _no_duplicates(v))

    def given(self) -> dict[str, list]:
        return {k: list(v) for k, v in self.model_dump(exclude_none=True).items()}


class FamilyBlock(_Model):
    """families.<name>: that attention family's model shape (its dims and any generic key, over
    the family's defaults and the matrix's model), axis values, exclude entries and tolerances. Its
    model keys are checked against the family's spec where the shape is built
    (orchestrator/matrix_models.py). The block is self-contained: the family's slices are cut here,
    so adding a family to a file touches nothing outside its block."""

    model: dict[str, Any] = Field(default_factory=dict)
    axes: FamilyAxes = Field(default_factory=FamilyAxes)
    exclude: list[FamilyMatch] = Field(default_factory=list)  # as the matrix's, within this family
    tolerances: dict[ToleranceKey, TolBlock] = Field(default_factory=dict)


class MatrixDoc(_Model):
    extends: str | None = None  # already merged by read_tree; kept so the key is allowed
    name: str | None = Field(None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.\-]+$")
    tier: Literal["smoke", "full", "nightly"] = "full"
    description: str = ""
    # A known-failures file, relative to the matrix file that names it (inherited by `extends:`).
    known_failures: str | None = Field(None, min_length=1, max_length=4096)
    model: ModelBlock
    batches: dict[BatchName, BatchBlock] = Field(min_length=1)
    capture_sizes: list[Annotated[int, Field(ge=1, le=1 << 20)]] | Literal["default"] = Field("default")
    steps: int = Field(3, ge=3, le=1000)
    timeout_s: float = Field(300.0, gt=0, le=7 * 86400, allow_inf_nan=False)
    tolerances: dict[ToleranceKey, TolBlock] = Field(default_factory=dict)
    axes: Axes
    families: dict[FamilyValue, FamilyBlock] = Field(default_factory=dict)
    exclude: list[AxisMatch] = Field(default_factory=list)
    include: list[IncludeEntry] = Field(default_factory=list)
    constraints: list[Constraint] = Field(default_factory=list)


def known_failures_file(tree: Node) -> str | None:
    """The file a validated matrix's `known_failures:` names, resolved against the matrix file that
    wrote the key (a parent's, through `extends:`); a missing file is an error at the key's line."""
    node = tree.value.get("known_failures")
    if node is None or node.value is None:
        return None
    path = os.path.normpath(os.path.join(os.path.dirname(node.src), str(node.value)))
    if not os.path.isfile(path):
        raise InputError(f"known_failures: no such file {path}", source=node.src, line=node.line)
    return path


def validate_doc(tree: Node) -> MatrixDoc:
    """pydantic over the (device-selected) tree; the first error becomes a located InputError."""
    try:
        return MatrixDoc.model_validate(to_plain(tree))
    except ValidationError as e:
        errors = e.errors(include_url=False)
        # An unknown key first: a misspelt `axis:` also makes `axes` missing, and the line the
        # user wrote (with its "did you mean") is the one to show.
        first = next((x for x in errors if x.get("type") == "extra_forbidden"), errors[0])
        loc = tuple(first.get("loc", ()))
        kind = first.get("type")
        msg = first.get("msg", "invalid").removeprefix("Value error, ")
        field = field_path(tree, loc)
        if kind in ("extra_forbidden", "missing") and loc:
            # The key is the error, not a field to prefix: name it, point at it (or its parent).
            what = "unknown key" if kind == "extra_forbidden" else "missing required key"
            msg, field = f"{what} {loc[-1]!r}", field_path(tree, loc[:-1])
            if kind == "extra_forbidden":
                close = difflib.get_close_matches(str(loc[-1]), _keys_at(loc[:-1]), n=1, cutoff=0.6)
                msg += f" (did you mean {close[0]!r}?)" if close else ""
        elif "input" in first and kind not in ("model_type", "value_error", "model_attributes_type"):
            msg += f" (got {_short(first['input'])})"
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise error_at(tree, loc, f"{field + ': ' if field else ''}{msg}{more}") from None


def _keys_at(loc: tuple) -> tuple[str, ...]:
    """The keys the schema allows at `loc` (model fields, through lists and dicts): what an
    unknown key is compared with for a "did you mean"; () where the walk cannot tell."""
    t: Any = MatrixDoc
    for part in (*loc, None):
        while typing.get_origin(t) is Annotated or typing.get_origin(t) in (typing.Union, type(int | None)):
            args = typing.get_args(t)
            t = (
                args[0]
                if typing.get_origin(t) is Annotated
                else next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), args[0])
            )
        if part is None:
            break
        if isinstance(t, type) and issubclass(t, BaseModel):
            field = t.model_fields.get(str(part))
            t = field.annotation if field is not None else None
        elif typing.get_origin(t) in (list, dict):
            t = typing.get_args(t)[-1]  # list[X] -> X; dict[K, V] -> V
        else:
            return ()
    return tuple(t.model_fields) if isinstance(t, type) and issubclass(t, BaseModel) else ()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
