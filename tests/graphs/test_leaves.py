"""backend/graphs/leaves.py against torch's pytree: the same leaves in the same order, and the
same rebuilt trees, for the argument shapes ATen calls take."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

from backend.graphs.leaves import leaves, map_leaves

T = torch.zeros(2)
Pair = namedtuple("Pair", "a b")
TREES = {
    "tensor": T,
    "scalar": 3,
    "none": None,
    "args and kwargs": ((T, 1, [T, 2.0], None), {"out": T, "dim": -1}),
    "nested lists": [[T, [T]], (), [], {}],
    "dict order": {"z": 1, "a": T, "m": (2, 3)},
    "named tuple": Pair(T, (T, 4)),
    "return_types": torch.max(torch.ones(3, 2), dim=1),
    "size and dtype": (torch.Size([2, 3]), torch.float16, "cpu"),
}


@pytest.mark.parametrize("name", list(TREES))
def test_leaves_are_pytrees_leaves(name):
    tree = TREES[name]
    got, want = leaves(tree), tree_flatten(tree)[0]
    assert len(got) == len(want) and all(a is b for a, b in zip(got, want)), (got, want)


@pytest.mark.parametrize("name", list(TREES))
def test_map_leaves_rebuilds_what_tree_map_rebuilds(name):
    tree = TREES[name]
    fn = lambda x: ("seen", x) if isinstance(x, torch.Tensor) else x
    got, want = map_leaves(fn, tree), tree_map(fn, tree)
    assert type(got) is type(want)
    assert tree_flatten(got)[1] == tree_flatten(want)[1]
    assert all(a is b or a == b for a, b in zip(leaves(got), leaves(want)))
