"""Filters: axis terms, id globs/substrings, AND across terms, errors on typos."""

from __future__ import annotations

import pytest

from orchestrator.errors import InputError
from orchestrator.filters import select
from orchestrator.matrix import load_matrix
from tests.matrix.helpers import replace, write


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    doc = replace("num_heads: 8, num_kv_heads: 2", "num_heads: 4, num_kv_heads: 2")
    doc = doc.replace("tp: [1, 2]", "tp: [1, 2, 8]").replace("seed: [0]", "")
    doc = doc.replace("backend: [torch]", "backend: [torch, 'tests.matrix.plugins:NoFp8Backend']\n  seed: [0, 1]")
    return load_matrix(write(tmp_path_factory.mktemp("f"), doc), devices="cpu")


# (scenario, filter, predicate every selected case satisfies, expected count of runnable cases)
FILTERS = [
    ("no filter", None, lambda c: True, 48),
    ("blank filter", "   ", lambda c: True, 48),
    ("one axis value", "tp=2", lambda c: c.tp == 2, 24),
    ("several values", "tp=1,2 kv=auto", lambda c: c.kv_cache_dtype == "auto", 32),
    ("mode alias, case-insensitive", "mode=full", lambda c: c.mode == "FULL", 24),
    ("full axis name", "cudagraph_mode=NONE", lambda c: c.mode == "NONE", 24),
    ("value glob", "batch=m*", lambda c: c.batch.name == "mix", 24),
    ("backend by class name", "backend=NoFp8Backend", lambda c: c.backend.endswith(":NoFp8Backend"), 16),
    (
        "backend by import path",
        "backend=tests.matrix.plugins:NoFp8Backend",
        lambda c: c.backend.endswith(":NoFp8Backend"),
        16,
    ),
    ("seed", "seed=1", lambda c: c.seed == 1, 24),
    ("id substring", "FULL-fp8", lambda c: c.mode == "FULL" and c.kv_cache_dtype == "fp8", 8),
    ("id glob", "tp2-*-dec-*-s1", lambda c: c.tp == 2 and c.batch.name == "dec" and c.seed == 1, 6),
    (
        "terms are ANDed",
        "tp=1 mode=NONE dec s0",
        lambda c: (c.tp, c.mode, c.batch.name, c.seed) == (1, "NONE", "dec", 0),
        3,
    ),
    ("nothing matches", "seed=7", lambda c: False, 0),
]


@pytest.mark.parametrize("expr,pred,count", [pytest.param(*s[1:], id=s[0]) for s in FILTERS])
def test_select(matrix, expr, pred, count):
    chosen = select(matrix.cases, expr)
    assert len(chosen) == count
    assert all(pred(c) for c in chosen)
    # Everything left out fails the predicate or another term: the complement is consistent.
    if expr and expr.strip() and " " not in expr.strip():
        assert not any(pred(c) for c in matrix.cases if c not in chosen)
    assert chosen == [c for c in matrix.cases if c in chosen]  # order kept


def test_select_applies_to_skipped_cases(matrix):
    skipped = select(matrix.skipped, "tp=8 kv=fp8")
    assert skipped and all(s.case.tp == 8 and s.case.kv_cache_dtype == "fp8" for s in skipped)
    assert len(select(matrix.skipped, None)) == len(matrix.skipped)
    nofp8 = select(matrix.skipped, "backend=NoFp8Backend tp=1")
    assert {s.reason for s in nofp8} == {"NoFp8Backend does not support kv_cache_dtype fp8"}


@pytest.mark.parametrize(
    "expr,needle",
    [
        ("colour=red", "unknown filter key 'colour'"),
        ("tp=3", "'3' is not a tp value"),
        ("mode=FULLL", "is not a cudagraph_mode value"),
        ("kv=fp16", "is not a kv_cache_dtype value"),
        ("seed=x", "seed must be a non-negative integer"),
        ("tp=", "no value after '='"),
        ("=x", "unknown filter key ''"),
    ],
)
def test_bad_filters(matrix, expr, needle):
    with pytest.raises(InputError, match=needle) as e:
        select(matrix.cases, expr)
    assert e.value.one_line().startswith("--filter: ")
