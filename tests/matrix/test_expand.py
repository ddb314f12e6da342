"""Expansion: product, exclude (partial match), include (merge or add), constraints, tiers."""

from __future__ import annotations

import pytest

from backend.case import ModelShape
from orchestrator.matrix import expand, head_reasons, load_matrix
from tests.matrix.helpers import BASE, replace, write

AXES = {"tp": [1, 2], "cudagraph_mode": ["NONE", "FULL"], "seed": [0]}


def ids(combos):
    return [(c["tp"], c["cudagraph_mode"], c["seed"]) for c in combos]


# (scenario, exclude, include, expected combinations in order, expected extras per combination)
EXPANSION = [
    ("product in axis order", [], [], [(1, "NONE", 0), (1, "FULL", 0), (2, "NONE", 0), (2, "FULL", 0)], {}),
    ("exclude with one key drops every match", [{"tp": 2}], [], [(1, "NONE", 0), (1, "FULL", 0)], {}),
    (
        "exclude is a partial match: all given keys must match",
        [{"tp": 2, "cudagraph_mode": "FULL"}],
        [],
        [(1, "NONE", 0), (1, "FULL", 0), (2, "NONE", 0)],
        {},
    ),
    (
        "exclude of a value not in the axes removes nothing",
        [{"seed": 9}],
        [],
        [(1, "NONE", 0), (1, "FULL", 0), (2, "NONE", 0), (2, "FULL", 0)],
        {},
    ),
    (
        "include with matching axes merges extras, adds nothing",
        [],
        [{"cudagraph_mode": "FULL", "steps": 7}],
        [(1, "NONE", 0), (1, "FULL", 0), (2, "NONE", 0), (2, "FULL", 0)],
        {(1, "FULL", 0): {"steps": 7}, (2, "FULL", 0): {"steps": 7}},
    ),
    (
        "include with only extras merges into all",
        [],
        [{"timeout_s": 9.0}],
        [(1, "NONE", 0), (1, "FULL", 0), (2, "NONE", 0), (2, "FULL", 0)],
        {k: {"timeout_s": 9.0} for k in [(1, "NONE", 0), (1, "FULL", 0), (2, "NONE", 0), (2, "FULL", 0)]},
    ),
    (
        "include with a new axis value adds one combination",
        [],
        [{"tp": 8, "cudagraph_mode": "FULL"}],
        [(1, "NONE", 0), (1, "FULL", 0), (2, "NONE", 0), (2, "FULL", 0), (8, "FULL", 0)],
        {},
    ),
    (
        "include re-adds what exclude removed",
        [{"tp": 2}],
        [{"tp": 2, "cudagraph_mode": "NONE", "steps": 4}],
        [(1, "NONE", 0), (1, "FULL", 0), (2, "NONE", 0)],
        {(2, "NONE", 0): {"steps": 4}},
    ),
    (
        "later include overwrites an extra, never an axis value",
        [],
        [{"tp": 1, "steps": 5}, {"cudagraph_mode": "NONE", "steps": 6}],
        [(1, "NONE", 0), (1, "FULL", 0), (2, "NONE", 0), (2, "FULL", 0)],
        {(1, "NONE", 0): {"steps": 6}, (1, "FULL", 0): {"steps": 5}, (2, "NONE", 0): {"steps": 6}},
    ),
    (
        "include does not match combinations added by an earlier include",
        [],
        [{"tp": 8, "cudagraph_mode": "FULL"}, {"tp": 8, "cudagraph_mode": "FULL", "steps": 9}],
        [(1, "NONE", 0), (1, "FULL", 0), (2, "NONE", 0), (2, "FULL", 0), (8, "FULL", 0), (8, "FULL", 0)],
        {(8, "FULL", 0): {"steps": 9}},
    ),
    (
        "single-valued axes fill a new combination",
        [],
        [{"tp": 4, "cudagraph_mode": "NONE", "seed": 3}],
        [(1, "NONE", 0), (1, "FULL", 0), (2, "NONE", 0), (2, "FULL", 0), (4, "NONE", 3)],
        {},
    ),
    # A list value means "any of": one entry stands for one per value.
    (
        "exclude with a list drops a match of any of its values",
        [{"tp": [1, 2], "cudagraph_mode": "FULL"}],
        [],
        [(1, "NONE", 0), (2, "NONE", 0)],
        {},
    ),
    (
        "exclude with two lists drops their product",
        [{"tp": [2], "cudagraph_mode": ["NONE", "FULL"]}],
        [],
        [(1, "NONE", 0), (1, "FULL", 0)],
        {},
    ),
    (
        "include with a list merges into each value's matches",
        [],
        [{"tp": [1, 2], "cudagraph_mode": "FULL", "steps": 7}],
        [(1, "NONE", 0), (1, "FULL", 0), (2, "NONE", 0), (2, "FULL", 0)],
        {(1, "FULL", 0): {"steps": 7}, (2, "FULL", 0): {"steps": 7}},
    ),
    (
        "include with a list adds one combination per new value",
        [],
        [{"tp": [4, 8], "cudagraph_mode": "FULL"}],
        [(1, "NONE", 0), (1, "FULL", 0), (2, "NONE", 0), (2, "FULL", 0), (4, "FULL", 0), (8, "FULL", 0)],
        {},
    ),
]


@pytest.mark.parametrize("exclude,include,expected,extras", [pytest.param(*s[1:], id=s[0]) for s in EXPANSION])
def test_expand(exclude, include, expected, extras):
    combos = expand(AXES, exclude, include)
    assert ids(combos) == expected
    for c in combos:
        got = {k: v for k, v in c.items() if k in ("steps", "timeout_s")}
        want = extras.get((c["tp"], c["cudagraph_mode"], c["seed"]), {})
        if (c["tp"], c["cudagraph_mode"]) == (8, "FULL") and "_include" in c and c["_include"] == 0:
            want = {}
        assert got == want, c


# (num_heads, num_kv_heads, tp, expected reasons): vLLM's head sharding rules
HEADS = [
    (8, 2, 1, []),
    (8, 2, 2, []),
    (8, 2, 8, []),  # kv heads replicated 4x
    (8, 8, 4, []),
    (32, 8, 8, []),
    (12, 12, 8, ["num_heads 12 not divisible by tp 8", "num_kv_heads 12 not divisible by tp 8"]),
    (4, 2, 8, ["tp 8 > num_heads 4"]),
    (24, 6, 4, ["num_kv_heads 6 not divisible by tp 4"]),
    (24, 3, 8, ["tp 8 not a multiple of num_kv_heads 3 (kv heads replicated)"]),
]


@pytest.mark.parametrize("heads,kv,tp,reasons", HEADS)
def test_head_reasons(heads, kv, tp, reasons):
    assert head_reasons(ModelShape(num_heads=heads, num_kv_heads=kv), tp) == reasons


def test_loaded_cases_carry_the_matrix_values(tmp_path):
    path = write(tmp_path, BASE + "tolerances: {fp8: {atol: 0.5, rtol: 0.25}}\nsteps: 4\ntimeout_s: 12\n")
    m = load_matrix(path, devices="cpu")
    assert (m.path, m.name, m.device_class) == (path, "base", "cpu")
    assert len(m.cases) == 2 * 2 * 2 * 2 and not m.skipped
    case = m.find("tp2-FULL-fp8-mix-torch-s0")
    assert case.batch.query_lens == (1, 1, 5) and case.batch.seq_lens == (30, 30, 20)
    assert case.model.num_heads == 8 and case.model.max_num_seqs == 16
    assert case.capture_sizes == (1, 2, 4, 8, 16, 32)
    assert (case.tolerance.atol, case.tolerance.rtol) == (0.5, 0.25)
    assert m.find("tp2-FULL-auto-mix-torch-s0").tolerance.atol == 2e-2  # bf16 default
    assert (case.steps, case.timeout_s, case.matrix, case.tier) == (4, 12.0, path, "full")
    assert m.find("no-such-id") is None


def test_default_capture_sizes_follow_vllm_capped_by_max_num_seqs(tmp_path):
    m = load_matrix(write(tmp_path, replace("capture_sizes: [1, 2, 4, 8, 16, 32]\n", "")), devices="cpu")
    assert m.cases[0].capture_sizes == (1, 2, 4, 8, 16, 24, 32)  # max = 2 * max_num_seqs


def test_include_extras_reach_the_case(tmp_path):
    doc = (
        BASE
        + "include:\n  - {cudagraph_mode: FULL, steps: 9}\n  - {tp: 4, cudagraph_mode: NONE, kv_cache_dtype: auto, batch: dec, timeout_s: 5}\n"
    )
    m = load_matrix(write(tmp_path, doc), devices="cpu")
    assert {c.steps for c in m.cases if c.mode == "FULL"} == {9}
    assert {c.steps for c in m.cases if c.mode == "NONE"} == {3}
    added = m.find("tp4-NONE-auto-dec-torch-s0")
    assert added.timeout_s == 5.0 and len(m.cases) == 17


# (scenario, backend / constraint text, case id, expected reason)
SKIPS = [
    ("heads vs tp", None, "tp8-NONE-auto-dec-torch-s0", "tp 8 > num_heads 4"),
    (
        "kv dtype unsupported",
        "tests.matrix.plugins:NoFp8Backend",
        "tp1-NONE-fp8-dec-NoFp8Backend-s0",
        "NoFp8Backend does not support kv_cache_dtype fp8",
    ),
    (
        "unavailable on this device class",
        "tests.matrix.plugins:NowhereBackend",
        "tp1-NONE-auto-dec-NowhereBackend-s0",
        "unavailable: needs a unicorn, not cpu",
    ),
    (
        "availability check crashes",
        "tests.matrix.plugins:CrashingCheckBackend",
        "tp1-NONE-auto-dec-CrashingCheckBackend-s0",
        "unavailable: CrashingCheckBackend.unavailable_reason raised RuntimeError: probe exploded",
    ),
    ("user constraint", "constraint", "tp2-FULL-auto-dec-torch-s0", "FULL at tp 2 is known slow here"),
]


@pytest.mark.parametrize("extra,case_id,reason", [pytest.param(*s[1:], id=s[0]) for s in SKIPS])
def test_constraints_skip_with_reason(tmp_path, extra, case_id, reason):
    doc = replace("num_heads: 8, num_kv_heads: 2", "num_heads: 4, num_kv_heads: 2").replace(
        "tp: [1, 2]", "tp: [1, 2, 8]"
    )
    if extra == "constraint":
        doc += "constraints:\n  - when: {tp: 2, cudagraph_mode: FULL}\n    reason: FULL at tp 2 is known slow here\n"
    elif extra:
        doc = doc.replace("backend: [torch]", f"backend: [torch, '{extra}']")
    m = load_matrix(write(tmp_path, doc), devices="cpu")
    found = m.find(case_id)
    assert found is not None and not hasattr(found, "case_id"), found  # a SkippedCase
    assert found.reason == reason
    assert all(c.tp != 8 for c in m.cases) and m.cases  # tp 1/2 torch still runnable
    runnable_ids = {c.case_id for c in m.cases}
    assert case_id not in runnable_ids


def test_constraint_skips_only_what_it_matches(tmp_path):
    doc = BASE + "constraints:\n  - when: {tp: 2, kv_cache_dtype: fp8}\n    reason: no fp8 at tp 2\n"
    m = load_matrix(write(tmp_path, doc), devices="cpu")
    assert sorted(s.case.case_id for s in m.skipped) == sorted(
        f"tp2-{mode}-fp8-{b}-torch-s0" for mode in ("NONE", "FULL") for b in ("dec", "mix")
    )
    assert {s.reason for s in m.skipped} == {"no fp8 at tp 2"}
    assert len(m.cases) == 12


def test_backend_override_replaces_the_axis(tmp_path):
    doc = replace("backend: [torch]", "backend: [torch, aiter-emulated]")
    m = load_matrix(write(tmp_path, doc), devices="cpu", backend_override="tests.matrix.plugins:NoFp8Backend")
    assert {c.backend for c in m.cases} == {"tests.matrix.plugins:NoFp8Backend"}
    assert len(m.cases) == 8 and len(m.skipped) == 8
    assert m.cases[0].repro_command().endswith("--backend tests.matrix.plugins:NoFp8Backend")


def test_per_device_model_and_batches(tmp_path):
    doc = replace(
        "model: {num_heads: 8,",
        "model:\n  gpu: {num_heads: 32, num_kv_heads: 8, head_size: 128, max_model_len: 4096, max_num_seqs: 64}\n  cpu: {num_heads: 8,",
    )
    doc = doc.replace(
        "dec: {decode: 3, seq_len: 40}", "dec:\n    cpu: {decode: 3, seq_len: 40}\n    gpu: {decode: 3, seq_len: 4000}"
    )
    cpu = load_matrix(write(tmp_path, doc), devices="cpu")
    gpu = load_matrix(write(tmp_path, doc), devices="gpu")
    assert (cpu.device_class, gpu.device_class) == ("cpu", "gpu")
    # On a machine without a GPU the gpu class still expands; torch skips as unavailable there.
    gpu_cases = [*gpu.cases, *(s.case for s in gpu.skipped)]
    gpu_dec = next(c for c in gpu_cases if c.case_id == "tp1-NONE-auto-dec-torch-s0")
    assert cpu.find("tp1-NONE-auto-dec-torch-s0").batch.seq_lens == (40, 40, 40)
    assert gpu_dec.batch.seq_lens == (4000, 4000, 4000)
    assert gpu_dec.model.head_size == 128 and cpu.cases[0].model.head_size == 16
    assert sorted(c.case_id for c in cpu.cases) == sorted(c.case_id for c in gpu_cases)


def test_extends_merges_mappings_and_replaces_lists(tmp_path):
    write(tmp_path, BASE, "parent.yaml")
    child = write(
        tmp_path,
        "extends: parent.yaml\ntier: smoke\nmodel: {num_layers: 2}\n"
        "batches: {one: {decode: 1, seq_len: 5}}\naxes: {tp: [1], batch: [one]}\n",
        "child.yaml",
    )
    m = load_matrix(child, devices="cpu")
    assert m.name == "child"  # the parent's name is not inherited
    assert {c.tier for c in m.cases} == {"smoke"}
    assert {c.model.num_layers for c in m.cases} == {2} and {c.model.num_heads for c in m.cases} == {8}
    assert {c.batch.name for c in m.cases} == {"one"} and {c.tp for c in m.cases} == {1}
    assert len(m.cases) == 4  # modes NONE, FULL x kv auto, fp8 inherited from the parent


def test_yaml_anchors_and_merge_keys(tmp_path):
    doc = BASE.replace("batches:\n", "batches:\n  base: &b {decode: 2, seq_len: 9}\n  more: {<<: *b, seq_len: 11}\n")
    doc = doc.replace("batch: [dec, mix]", "batch: [base, more]")
    m = load_matrix(write(tmp_path, doc), devices="cpu")
    assert m.find("tp1-NONE-auto-more-torch-s0").batch.seq_lens == (11, 11)


LISTS = """\
exclude:
  - {tp: [1, 2], cudagraph_mode: FULL, kv_cache_dtype: fp8}
families:
  gqa:
    exclude:
      - {batch: mix, tp: 2, cudagraph_mode: [NONE, FULL]}
"""


def test_list_excludes_and_a_family_blocks_own_excludes(tmp_path):
    m = load_matrix(write(tmp_path, BASE + LISTS), devices="cpu")
    ids = {c.case_id for c in m.cases}
    assert not [i for i in ids if "-FULL-fp8-" in i]  # any of tp 1, 2
    assert not [i for i in ids if i.startswith("tp2-") and "-mix-" in i]  # the family block's entry
    assert len(ids) == 16 - 4 - 3  # FULL-fp8 at tp 1, 2 x 2 batches; then tp 2 mix but its FULL-fp8


def test_a_family_blocks_exclude_cuts_only_its_family(tmp_path):
    doc = (
        BASE.replace("  backend: [torch]\n", "  backend: [torch]\n  attention: [gqa, mla]\n")
        + "families:\n  mla:\n    axes: {batch: [dec]}\n    exclude:\n      - {tp: [1, 2], cudagraph_mode: FULL}\n"
    )
    m = load_matrix(write(tmp_path, doc), devices="cpu")
    assert {c.mode for c in m.cases if c.attention == "mla"} == {"NONE"}
    assert {c.mode for c in m.cases if c.attention == "gqa"} == {"NONE", "FULL"}


FULL_CHILD = """\
extends: {full}
name: mine
axes:
  batch: [decode_7]
  backend: [torch]
  attention: [gqa]
"""


def test_narrowing_an_axis_under_full_drops_its_include_rows_that_no_longer_fit(tmp_path):
    # This failed inside full.yaml ("full.yaml:215: include[0]: adds a new combination but does
    # not say which cudagraph_mode"); the fix, `include: []`, was a comment in smoke.yaml.
    import os

    child = write(tmp_path, FULL_CHILD.format(full=os.path.abspath("matrices/full.yaml")))
    m = load_matrix(child, devices="cpu")
    assert {c.batch.name for c in m.cases} == {"decode_7"} and {c.steps for c in m.cases} == {3}
    # A row that still fits keeps its meaning: decode_3 at tp 1 gets full.yaml's 6 steps.
    child = write(
        tmp_path,
        FULL_CHILD.replace("[decode_7]", "[decode_7, decode_3]").format(full=os.path.abspath("matrices/full.yaml")),
        "fits.yaml",
    )
    steps = {c.case_id: c.steps for c in load_matrix(child, devices="cpu").cases}
    assert steps["tp1-FULL-auto-decode_3-torch-s0"] == 6 and steps["tp1-FULL-auto-decode_7-torch-s0"] == 3


def test_an_inherited_include_row_that_cannot_become_a_case_is_the_users_files_error(tmp_path, capsys):
    from orchestrator.cli import main

    write(tmp_path, BASE + "include:\n  - {tp: 1, batch: dec, steps: 6}\n", "parent.yaml")
    # Every tp 1 dec combination is cut here, so the parent's row would add one with no mode.
    child = write(tmp_path, "name: child\nextends: parent.yaml\nexclude: [{tp: 1, batch: dec}]\n", "child.yaml")
    assert main(["plan", child, "--devices", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"orch: {child}:2: include[0] (inherited from {tmp_path / 'parent.yaml'}:15) adds a new combination "
        "but does not say which cudagraph_mode (axis has NONE, FULL); this file narrows the axes it "
        "extends: `include: []` here drops the inherited include rows"
    ), err
    write(tmp_path, "name: child\nextends: parent.yaml\nexclude: [{tp: 1, batch: dec}]\ninclude: []\n", "child.yaml")
    assert main(["plan", child, "--devices", "cpu"]) == 0
