"""Matrix files as a located YAML tree and the pydantic models that validate it.

Every value keeps the file and line it came from (`Node`), through `extends:` merges and
per-device-class selection, so that any validation error -- pydantic's or ours -- becomes
`InputError(message, source=file, line=N)`. Nothing here knows about backends or cases; the
expansion lives in orchestrator/matrix.py. Syntax reference: docs/MATRIX.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from backend.case import CUDAGRAPH_MODES, KV_CACHE_DTYPES, MODEL_DTYPES, TP_SIZES
from orchestrator.errors import InputError

DEVICE_CLASSES = ("cpu", "gpu")
AXES = ("tp", "cudagraph_mode", "kv_cache_dtype", "batch", "backend", "seed")
# Keys whose value may be given per device class: `{cpu: X, gpu: X}` instead of X.
PER_DEVICE_KEYS = ("model", "capture_sizes", "steps", "timeout_s", "tolerances")
# Not inherited through `extends:`: they describe the file itself.
NOT_INHERITED = ("extends", "name", "tier")
MAX_EXTENDS_DEPTH = 8
# Guard against alias bombs ("billion laughs") and self-referencing anchors.
MAX_NODES = 200_000


# ---------------------------------------------------------------------------------------------
# Located YAML tree


@dataclass
class Node:
    """A YAML value with its origin. value: dict[key, Node] | list[Node] | scalar.
    For mapping entries `line` is the key's line (where a reader looks for the field)."""

    value: Any
    src: str
    line: int


class _Builder:
    def __init__(self, src: str):
        self.src = src
        self.count = 0
        self.constructor = yaml.constructor.SafeConstructor()

    def build(self, node: yaml.Node, depth: int = 0) -> Node:
        self.count += 1
        line = node.start_mark.line + 1
        if self.count > MAX_NODES or depth > 100:
            raise InputError("document too large or too deeply nested (aliases?)", source=self.src, line=line)
        if isinstance(node, yaml.MappingNode):
            own: set = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self._key(key_node)
                if key in own:  # PyYAML would silently keep the last one
                    raise InputError(f"duplicate key {key!r}", source=self.src, line=key_node.start_mark.line + 1)
                own.add(key)
            # `<<: *anchor` merge keys: merged pairs come first, so the file's own keys override.
            self.constructor.flatten_mapping(node)
            out: dict[Any, Node] = {}
            for key_node, value_node in node.value:
                key = self._key(key_node)
                child = self.build(value_node, depth + 1)
                child.line = key_node.start_mark.line + 1
                out[key] = child
            return Node(out, self.src, line)
        if isinstance(node, yaml.SequenceNode):
            return Node([self.build(item, depth + 1) for item in node.value], self.src, line)
        return Node(self._scalar(node), self.src, line)

    def _key(self, node: yaml.Node) -> Any:
        line = node.start_mark.line + 1
        if not isinstance(node, yaml.ScalarNode):
            raise InputError("mapping keys must be plain scalars", source=self.src, line=line)
        key = self._scalar(node)
        if key is not None and not isinstance(key, (str, int, float, bool)):
            raise InputError(f"unsupported mapping key {key!r}", source=self.src, line=line)
        return key

    def _scalar(self, node: yaml.Node) -> Any:
        try:
            return self.constructor.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as e:  # e.g. timestamp 2020-13-45
            msg = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
            raise InputError(f"bad value: {msg}", source=self.src, line=node.start_mark.line + 1) from None


def parse_yaml(text: str, src: str) -> Node:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = " ".join(str(p) for p in (e.context, e.problem) if p) or "invalid YAML"
        raise InputError(f"YAML syntax error: {problem}", source=src, line=mark.line + 1 if mark else None) from None
    except (yaml.YAMLError, RecursionError, ValueError) as e:
        raise InputError(f"YAML error: {type(e).__name__}: {str(e)[:200]}", source=src) from None
    if root is None:
        raise InputError("empty document: expected a mapping of matrix keys", source=src, line=1)
    try:
        tree = _Builder(src).build(root)
    except RecursionError:
        raise InputError("document nested too deeply", source=src) from None
    if not isinstance(tree.value, dict):
        raise InputError("a matrix file must be a mapping (key: value), not a " + _kind(tree.value), source=src, line=tree.line)
    return tree


def read_tree(path: str, _chain: tuple[str, ...] = ()) -> Node:
    """Parse `path` and merge it over the file named by its `extends:` key (recursively)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise InputError("no such matrix file", source=path) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read matrix file: {e.__class__.__name__}: {e}", source=path) from None
    tree = parse_yaml(text, path)
    ext = tree.value.get("extends")
    if ext is None:
        return tree
    if not isinstance(ext.value, str) or not ext.value.strip() or "\0" in ext.value:
        raise InputError("extends: expected a file name (string)", source=path, line=ext.line)
    parent_path = os.path.normpath(os.path.join(os.path.dirname(path), ext.value))
    chain = (*_chain, os.path.realpath(path))
    if os.path.realpath(parent_path) in chain:
        raise InputError(f"extends: cycle through {ext.value}", source=path, line=ext.line)
    if len(chain) > MAX_EXTENDS_DEPTH:
        raise InputError("extends: chain too long", source=path, line=ext.line)
    if not os.path.isfile(parent_path):
        raise InputError(f"extends: no such file {parent_path}", source=path, line=ext.line)
    parent = read_tree(parent_path, chain)
    for key in NOT_INHERITED:
        parent.value.pop(key, None)
    return merge(parent, tree)


def merge(base: Node, over: Node) -> Node:
    """Mappings merge key by key (recursively); anything else in `over` replaces `base`."""
    if not (isinstance(base.value, dict) and isinstance(over.value, dict)):
        return over
    out = dict(base.value)
    for key, node in over.value.items():
        out[key] = merge(out[key], node) if key in out else node
    return Node(out, over.src, over.line)


def to_plain(node: Node) -> Any:
    if isinstance(node.value, dict):
        return {k: to_plain(v) for k, v in node.value.items()}
    if isinstance(node.value, list):
        return [to_plain(v) for v in node.value]
    return node.value


def locate(root: Node, loc: tuple) -> Node:
    """Deepest node along a pydantic error location; unknown parts (union tags) are skipped."""
    node = root
    for part in loc:
        if isinstance(node.value, dict) and part in node.value:
            node = node.value[part]
        elif isinstance(node.value, list) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
    return node


def error_at(root: Node, loc: tuple, message: str) -> InputError:
    node = locate(root, loc)
    return InputError(message, source=node.src, line=node.line)


def _kind(value: Any) -> str:
    return {dict: "mapping", list: "list"}.get(type(value), type(value).__name__)


def is_per_device(node: Node) -> bool:
    return isinstance(node.value, dict) and bool(node.value) and set(node.value) <= set(DEVICE_CLASSES)


class MissingVariant(InputError):
    """A per-device-class value lacks the class being loaded."""


def select_device(root: Node, device_class: str) -> Node:
    """A copy of the tree with every `{cpu: X, gpu: Y}` value (top-level PER_DEVICE_KEYS and each
    batch spec) replaced by the variant for `device_class`."""

    def pick(node: Node, field: str) -> Node:
        if not is_per_device(node):
            return node
        if device_class not in node.value:
            raise MissingVariant(f"{field} has no {device_class!r} variant (give cpu: and gpu:, or one plain value)",
                                 source=node.src, line=node.line)
        return node.value[device_class]

    top = dict(root.value)
    for key in PER_DEVICE_KEYS:
        if key in top:
            top[key] = pick(top[key], key)
    batches = top.get("batches")
    if batches is not None and isinstance(batches.value, dict):
        top["batches"] = Node({k: pick(v, f"batches.{k}") for k, v in batches.value.items()}, batches.src, batches.line)
    return Node(top, root.src, root.line)


# ---------------------------------------------------------------------------------------------
# Schema


def _one_of(allowed: tuple, what: str):
    def check(v):
        if v not in allowed:
            raise ValueError(f"{v!r} is not a valid {what}; expected one of {', '.join(map(str, allowed))}")
        return v

    return AfterValidator(check)


TpValue = Annotated[int, _one_of(TP_SIZES, "tp")]
ModeValue = Annotated[str, _one_of(CUDAGRAPH_MODES, "cudagraph_mode")]
KvValue = Annotated[str, _one_of(KV_CACHE_DTYPES, "kv_cache_dtype")]
# Batch names end up in case ids: keep them id-safe so ids stay readable and distinct.
BatchName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
BackendName = Annotated[str, Field(min_length=1, max_length=200)]
Seed = Annotated[int, Field(ge=0, lt=2**63)]
Len = Annotated[int, Field(ge=-(2**31), le=2**31)]  # range is checked against the model, with a message
ToleranceKey = Literal["bfloat16", "float16", "float32", "fp8"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelBlock(_Model):
    num_heads: int = Field(ge=1, le=1024)
    num_kv_heads: int = Field(ge=1, le=1024)
    head_size: int = Field(ge=1, le=1024)
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
        if self.num_heads % self.num_kv_heads:
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
        seqs = self.seq_len if isinstance(self.seq_len, list) else [self.seq_len] * self.decode
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
    tp: list[TpValue] = Field([1], min_length=1)
    cudagraph_mode: list[ModeValue] = Field(min_length=1)
    kv_cache_dtype: list[KvValue] = Field(["auto"], min_length=1)
    batch: list[BatchName] = Field(min_length=1)
    backend: list[BackendName] = Field(min_length=1)
    seed: list[Seed] = Field([0], min_length=1, max_length=10_000)

    _dups = field_validator("*")(_no_duplicates)


class AxisMatch(_Model):
    """A partial assignment of axes: matches a combination when every given key is equal."""

    tp: TpValue | None = None
    cudagraph_mode: ModeValue | None = None
    kv_cache_dtype: KvValue | None = None
    batch: BatchName | None = None
    backend: BackendName | None = None
    seed: Seed | None = None

    @model_validator(mode="after")
    def _not_empty(self):
        if not self.model_dump(exclude_none=True):
            raise ValueError("empty entry: give at least one axis (tp, cudagraph_mode, kv_cache_dtype, batch, backend, seed)")
        return self

    def axes(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in AXES if getattr(self, k) is not None}


class IncludeEntry(AxisMatch):
    """GitHub Actions `include`: axis keys select or add combinations; the rest is merged in."""

    steps: int | None = Field(None, ge=3, le=1000)
    timeout_s: float | None = Field(None, gt=0, le=7 * 86400, allow_inf_nan=False)

    def extras(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("steps", "timeout_s") if getattr(self, k) is not None}


class Constraint(_Model):
    when: AxisMatch
    reason: str = Field(min_length=1, max_length=500)


class MatrixDoc(_Model):
    extends: str | None = None  # already merged by read_tree; kept so the key is allowed
    name: str | None = Field(None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.\-]+$")
    tier: Literal["smoke", "full", "nightly"] = "full"
    description: str = ""
    model: ModelBlock
    batches: dict[BatchName, BatchBlock] = Field(min_length=1)
    capture_sizes: list[Annotated[int, Field(ge=1, le=1 << 20)]] | Literal["default"] = Field("default")
    steps: int = Field(3, ge=3, le=1000)
    timeout_s: float = Field(300.0, gt=0, le=7 * 86400, allow_inf_nan=False)
    tolerances: dict[ToleranceKey, TolBlock] = Field(default_factory=dict)
    axes: Axes
    exclude: list[AxisMatch] = Field(default_factory=list)
    include: list[IncludeEntry] = Field(default_factory=list)
    constraints: list[Constraint] = Field(default_factory=list)


def validate_doc(tree: Node) -> MatrixDoc:
    """pydantic over the (device-selected) tree; the first error becomes a located InputError."""
    try:
        return MatrixDoc.model_validate(to_plain(tree))
    except ValidationError as e:
        errors = e.errors(include_url=False)
        first = errors[0]
        loc = tuple(first.get("loc", ()))
        kind = first.get("type")
        msg = first.get("msg", "invalid").removeprefix("Value error, ")
        field = field_path(tree, loc)
        if kind in ("extra_forbidden", "missing") and loc:
            # The key is the error, not a field to prefix: name it, point at it (or its parent).
            what = "unknown key" if kind == "extra_forbidden" else "missing required key"
            msg, field = f"{what} {loc[-1]!r}", field_path(tree, loc[:-1])
        elif "input" in first and kind not in ("model_type", "value_error", "model_attributes_type"):
            msg += f" (got {_short(first['input'])})"
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise error_at(tree, loc, f"{field + ': ' if field else ''}{msg}{more}") from None


def field_path(root: Node, loc: tuple) -> str:
    """`batches.mix.prefill[1]` for a location; parts that are not keys in the tree (pydantic's
    union tags) are dropped."""
    out, node = "", root
    for part in loc:
        if isinstance(node.value, dict) and part in node.value:
            node = node.value[part]
            out += f".{part}" if out else str(part)
        elif isinstance(node.value, list) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            out += f"[{part}]"
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
