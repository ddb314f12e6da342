"""The leaves of an op's arguments or result, as torch.utils._pytree.tree_flatten lists them, for
the shapes ATen calls take: tuples (named ones and torch.return_types too), lists and dicts
(values in insertion order), anything else a leaf.

The emulation flattens every op's arguments during captures and replays (emulated.py) and every
op under the host-provenance mode (provenance.py); pytree's general registry lookups were about a
tenth of a swa_sinks case's time on the CPU (benchmarks/gpu_profile.py). Same leaves, same order:
tests/graphs/test_leaves.py holds it to tree_flatten.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils._pytree import tree_map


def leaves(tree: Any) -> list[Any]:
    out: list[Any] = []
    _collect(tree, out)
    return out


def _collect(x: Any, out: list[Any]) -> None:
    if isinstance(x, (tuple, list)):
        for y in x:
            _collect(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _collect(y, out)
    else:
        out.append(x)


def map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """`fn` over the leaves, the containers rebuilt (tree_map's result for these shapes); a named
    tuple or a torch.return_types goes to tree_map itself."""
    t = type(tree)
    if t is tuple:
        return tuple(map_leaves(fn, y) for y in tree)
    if t is list:
        return [map_leaves(fn, y) for y in tree]
    if t is dict:
        return {k: map_leaves(fn, y) for k, y in tree.items()}
    if isinstance(tree, (tuple, list, dict)):
        return tree_map(fn, tree)
    return fn(tree)
