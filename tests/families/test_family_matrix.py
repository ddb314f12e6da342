"""The attention axis in matrix files: families.<name> blocks, per-family shapes, ids, skips, and
bad input (one line naming file and field, exit 2)."""

from __future__ import annotations

import pytest

from orchestrator.cli import main
from orchestrator.matrix import load_matrix
from tests.matrix.helpers import BASE, assert_plan_names_the_marked_line, replace, write

MLA = replace("  backend: [torch]", "  backend: [torch]\n  attention: [gqa, mla]")
SWA = replace("  backend: [torch]", "  backend: [torch]\n  attention: [gqa, swa_sinks]")
GDN = replace("  backend: [torch]", "  backend: [torch]\n  attention: [gqa, hybrid_gdn]")

# (scenario, document with the offending line marked `#!`, words the message must contain)
BROKEN = [
    (
        "unknown family",
        replace("  backend: [torch]", "  backend: [torch]\n  attention: [gqa, mlaa]  #!"),
        "unknown attention family 'mlaa': did you mean 'mla'?",
    ),
    (
        "family block for an unknown family",
        BASE + "families:\n  mlaa: {}  #!\n",
        "unknown attention family 'mlaa': did you mean 'mla'?",
    ),
    (
        "unknown key in a family's model",
        MLA + "families:\n  mla:\n    model: {kv_lora_rnak: 32}  #!\n",
        "unknown key 'kv_lora_rnak' for a mla model (did you mean 'kv_lora_rank'?)",
    ),
    (
        "a derived field given",
        MLA + "families:\n  mla:\n    model: {head_size: 576}  #!\n",
        "head_size is derived for the mla family",
    ),
    (
        "a dim out of range",
        MLA + "families:\n  mla:\n    model: {kv_lora_rank: 0}  #!\n",
        "kv_lora_rank 0 is outside [1, 4096]",
    ),
    (
        "a generic field wrong in a family's model",
        MLA + "families:\n  mla:\n    model: {num_heads: 0}  #!\n",
        "num_heads",
    ),
    (
        "no backend implements a family",
        MLA + "families:\n  mla:\n    axes: {backend: [aiter-triton-pa]}  #!\n",
        "no backend here implements the mla attention family",
    ),
    (
        "sinks with a provider that has none",
        SWA + "families:\n  swa_sinks:\n    axes: {backend: [torch, 'tests.matrix.plugins:NoSinksBackend']}  #!\n",
        "tests.matrix.plugins:NoSinksBackend has no sinks, which the swa_sinks model asks for",
    ),
    (
        "a window larger than max_model_len",
        SWA + "families:\n  swa_sinks:\n    model: {sliding_window: 300}  #!\n",
        "sliding_window 300 must be below max_model_len 256",
    ),
    (
        "a group layout that does not fit the model",
        SWA + "families:\n  swa_sinks:\n    model: {layer_pattern: full, kv_groups: hybrid}  #!\n",
        "kv_groups hybrid needs layers of both kinds",
    ),
    (
        "alternating layers need four",
        SWA + "families:\n  swa_sinks:\n    model: {num_layers: 2}  #!\n",
        "layer_pattern alternate needs num_layers >= 4",
    ),
    (
        "heads not divisible by any tp",
        MLA + "families:\n  mla:\n    model: {num_heads: 3}\n    axes: {tp: [2]}  #!\n",
        "nothing runnable for mla: num_heads 3 not divisible by tp 2",
    ),
    (
        "an unknown state dtype",
        GDN + "families:\n  hybrid_gdn:\n    model: {state_dtype: float16}  #!\n",
        "state_dtype 'float16' is not one of float32, bfloat16, mixed",
    ),
    (
        "value heads that key heads do not divide",
        GDN + "families:\n  hybrid_gdn:\n    model: {num_k_heads: 3}  #!\n",
        "(the GDN value heads) is not a multiple of num_k_heads 3",
    ),
    (
        "no attention layer",
        GDN + "families:\n  hybrid_gdn:\n    model: {num_layers: 3}  #!\n",
        "num_layers 3 < full_attention_interval 4: no attention layer",
    ),
]


@pytest.mark.parametrize("doc,needle", [pytest.param(d, n, id=s) for s, d, n in BROKEN])
def test_broken_family_matrix_exits_2_with_file_and_line(tmp_path, capsys, doc, needle):
    assert_plan_names_the_marked_line(tmp_path, capsys, doc, needle)


def test_backend_override_that_implements_no_family_of_the_matrix(tmp_path, capsys):
    # A --backend's missing family is its cases' skip reason, as a plugin's always was (it was
    # exit 2 for a builtin); and a run of nothing but those skips fails its gate.
    path = write(tmp_path, replace("  backend: [torch]", "  backend: [torch]\n  attention: [mla]"))
    m = load_matrix(path, devices="cpu", backend_override="aiter-triton-pa")
    assert not m.cases and {s.reason for s in m.skipped} == {
        "unsupported: aiter-triton-pa does not implement the mla attention family (it implements gqa)"
    }
    assert main(["run", path, "--devices", "cpu", "--backend", "aiter-triton-pa", "--no-progress"]) == 1
    assert (
        "gate FAILED: nothing ran: 16 skipped (unsupported: aiter-triton-pa does not implement the mla"
        in capsys.readouterr().out
    )


def test_the_family_axis_keeps_every_gqa_id(tmp_path):
    """Adding attention: [gqa, mla] adds mla-prefixed cases and leaves the gqa ones as they were."""
    plain = load_matrix(write(tmp_path, BASE, "a.yaml"), devices="cpu")
    both = load_matrix(write(tmp_path, MLA, "b.yaml"), devices="cpu")
    gqa = [c.case_id for c in both.cases if c.attention == "gqa"]
    assert gqa == [c.case_id for c in plain.cases]
    mla = [c.case_id for c in both.cases if c.attention == "mla"]
    assert mla and all(i.startswith("mla-tp") for i in mla)
    assert len(mla) == len(gqa)


def test_a_familys_model_is_its_defaults_over_the_generic_fields(tmp_path):
    doc = MLA + "families:\n  mla:\n    model: {num_heads: 4, v_head_dim: 8}\n"
    m = load_matrix(write(tmp_path, doc), devices="cpu")
    mla = next(c.model for c in m.cases if c.attention == "mla")
    gqa = next(c.model for c in m.cases if c.attention == "gqa")
    assert mla.num_heads == 4 and mla.dim("v_head_dim") == 8  # the block
    assert mla.dim("kv_lora_rank") == 32 and mla.dim("qk_rope_head_dim") == 16  # the CPU defaults
    assert (mla.num_kv_heads, mla.head_size) == (1, 48)  # derived: one latent row of L + R
    assert mla.block_size == gqa.block_size  # generic: inherited
    assert (mla.max_model_len, gqa.max_model_len) == (128, 256)  # the family's CPU default over the generic
    narrowed = load_matrix(
        write(tmp_path, MLA + "families:\n  mla:\n    model: {max_model_len: 96}\n", "n.yaml"), devices="cpu"
    )
    assert next(c.model for c in narrowed.cases if c.attention == "mla").max_model_len == 96  # the block over both
    gpu = load_matrix(write(tmp_path, MLA, "g.yaml"), devices="gpu")  # no GPU here: skipped, still built
    cases = [*gpu.cases, *(s.case for s in gpu.skipped)]
    assert next(c.model for c in cases if c.attention == "mla").dims == (
        ("kv_lora_rank", 512),
        ("qk_nope_head_dim", 128),
        ("qk_rope_head_dim", 64),
        ("v_head_dim", 128),
    )


def test_a_provider_without_the_family_is_skipped_with_the_reason(tmp_path):
    doc = MLA.replace("backend: [torch]", "backend: [torch, aiter-triton-pa]")
    m = load_matrix(write(tmp_path, doc), devices="cpu")
    skipped = [s for s in m.skipped if s.case.attention == "mla" and s.case.backend == "aiter-triton-pa"]
    assert skipped and all(
        "does not implement the mla attention family (it implements gqa)" in s.reason for s in skipped
    )


def test_family_axes_replace_the_matrix_axes_for_that_family(tmp_path):
    doc = MLA + "families:\n  mla:\n    axes: {tp: [1], batch: [dec], kv_cache_dtype: [auto]}\n"
    m = load_matrix(write(tmp_path, doc), devices="cpu")
    mla = [c for c in m.cases if c.attention == "mla"]
    assert {c.tp for c in mla} == {1} and {c.batch.name for c in mla} == {"dec"} and len(mla) == 2
    assert {c.tp for c in m.cases if c.attention == "gqa"} == {1, 2}


def test_full_yaml_plans_mla_with_its_resolution(capsys):
    import json

    assert main(["plan", "matrices/full.yaml", "--devices", "cpu", "--json", "--filter", "attention=mla"]) == 0
    plan = json.loads(capsys.readouterr().out)
    full = {c["backend"]: c["resolved_mode"] for c in plan["cases"] if c["cudagraph_mode"] == "FULL"}
    assert full == {"torch": "FULL_AND_PIECEWISE", "aiter-emulated": "FULL_AND_PIECEWISE"}
    assert {c["tp"] for c in plan["cases"]} == {1, 2, 4, 8}
    assert {c["spec_tokens"] for c in plan["cases"]} == {0, 2}
    assert {c["kv_cache_dtype"] for c in plan["cases"]} == {"auto", "fp8"}


def test_swa_sinks_groups_and_windows_in_the_plan(tmp_path):
    m = load_matrix(write(tmp_path, SWA), devices="cpu")
    swa = next(c for c in m.cases if c.attention == "swa_sinks")
    assert swa.case_id.startswith("swa_sinks-tp") and swa.model.num_layers == 4
    from backend.families import family

    groups = family("swa_sinks").groups(swa.model)
    assert [(g.name, g.layers, g.sliding_window, g.frees_outside_window) for g in groups] == [
        ("sliding_window", (0, 2), 32, True),
        ("full", (1, 3), None, False),
    ]
    merged = load_matrix(
        write(tmp_path, SWA + "families:\n  swa_sinks:\n    model: {kv_groups: merged}\n", "m2.yaml"), devices="cpu"
    )
    g = family("swa_sinks").groups(next(c for c in merged.cases if c.attention == "swa_sinks").model)
    assert [(x.name, x.layers, x.sliding_window, x.frees_outside_window) for x in g] == [
        ("merged", (0, 1, 2, 3), 32, False)
    ]


def test_full_yaml_plans_hybrid_gdn_in_every_mode_k_and_tp(capsys):
    """The hybrid_gdn block: all five modes (FULL resolving to FULL_AND_PIECEWISE: UNIFORM_BATCH),
    k 0 and 2, tp 1 and 2, kv auto and fp8, its decode and mixed batches."""
    import json

    assert main(["plan", "matrices/full.yaml", "--devices", "cpu", "--json", "--filter", "attention=hybrid_gdn"]) == 0
    plan = json.loads(capsys.readouterr().out)
    cases = plan["cases"]
    assert {c["cudagraph_mode"] for c in cases} == {
        "NONE",
        "PIECEWISE",
        "FULL",
        "FULL_DECODE_ONLY",
        "FULL_AND_PIECEWISE",
    }
    assert {c["resolved_mode"] for c in cases if c["cudagraph_mode"] == "FULL"} == {"FULL_AND_PIECEWISE"}
    assert {c["spec_tokens"] for c in cases} == {0, 2} and {c["tp"] for c in cases} == {1, 2}
    assert {c["kv_cache_dtype"] for c in cases} == {"auto", "fp8"}
    assert {c["batch"] for c in cases} == {"decode_7", "gdn_mixed"}
    assert all(c["id"].startswith("hybrid_gdn-tp") for c in cases)


def test_hybrid_gdn_groups_state_before_attention():
    """vLLM's groups in first-layer order: one state group per state dtype, then attention."""
    from backend.families import family
    from tests.families.conftest import TINY_GDN, gdn_model

    fam = family("hybrid_gdn")
    assert [(g.name, g.layers, g.kind) for g in fam.groups(TINY_GDN)] == [
        ("state_float32", (0, 2), "state"),
        ("state_bfloat16", (1,), "state"),
        ("full", (3,), "paged"),
    ]
    assert [(g.name, g.layers) for g in fam.groups(gdn_model(state_dtype="bfloat16"))] == [
        ("state_bfloat16", (0, 1, 2)),
        ("full", (3,)),
    ]
