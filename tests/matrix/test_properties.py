"""Property: any document, however broken, loads into a Matrix or raises InputError -- never
anything else (no traceback ever reaches the user). Random documents, mutated valid documents,
and character-level corruption of a valid file."""

from __future__ import annotations

import copy
import os
import tempfile

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import InputError
from orchestrator.matrix import Matrix, load_matrix
from tests.matrix.helpers import BASE

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WORDS = [
    # keys at every level
    "name",
    "tier",
    "extends",
    "description",
    "model",
    "batches",
    "capture_sizes",
    "steps",
    "timeout_s",
    "tolerances",
    "axes",
    "exclude",
    "include",
    "constraints",
    "when",
    "reason",
    "cpu",
    "gpu",
    "num_heads",
    "num_kv_heads",
    "head_size",
    "block_size",
    "dtype",
    "num_layers",
    "max_model_len",
    "max_num_seqs",
    "num_blocks",
    "decode",
    "seq_len",
    "prefill",
    "query_lens",
    "seq_lens",
    "tp",
    "cudagraph_mode",
    "kv_cache_dtype",
    "batch",
    "backend",
    "seed",
    "atol",
    "rtol",
    # values
    "NONE",
    "PIECEWISE",
    "FULL",
    "FULL_DECODE_ONLY",
    "FULL_AND_PIECEWISE",
    "auto",
    "fp8",
    "bfloat16",
    "float16",
    "float32",
    "smoke",
    "full",
    "nightly",
    "default",
    "dec",
    "mix",
    "torch",
    "aiter-emulated",
    "aiter",
    "nosuch",
    "tests.matrix.plugins:NoFp8Backend",
    "tests.matrix.plugins:NOT_A_CLASS",
    "tests.matrix.plugins:NowhereBackend",
    "m.yaml",
    "other.yaml",
]
# Free text never contains ':' or '.', so a random string cannot name an importable module.
TEXT = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_- ", max_size=12)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(WORDS),
    TEXT,
)
KEYS = st.one_of(st.sampled_from(WORDS), TEXT, st.integers(-3, 9))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(KEYS, inner, max_size=6)),
    max_leaves=30,
)
DEVICES = st.sampled_from(["cpu", "gpu"])


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield d


def _check(workdir: str, text: str, devices: str) -> None:
    path = os.path.join(workdir, "m.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    try:
        m = load_matrix(path, devices=devices)
    except InputError as e:
        assert e.source, e
        assert "\n" not in e.one_line()
        return
    assert isinstance(m, Matrix)
    ids = [c.case_id for c in m.cases] + [s.case.case_id for s in m.skipped]
    assert len(ids) == len(set(ids))
    for case in m.cases:
        b = case.batch
        assert b.num_reqs <= case.model.max_num_seqs
        assert all(s >= q >= 1 and s <= case.model.max_model_len for q, s in zip(b.query_lens, b.seq_lens))
        assert case.steps >= 3 and case.model.num_heads % case.tp == 0


@SETTINGS
@given(doc=st.dictionaries(KEYS, VALUES, max_size=10), devices=DEVICES)
def test_random_documents(workdir, doc, devices):
    _check(workdir, yaml.safe_dump(doc, allow_unicode=True), devices)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _get(node, path):
    for p in path:
        node = node[p]
    return node


@st.composite
def mutated(draw):
    doc = copy.deepcopy(yaml.safe_load(BASE))
    for _ in range(draw(st.integers(1, 4))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "delete", "add", "scalar-swap", "duplicate"]))
        if not path:
            doc = draw(VALUES) if op == "replace" else doc
            if not isinstance(doc, dict):
                break
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        if op == "replace":
            parent[key] = draw(VALUES)
        elif op == "delete":
            del parent[key]
        elif op == "add" and isinstance(parent, dict):
            parent[draw(KEYS)] = draw(VALUES)
        elif op == "scalar-swap":
            parent[key] = draw(SCALARS)
        elif op == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))
    return doc


@SETTINGS
@given(doc=mutated(), devices=DEVICES)
def test_mutated_documents(workdir, doc, devices):
    _check(workdir, yaml.safe_dump(doc, allow_unicode=True), devices)


@SETTINGS
@given(data=st.data(), devices=DEVICES)
def test_corrupted_text(workdir, data, devices):
    text = BASE
    for _ in range(data.draw(st.integers(1, 5))):
        at = data.draw(st.integers(0, len(text)))
        op = data.draw(st.sampled_from(["insert", "delete"]))
        if op == "insert":
            text = (
                text[:at]
                + data.draw(st.sampled_from(list("[]{}:,-#'\"!&*|>\t\n ") + ["  ", "0", "x", "\u00e9"]))
                + text[at:]
            )
        else:
            text = text[:at] + text[at + data.draw(st.integers(1, 8)) :]
    _check(workdir, text, devices)


@SETTINGS
@given(text=st.text(max_size=200), devices=DEVICES)
def test_arbitrary_text(workdir, text, devices):
    _check(workdir, text, devices)


def test_alias_bomb_is_an_input_error(workdir):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]"
        for i in range(1, 9)
    ]
    path = os.path.join(workdir, "bomb.yaml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(InputError, match="too large"):
        load_matrix(path, devices="cpu")


def test_self_referencing_anchor_is_an_input_error(workdir):
    path = os.path.join(workdir, "loop.yaml")
    with open(path, "w") as f:
        f.write("a: &x [1, *x]\n")
    with pytest.raises(InputError):
        load_matrix(path, devices="cpu")
