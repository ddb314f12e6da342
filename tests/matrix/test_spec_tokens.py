"""The spec_tokens axis (k speculative tokens): ids, verify batches, filters, include/exclude/
constraints, the per-combination fit check, plan output, and the shipped tiers."""

from __future__ import annotations

import json

import pytest

from backend.case import BatchSpec, Case
from orchestrator.cli import main
from orchestrator.errors import InputError
from orchestrator.filters import select
from orchestrator.matrix import load_matrix, spec_reason
from tests.matrix.helpers import BASE, assert_plan_names_the_marked_line, marked_line, replace, write

K_AXIS = replace("  backend: [torch]", "  backend: [torch]\n  spec_tokens: [0, 2]")


def test_k0_ids_unchanged_and_k_after_the_kv_dtype(tmp_path):
    m = load_matrix(write(tmp_path, K_AXIS), devices="cpu")
    ids = [c.case_id for c in m.cases]
    base = [c.case_id for c in load_matrix(write(tmp_path, BASE, "b.yaml"), devices="cpu").cases]
    assert [i for i in ids if "-k" not in i] == base  # the k = 0 cases are exactly the old ones
    assert "tp1-FULL-auto-k2-dec-torch-s0" in ids
    assert "tp1-FULL-auto-k0-dec-torch-s0" not in ids
    assert len(ids) == 2 * len(base) and len(set(ids)) == len(ids)


@pytest.mark.parametrize(
    "query_lens,seq_lens,k,expected",
    [
        ((1, 1, 1), (40, 40, 40), 0, (1, 1, 1)),
        ((1, 1, 1), (40, 40, 40), 2, (3, 3, 3)),
        ((1, 1, 5), (30, 30, 20), 3, (4, 4, 5)),  # prefill rows stay
        ((7, 9), (7, 40), 4, (7, 9)),  # no decode rows: nothing to verify
    ],
)
def test_verify_batch(query_lens, seq_lens, k, expected):
    b = BatchSpec("b", query_lens, seq_lens)
    v = b.verify(k)
    assert v.query_lens == expected and v.seq_lens == seq_lens and v.name == "b"
    assert (v is b) == (k == 0)


def test_case_round_trips_k_and_old_dicts_default_to_0(tmp_path):
    case = next(c for c in load_matrix(write(tmp_path, K_AXIS), devices="cpu").cases if c.spec_tokens)
    assert Case.from_dict(json.loads(json.dumps(case.to_dict()))) == case
    assert case.axes["spec_tokens"] == 2 and case.verify_batch.query_lens == (3, 3, 3)
    old = case.to_dict()
    del old["spec_tokens"]  # a store row written before the axis existed
    assert Case.from_dict(old).spec_tokens == 0


@pytest.mark.parametrize(
    "expr,count",
    [
        ("spec_tokens=2", 16),
        ("k=2", 16),
        ("k=0", 16),
        ("k=0,2", 32),
        ("k=02", 16),
        ("k=2 tp=1 mode=FULL", 4),
        ("-k2-", 16),
        ("k=3", 0),
    ],
)
def test_filter_on_k(tmp_path, expr, count):
    m = load_matrix(write(tmp_path, K_AXIS), devices="cpu")
    assert len(select(m.cases, expr)) == count


def test_filter_rejects_non_integer_k(capsys, tmp_path):
    assert main(["plan", write(tmp_path, K_AXIS), "--devices", "cpu", "--filter", "k=two"]) == 2
    assert "spec_tokens must be a non-negative integer" in capsys.readouterr().err


def test_include_exclude_constraints_on_k(tmp_path):
    doc = BASE + (
        "exclude:\n  - {spec_tokens: 0, batch: mix}\n"
        "include:\n  - {spec_tokens: 3, tp: 1, cudagraph_mode: FULL, kv_cache_dtype: auto, batch: dec}\n"
        "constraints:\n  - when: {spec_tokens: 3}\n    reason: k 3 parked\n"
    )
    m = load_matrix(write(tmp_path, doc), devices="cpu")
    ids = [c.case_id for c in m.cases]
    assert not any("-mix-" in i for i in ids)  # exclude matched k = 0 (every product case)
    assert [s.case.case_id for s in m.skipped] == ["tp1-FULL-auto-k3-dec-torch-s0"]
    assert m.skipped[0].reason == "k 3 parked"


def test_exclude_can_drop_a_k_that_would_not_fit(tmp_path):
    doc = replace("mix: {decode: 2, seq_len: 30,", "mix: {decode: 2, seq_len: 3,")
    doc = replace("  backend: [torch]", "  backend: [torch]\n  spec_tokens: [0, 4]", doc)
    with pytest.raises(InputError, match="spec_tokens 4 with batch 'mix'"):
        load_matrix(write(tmp_path, doc), devices="cpu")
    m = load_matrix(write(tmp_path, doc + "exclude:\n  - {spec_tokens: 4, batch: mix}\n", "x.yaml"), devices="cpu")
    assert {c.spec_tokens for c in m.cases if c.batch.name == "mix"} == {0}


BROKEN = [
    (
        "negative k",
        replace("  backend: [torch]", "  backend: [torch]\n  spec_tokens: [0, -1]  #!"),
        "greater than or equal to 0",
    ),
    ("k not an int", replace("  backend: [torch]", "  backend: [torch]\n  spec_tokens: [0, two]  #!"), "valid integer"),
    ("k a bool", replace("  backend: [torch]", "  backend: [torch]\n  spec_tokens: [true]  #!"), "valid integer"),
    ("k a float", replace("  backend: [torch]", "  backend: [torch]\n  spec_tokens: [1.5]  #!"), "valid integer"),
    (
        "k beyond the typo guard",
        replace("  backend: [torch]", "  backend: [torch]\n  spec_tokens: [65]  #!"),
        "less than or equal to 64",
    ),
    (
        "duplicate k",
        replace("  backend: [torch]", "  backend: [torch]\n  spec_tokens: [2, 2]  #!"),
        "duplicate value 2",
    ),
    (
        "k beyond a decode row's seq_len",
        replace("  backend: [torch]", "  backend: [torch]\n  spec_tokens: [0, 40]  #!"),
        "spec_tokens 40 with batch 'dec': decode row 0 has seq_len 40 < 1 + k = 41",
    ),
    (
        "k beyond max_model_len",
        replace("max_model_len: 256", "max_model_len: 32")
        .replace("seq_len: 40", "seq_len: 30")
        .replace("  backend: [torch]", "  backend: [torch]\n  spec_tokens: [0, 32]  #!"),
        "verify rows of 1 + k = 33 tokens exceed model max_model_len 32",
    ),
    (
        "k in an include that does not fit",
        BASE + "include:\n  - {spec_tokens: 50, tp: 1, cudagraph_mode: FULL, kv_cache_dtype: auto, batch: dec}  #!\n",
        "include[0].spec_tokens: spec_tokens 50 with batch 'dec'",
    ),
    ("k in an exclude that is negative", BASE + "exclude:\n  - {spec_tokens: -2}  #!\n", "exclude[0].spec_tokens"),
]


@pytest.mark.parametrize("doc,needle", [pytest.param(d, n, id=s) for s, d, n in BROKEN])
def test_bad_k_exits_2_with_file_and_line(tmp_path, capsys, doc, needle):
    assert_plan_names_the_marked_line(tmp_path, capsys, doc, needle)


def test_token_budget_uses_the_verify_query_lens():
    from dataclasses import dataclass

    from backend.case import ModelShape

    # The capture helper adds max_num_batched_tokens to ModelShape; until then a subclass stands in.
    @dataclass(frozen=True)
    class Budget(ModelShape):
        max_num_batched_tokens: int = 8

    batch = BatchSpec("dec", (1, 1, 1), (40, 40, 40))
    assert spec_reason(batch, 1, Budget()) is None  # 6 tokens
    assert "9 tokens with verify rows exceed model max_num_batched_tokens 8" in spec_reason(batch, 2, Budget())
    assert spec_reason(batch, 2, ModelShape()) is None  # no budget: unlimited


def test_plan_shows_k_and_the_resolved_mode(tmp_path, capsys):
    path = write(tmp_path, K_AXIS)
    assert main(["plan", path, "--devices", "cpu", "--json", "--filter", "tp=1 mode=FULL batch=dec"]) == 0
    plan = json.loads(capsys.readouterr().out)
    rows = {c["id"]: c for c in plan["cases"]}
    assert set(rows) == {
        "tp1-FULL-auto-dec-torch-s0",
        "tp1-FULL-auto-k2-dec-torch-s0",
        "tp1-FULL-fp8-dec-torch-s0",
        "tp1-FULL-fp8-k2-dec-torch-s0",
    }
    assert rows["tp1-FULL-auto-dec-torch-s0"]["resolved_mode"] == "FULL"
    assert rows["tp1-FULL-auto-k2-dec-torch-s0"]["spec_tokens"] == 2
    assert rows["tp1-FULL-auto-k2-dec-torch-s0"]["resolved_mode"]  # from backend/harness/modes.py, given k
    assert plan["counts"]["spec_tokens"] == {"0": 2, "2": 2}
    assert main(["plan", path, "--devices", "cpu", "--filter", "k=2 tp=1 mode=FULL batch=dec", "-v"]) == 0
    text = capsys.readouterr().out
    assert "tp1-FULL-auto-k2-dec-torch-s0" in text and "resolved mode" in text


@pytest.fixture(scope="module")
def full_cpu():
    return load_matrix("matrices/full.yaml", devices="cpu")


def test_full_has_k_in_every_mode_for_both_cpu_providers(full_cpu):
    spec = [c for c in full_cpu.cases if c.spec_tokens and c.attention == "gqa"]
    modes = {"NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}
    for backend in ("torch", "aiter-emulated"):
        for tp in (1, 2):
            got = {c.mode for c in spec if c.backend == backend and c.tp == tp}
            assert got == modes, (backend, tp, got)
    kinds = {c.batch.kind for c in spec}
    assert kinds == {"decode", "mixed"}
    # padded (21 tokens) and a capture size on GPU; the CPU run grows by a tenth, not double
    assert {c.verify_batch.num_tokens for c in spec} == {21, 192, 23}
    assert len(spec) <= len([c for c in full_cpu.cases if c.attention == "gqa"]) // 10


def test_nightly_sweeps_k_1_to_4():
    nightly = load_matrix("matrices/nightly.yaml", devices="cpu")
    assert {c.spec_tokens for c in nightly.cases} == {0, 1, 2, 3, 4}
    assert {c.tp for c in nightly.cases if c.spec_tokens} == {1, 2}


def test_k_that_fits_only_one_device_class_is_an_error_on_both(tmp_path):
    doc = replace(
        "dec: {decode: 3, seq_len: 40}", "dec:\n    cpu: {decode: 3, seq_len: 40}\n    gpu: {decode: 3, seq_len: 2}"
    )
    doc = replace("  backend: [torch]", "  backend: [torch]\n  spec_tokens: [0, 2]  #!", doc)
    path = write(tmp_path, doc)
    for devices in ("cpu", "gpu"):
        with pytest.raises(InputError, match="decode row 0 has seq_len 2 < 1 \\+ k = 3") as e:
            load_matrix(path, devices=devices)
        assert e.value.line == marked_line(doc)


# Capture sizes per case k: `default` is vLLM's grid for that k, computed torch-free at
# expansion; a written list is kept; both are rounded only at resolution (backend/harness/modes.py).
DEFAULT_K = replace(
    "capture_sizes: [1, 2, 4, 8, 16, 32]",
    "capture_sizes: default",
    replace("max_num_seqs: 16}", "max_num_seqs: 4}", K_AXIS),
)


@pytest.mark.parametrize("backend_checks", [True, False])
def test_default_capture_sizes_follow_each_case_k(tmp_path, backend_checks):
    from backend.harness.modes import vllm_capture_sizes

    m = load_matrix(write(tmp_path, DEFAULT_K), devices="cpu", backend_checks=backend_checks)
    by_k = {c.spec_tokens: c.capture_sizes for c in m.cases}
    # max_num_seqs 4, budget 4 * 256: k = 0 up to 8, k = 2 up to 2 * 4 * 3 = 24
    assert by_k[0] == (1, 2, 4, 8) == vllm_capture_sizes(4, 1024, 0, limit=512)
    assert by_k[2] == (1, 2, 4, 8, 16, 24) == vllm_capture_sizes(4, 1024, 2, limit=512)
    written = load_matrix(write(tmp_path, K_AXIS, "w.yaml"), devices="cpu")
    assert {c.capture_sizes for c in written.cases} == {(1, 2, 4, 8, 16, 32)}, "a written list is kept for every k"


def test_default_capture_sizes_stay_torch_free(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; from orchestrator.matrix import load_matrix; "
        f"m = load_matrix({write(tmp_path, DEFAULT_K)!r}, devices='cpu', backend_checks=False); "
        "assert max(c.capture_sizes for c in m.cases if c.spec_tokens) == (1, 2, 4, 8, 16, 24); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def _plan(capsys, *args) -> dict:
    assert (
        main(["plan", "matrices/full.yaml", "--devices", "cpu", "--json", "--filter", "k=2 attention=gqa", *args]) == 0
    )
    return json.loads(capsys.readouterr().out)


MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
# (backend, requested) -> resolved for full.yaml's k = 2 cases on CPU (vLLM's rules in
# backend/harness/modes.py): torch ALWAYS keeps every mode; aiter-emulated UNIFORM_BATCH keeps its FULL
# decode graphs for the verify batches, only mixed FULL drops to FULL_AND_PIECEWISE.
PLAN_K2 = {("torch", m): m for m in MODES} | {("aiter-emulated", m): m for m in MODES}
PLAN_K2[("aiter-emulated", "FULL")] = "FULL_AND_PIECEWISE"


def test_plan_full_yaml_shows_k_cases_in_every_mode_resolved(capsys):
    plan = _plan(capsys)
    rows = plan["cases"]
    assert rows and all(r["spec_tokens"] == 2 and "-k2-" in r["id"] for r in rows)
    got = {(r["backend"], r["cudagraph_mode"]): set() for r in rows}
    for r in rows:
        got[(r["backend"], r["cudagraph_mode"])].add(r["resolved_mode"])
        assert bool(r["mode_note"]) == (r["resolved_mode"] != r["cudagraph_mode"]), r
        assert r["capture_sizes"] == [1, 2, 4, 8, 16, 32, 64, 128, 256], "CPU style v2: sizes as written"
    assert got == {key: {want} for key, want in PLAN_K2.items()}
    note = next(r["mode_note"] for r in rows if r["backend"] == "aiter-emulated" and r["cudagraph_mode"] == "FULL")
    assert "support: UNIFORM_BATCH" in note and "FULL_AND_PIECEWISE" in note


def test_plan_shows_the_spec_decode_downgrade_of_a_single_token_backend(capsys):
    # The #25104 support level (UNIFORM_SINGLE_TOKEN_DECODE): with k > 0 no FULL decode graph.
    plan = _plan(capsys, "--backend", "tests.mutants.seed_aiter_fa:FixedBackend")
    by_mode = {}
    for r in plan["cases"]:
        by_mode.setdefault(r["cudagraph_mode"], set()).add((r["resolved_mode"], bool(r["mode_note"])))
    assert by_mode == {
        "NONE": {("NONE", False)},
        "PIECEWISE": {("PIECEWISE", False)},
        "FULL": {("PIECEWISE", True)},
        "FULL_DECODE_ONLY": {("PIECEWISE", True)},
        "FULL_AND_PIECEWISE": {("PIECEWISE", True)},
    }
    note = next(r["mode_note"] for r in plan["cases"] if r["cudagraph_mode"] == "FULL_DECODE_ONLY")
    assert note == (
        "CUDAGraphMode.FULL_DECODE_ONLY is not supported with spec-decode for attention backend "
        "FixedBackend (support: AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); "
        "setting cudagraph_mode=PIECEWISE"
    )


def test_plan_shows_v1_rounding_of_the_sizes(tmp_path, capsys):
    doc = replace("max_num_seqs: 16}", "max_num_seqs: 16, capture_style: v1}", K_AXIS)
    doc = replace("cudagraph_mode: [NONE, FULL]", "cudagraph_mode: [NONE, FULL, FULL_DECODE_ONLY]", doc)
    path = write(tmp_path, doc)
    assert main(["plan", path, "--devices", "cpu", "--json", "--filter", "tp=1 kv_cache_dtype=auto batch=dec"]) == 0
    rows = {(c["spec_tokens"], c["cudagraph_mode"]): c for c in json.loads(capsys.readouterr().out)["cases"]}
    # 1, 2 -> 3; 4 -> 6; 8 -> 9; 16 -> 18; 32 -> 33 > 32: dropped
    for mode in ("FULL_DECODE_ONLY", "FULL"):
        assert rows[(2, mode)]["capture_sizes"] == [3, 6, 9, 18], mode
        assert "rounded to multiples of 3" in rows[(2, mode)]["mode_note"]
    for key in ((0, "FULL_DECODE_ONLY"), (2, "NONE"), (0, "FULL")):
        assert rows[key]["capture_sizes"] == [1, 2, 4, 8, 16, 32] and rows[key]["mode_note"] == "", key
