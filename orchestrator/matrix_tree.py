"""Matrix files as a located YAML tree: parse, `extends:` merges, per-device-class selection.

Every value keeps the file and line it came from (`Node`), through merges and selection, so that
any later error -- the schema's (orchestrator/matrix_schema.py) or the expansion's
(orchestrator/matrix.py) -- becomes `InputError(message, source=file, line=N)`. Imports run one
way: matrix.py -> matrix_schema.py -> matrix_tree.py. Syntax reference: docs/MATRIX.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import yaml

from orchestrator.errors import InputError

DEVICE_CLASSES = ("cpu", "gpu")
# Keys whose value may be given per device class: `{cpu: X, gpu: X}` instead of X.
PER_DEVICE_KEYS = ("model", "capture_sizes", "steps", "timeout_s", "tolerances")
FAMILY_PER_DEVICE_KEYS = ("model", "tolerances")  # under families.<name>:
# Not inherited through `extends:`: they describe the file itself.
NOT_INHERITED = ("extends", "name", "tier")
MAX_EXTENDS_DEPTH = 8
# Guard against alias bombs ("billion laughs") and self-referencing anchors.
MAX_NODES = 200_000


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


# libyaml's parser when PyYAML has it (5x faster on full.yaml); same nodes and marks.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str, src: str) -> Node:
    try:
        root = yaml.compose(text, Loader=_LOADER)
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
        raise InputError(
            "a matrix file must be a mapping (key: value), not a " + _kind(tree.value), source=src, line=tree.line
        )
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
        if (isinstance(node.value, dict) and part in node.value) or (
            isinstance(node.value, list) and isinstance(part, int) and 0 <= part < len(node.value)
        ):
            node = node.value[part]
    return node


def error_at(root: Node, loc: tuple, message: str) -> InputError:
    node = locate(root, loc)
    return InputError(message, source=node.src, line=node.line)


def _kind(value: Any) -> str:
    names: dict[type, str] = {dict: "mapping", list: "list"}
    return names.get(type(value), type(value).__name__)


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
            raise MissingVariant(
                f"{field} has no {device_class!r} variant (give cpu: and gpu:, or one plain value)",
                source=node.src,
                line=node.line,
            )
        return node.value[device_class]

    top = dict(root.value)
    for key in PER_DEVICE_KEYS:
        if key in top:
            top[key] = pick(top[key], key)
    batches = top.get("batches")
    if batches is not None and isinstance(batches.value, dict):
        top["batches"] = Node({k: pick(v, f"batches.{k}") for k, v in batches.value.items()}, batches.src, batches.line)
    families = top.get("families")
    if families is not None and isinstance(families.value, dict):  # families.<name>.model / .tolerances
        picked = {}
        for name, block in families.value.items():
            if isinstance(block.value, dict):
                block = Node(
                    {
                        k: pick(v, f"families.{name}.{k}") if k in FAMILY_PER_DEVICE_KEYS else v
                        for k, v in block.value.items()
                    },
                    block.src,
                    block.line,
                )
            picked[name] = block
        top["families"] = Node(picked, families.src, families.line)
    return Node(top, root.src, root.line)


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
