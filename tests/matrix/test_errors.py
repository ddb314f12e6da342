"""Broken matrices: every one exits 2 with one line `orch: FILE:LINE: what is wrong`."""

from __future__ import annotations

import pytest

from orchestrator.cli import main
from orchestrator.errors import InputError
from orchestrator.matrix import load_matrix
from tests.matrix.helpers import BASE, assert_plan_names_the_marked_line, marked_line, replace, write

# (scenario, document with the offending line marked `#!`, words the message must contain)
BROKEN = [
    (
        "unknown mode",
        replace("cudagraph_mode: [NONE, FULL]", "cudagraph_mode: [NONE, FULLL]  #!"),
        "'FULLL' is not a valid cudagraph_mode",
    ),
    ("tp=3 with 8 heads", replace("tp: [1, 2]", "tp: [1, 3]  #!"), "3 is not a valid tp"),
    ("yaml syntax error", replace("tp: [1, 2]", "tp: [1, 2]]  #!"), "YAML syntax error"),
    ("yaml tab indent", replace("  tp: [1, 2]", "\ttp: [1, 2]  #!"), "YAML syntax error"),
    ("missing batch spec", replace("batch: [dec, mix]", "batch: [dec, nope]  #!"), "no batch spec named 'nope'"),
    ("unknown top-level key", BASE + "colour: red  #!\n", "unknown key 'colour'"),
    ("known-failures file missing", BASE + "known_failures: nope.yaml  #!\n", "known_failures: no such file"),
    (
        "unknown batch key",
        replace("dec: {decode: 3, seq_len: 40}", "dec: {decode: 3, seq_len: 40, colour: 1}  #!"),
        "unknown key 'colour'",
    ),
    ("unknown model key", replace("num_layers: 1,", "num_layers: 1, layers: 2,  #!"), "unknown key 'layers'"),
    ("wrong type", replace("head_size: 16", "head_size: sixteen  #!"), "valid integer"),
    ("bool is not an int", replace("tp: [1, 2]", "tp: [1, true]  #!"), "valid integer"),
    ("string number is not an int", replace("seq_len: 40", "seq_len: '40'  #!"), "batches.dec.seq_len"),
    ("empty axis", replace("backend: [torch]", "backend: []  #!"), "at least 1 item"),
    ("exclude empties the product", BASE + "exclude: [{tp: 1}, {tp: 2}]  #!\n", "product is empty"),
    ("seq_len < query_len", replace("prefill: [[5, 20]]", "prefill: [[25, 20]]  #!"), "seq_len 20 < query_len 25"),
    ("seq_len > max_model_len", replace("seq_len: 40}", "seq_len: 400}  #!"), "exceeds model max_model_len 256"),
    (
        "query_len 0",
        replace("dec: {decode: 3, seq_len: 40}", "dec: {query_lens: [1, 0], seq_lens: [4, 4]}  #!"),
        "query_len 0 must be >= 1",
    ),
    (
        "batch needs more KV blocks than num_blocks",
        replace("max_num_seqs: 16}", "max_num_seqs: 16, num_blocks: 5}").replace(
            "dec: {decode: 3, seq_len: 40}", "dec: {decode: 3, seq_len: 40}  #!"
        ),
        "needs 9 KV-cache blocks of 16 tokens; model num_blocks 5 leaves 4",
    ),
    (
        "too many requests",
        replace("decode: 3, seq_len: 40", "decode: 17, seq_len: 40  #!"),
        "17 requests exceed model max_num_seqs 16",
    ),
    (
        "query/seq lens differ in length",
        replace("dec: {decode: 3, seq_len: 40}", "dec: {query_lens: [1, 1], seq_lens: [4]}  #!"),
        "query_lens has 2 entries but seq_lens has 1",
    ),
    (
        "decode without seq_len",
        replace("dec: {decode: 3, seq_len: 40}", "dec: {decode: 3}  #!"),
        "decode rows need seq_len",
    ),
    ("steps below 3", BASE + "steps: 2  #!\n", "greater than or equal to 3"),
    ("unknown tolerance dtype", BASE + "tolerances: {bf16: {atol: 1, rtol: 1}}  #!\n", "tolerances"),
    ("nan tolerance", BASE + "tolerances: {fp8: {atol: .nan, rtol: 1}}  #!\n", "tolerances.fp8.atol"),
    ("unknown backend", replace("backend: [torch]", "backend: [torch, nosuch]  #!"), "unknown backend 'nosuch'"),
    ("bad import path", replace("backend: [torch]", "backend: [tests.matrix.no_such_module:X]  #!"), "cannot import"),
    (
        "import path to a non-class",
        replace("backend: [torch]", "backend: ['tests.matrix.plugins:NOT_A_CLASS']  #!"),
        "not an AttentionBackend",
    ),
    (
        "heads not multiple of kv heads",
        replace("num_kv_heads: 2", "num_kv_heads: 3  #!"),
        "not a multiple of num_kv_heads 3",
    ),
    (
        "nothing runnable: tp vs heads",
        replace("tp: [1, 2]", "tp: [4, 8]  #!").replace(
            "num_heads: 8, num_kv_heads: 2", "num_heads: 2, num_kv_heads: 2"
        ),
        "nothing runnable for gqa: tp 4 > num_heads 2",
    ),
    ("duplicate key", replace("  tp: [1, 2]", "  tp: [1, 2]\n  tp: [1]  #!"), "duplicate key 'tp'"),
    ("duplicate axis value", replace("tp: [1, 2]", "tp: [1, 2, 1]  #!"), "duplicate value 1"),
    ("include lacks an axis", BASE + "include:\n  - {tp: 4}  #!\n", "does not say which cudagraph_mode"),
    (
        "include adds the same case twice",
        BASE + "include:\n  - {tp: 4, cudagraph_mode: FULL, kv_cache_dtype: auto, batch: dec}\n"
        "  - {tp: 4, cudagraph_mode: FULL, kv_cache_dtype: auto, batch: dec}  #!\n",
        "duplicate case id tp4-FULL-auto-dec-torch-s0",
    ),
    (
        "exclude with unknown mode",
        BASE + "exclude:\n  - {cudagraph_mode: FAST}  #!\n",
        "'FAST' is not a valid cudagraph_mode",
    ),
    ("exclude names missing batch", BASE + "exclude:\n  - {batch: nope}  #!\n", "no batch spec named 'nope'"),
    ("empty exclude entry", BASE + "exclude:\n  - {}  #!\n", "empty entry"),
    ("constraint without reason", BASE + "constraints:\n  - when: {tp: 2}  #!\n", "missing required key 'reason'"),
    (
        "capture sizes duplicated",
        replace("capture_sizes: [1, 2, 4, 8, 16, 32]", "capture_sizes: [1, 2, 2]  #!"),
        "duplicate capture sizes",
    ),
    (
        "capture size zero",
        replace("capture_sizes: [1, 2, 4, 8, 16, 32]", "capture_sizes: [0, 2]  #!"),
        "capture_sizes[0]",
    ),
    ("bad tier", BASE + "tier: weekly  #!\n", "tier"),
    ("top level is a list", "- a  #!\n- b\n", "must be a mapping"),
    ("python tag", BASE + "description: !!python/object:os.system x  #!\n", "could not determine a constructor"),
    ("bad timestamp", BASE + "description: 2020-13-45  #!\n", "bad value"),
    (
        "per-device variant broken for the other class",
        replace(
            "model: {num_heads: 8,",
            "model:\n  gpu: {num_heads: 0, num_kv_heads: 1, head_size: 8, max_model_len: 64, max_num_seqs: 4}  #!\n  cpu: {num_heads: 8,",
        ).replace("\n        num_layers", "\n        num_layers"),
        "model.num_heads",
    ),
]


@pytest.mark.parametrize("doc,needle", [pytest.param(d, n, id=s) for s, d, n in BROKEN])
def test_broken_matrix_exits_2_with_file_and_line(tmp_path, capsys, doc, needle):
    assert_plan_names_the_marked_line(tmp_path, capsys, doc, needle)


# An unknown key near a real one gets difflib's suggestion from the keys allowed where it stands
# (a misspelt axis was "unknown key" alone); a key near none gets no guess.
SUGGESTIONS = {
    "misspelt axis": (
        replace("  kv_cache_dtype: [auto, fp8]", "  kv_cache_dtypes: [auto, fp8]  #!"),
        "axes: unknown key 'kv_cache_dtypes' (did you mean 'kv_cache_dtype'?)",
    ),
    "misspelt model field": (
        replace("num_layers: 1,", "num_layer: 1,  #!"),
        "model: unknown key 'num_layer' (did you mean 'num_layers'?)",
    ),
    "misspelt top-level key": (
        BASE.replace("axes:", "axis:  #!"),
        "unknown key 'axis' (did you mean 'axes'?) (+1 more)",
    ),
    "misspelt key in an exclude entry": (
        BASE + "exclude:\n  - {bacend: torch}  #!\n",
        "exclude[0]: unknown key 'bacend' (did you mean 'backend'?)",
    ),
    "nothing close": (BASE + "colour: red  #!\n", "unknown key 'colour'"),
}


@pytest.mark.parametrize("scenario", SUGGESTIONS)
def test_an_unknown_key_names_the_closest_allowed_one(tmp_path, capsys, scenario):
    doc, message = SUGGESTIONS[scenario]
    path = write(tmp_path, doc)
    assert main(["plan", path, "--devices", "cpu"]) == 2
    line = capsys.readouterr().err.strip()
    assert line == f"orch: {path}:{marked_line(doc)}: {message}", line


def test_oversized_product(tmp_path, capsys):
    seeds = ", ".join(str(i) for i in range(10000))
    doc = replace("  backend: [torch]", f"  backend: [torch]\n  seed: [{seeds}]")
    doc = doc.replace("[NONE, FULL]", "[NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE]")
    assert main(["plan", write(tmp_path, doc), "--devices", "cpu"]) == 2
    assert ":8: axes: the product has 400000 combinations (limit 200000)" in capsys.readouterr().err


def test_empty_file(tmp_path, capsys):
    path = write(tmp_path, "")
    assert main(["plan", path]) == 2
    assert f"{path}:1: empty document" in capsys.readouterr().err


def test_missing_file(tmp_path, capsys):
    path = str(tmp_path / "absent.yaml")
    assert main(["plan", path]) == 2
    assert capsys.readouterr().err.strip() == f"orch: {path}: no such matrix file"


def test_unterminated_quote_points_into_the_file(tmp_path, capsys):
    path = write(tmp_path, BASE + "description: 'oops\n")
    assert main(["plan", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"orch: {path}:") and "YAML syntax error" in err


def test_errors_in_parent_name_the_parent_file_and_line(tmp_path, capsys):
    parent = write(tmp_path, replace("head_size: 16", "head_size: -1  #!"), "parent.yaml")
    child = write(tmp_path, "extends: parent.yaml\nname: child\n", "child.yaml")
    assert main(["plan", child]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"orch: {parent}:{marked_line(replace('head_size: 16', 'head_size: -1  #!'))}: model.head_size"
    ), err


@pytest.mark.parametrize(
    "doc,needle",
    [
        ("extends: nothere.yaml\n", "no such file"),
        ("extends: m.yaml\n", "cycle"),
        ("extends: [a, b]\n", "expected a file name"),
        ('extends: "a\\0b"\n', "expected a file name"),  # NUL in a path: os functions would raise
    ],
)
def test_bad_extends(tmp_path, capsys, doc, needle):
    path = write(tmp_path, doc)
    assert main(["plan", path]) == 2
    err = capsys.readouterr().err
    assert f"{path}:1: " in err and needle in err


def test_missing_device_variant_only_fails_for_that_class(tmp_path):
    doc = replace("model: {num_heads: 8,", "model:\n  cpu: {num_heads: 8,").replace(
        "max_num_seqs: 16}", "max_num_seqs: 16}  #!", 1
    )
    path = write(tmp_path, doc)
    assert len(load_matrix(path, devices="cpu").cases) > 0
    with pytest.raises(InputError, match="no 'gpu' variant") as e:
        load_matrix(path, devices="gpu")
    assert e.value.source == path and e.value.line == 2


def test_bad_backend_override_names_the_option(tmp_path):
    path = write(tmp_path, BASE)
    with pytest.raises(InputError) as e:
        load_matrix(path, devices="cpu", backend_override="tests.matrix.no_such_module:X")
    assert e.value.one_line().startswith("--backend: cannot import")


def test_bad_devices_value(tmp_path):
    with pytest.raises(InputError, match="--devices"):
        load_matrix(write(tmp_path, BASE), devices="tpu")


def test_bad_filter_key_exits_2(tmp_path, capsys):
    path = write(tmp_path, BASE)
    assert main(["plan", path, "--devices", "cpu", "--filter", "colour=red"]) == 2
    assert capsys.readouterr().err.strip().startswith("orch: --filter: unknown filter key 'colour'")
