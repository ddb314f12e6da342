"""The product of a matrix's axes, cut by `exclude` and grown by `include`: pure functions over
plain dicts (orchestrator/matrix.py builds cases from what comes out). Semantics: docs/MATRIX.md
"Expansion".

An entry's value may be a list, meaning "any of": an exclude entry `{tp: [2, 4], mode:
FULL}` matches a combination whose tp is 2 or 4; an include entry with lists stands for one entry
per combination of its lists. Exclude entries carry `attention` when they come from a family
block (they cut that family only).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any


class IncompleteInclude(ValueError):
    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index = index


def matches(combo: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
    """Every key of `entry` is in `combo` with an equal value (a list: with one of its values)."""
    return all(k in combo and (combo[k] in v if isinstance(v, list) else combo[k] == v) for k, v in entry.items())


def combinations(entry: Mapping[str, Any], keys: Sequence[str]) -> list[dict[str, Any]]:
    """The plain entries an entry with lists stands for: one per combination of the lists among
    `keys` (the axes); other keys (steps, timeout_s, _include) are copied into each."""
    lists = {k: v for k, v in entry.items() if k in keys and isinstance(v, list)}
    rest = {k: v for k, v in entry.items() if k not in lists}
    return [{**rest, **dict(zip(lists, values))} for values in itertools.product(*lists.values())]


def axis_values(blocks: Sequence[Mapping[str, Sequence[Any]]]) -> dict[str, list]:
    """Every value each axis takes, over the blocks (one block of axes per attention family)."""
    keys = list(blocks[0])
    return {k: list(dict.fromkeys(v for block in blocks for v in block[k])) for k in keys}


def fits(entry: Mapping[str, Any], values: Mapping[str, Sequence[Any]]) -> bool:
    """Whether every axis value a plain include entry names is one the axes have."""
    return all(v in values[k] for k, v in entry.items() if k in values)


def expand(
    axes: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Sequence[Any]]],
    exclude: Sequence[Mapping[str, Any]],
    include: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Cartesian product of `axes` (in key order; a list of axes mappings: the concatenation of
    their products, one per attention family), minus every combination an `exclude` entry
    matches (all of its keys equal, a list: any of), then GitHub Actions `include`, entry by
    entry (an entry with lists: each of its combinations): an entry whose axis keys all match an
    original combination merges its other keys into every such combination (never overwriting an
    axis value; earlier merged extras may be overwritten); an entry that matches none is added as
    a new combination. A new combination must name every axis that has more than one value (over
    all the mappings); single-valued axes fill in. Added combinations carry "_include": the
    entry's index (an entry's own "_include", when it has one, is that index)."""
    blocks = [axes] if isinstance(axes, Mapping) else list(axes)
    keys = list(blocks[0])
    combos = [dict(zip(keys, values)) for block in blocks for values in itertools.product(*(block[k] for k in keys))]
    values = axis_values(blocks)
    combos = [c for c in combos if not any(matches(c, e) for e in exclude)]
    original = list(combos)
    for i, listed in enumerate(include):
        for entry in combinations(listed, keys):
            index = entry.pop("_include", i)
            axis_part = {k: v for k, v in entry.items() if k in values}
            extras = {k: v for k, v in entry.items() if k not in values}
            hit = [c for c in original if matches(c, axis_part)]
            for c in hit:
                c.update(extras)
            if hit:
                continue
            new = dict(entry)
            for k in keys:
                if k in new:
                    continue
                if len(values[k]) != 1:
                    raise IncompleteInclude(
                        index,
                        f"adds a new combination but does not say which {k} "
                        f"(axis has {', '.join(map(str, values[k]))})",
                    )
                new[k] = values[k][0]
            new["_include"] = index
            combos.append(new)
    return combos
