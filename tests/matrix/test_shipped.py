"""The shipped matrices and `orch plan`: sizes, coverage, tiers nest, ids stable and unique."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import yaml

from backend.case import CUDAGRAPH_MODES
from orchestrator.cli import main
from orchestrator.matrix import load_matrix

TIERS = ("matrices/smoke.yaml", "matrices/full.yaml", "matrices/nightly.yaml")


@pytest.fixture(scope="module")
def full_plan():
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main(["plan", "matrices/full.yaml", "--json", "--devices", "cpu"])
    assert code == 0
    return json.loads(buf.getvalue())


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def tiers(request):
    return {path: load_matrix(path, devices=request.param) for path in TIERS}


def test_full_plan_has_300_runnable_cases_covering_every_axis_value(full_plan):
    assert full_plan["matrix"] == "matrices/full.yaml" and full_plan["device_class"] == "cpu"
    assert len(full_plan["cases"]) >= 300
    counts = full_plan["counts"]
    assert set(counts["tp"]) == {"1", "2", "4", "8"}
    assert set(counts["cudagraph_mode"]) == set(CUDAGRAPH_MODES)
    assert set(counts["kv_cache_dtype"]) == {"auto", "fp8", "fp8_ds_mla"}
    assert len(counts["batch"]) >= 8
    assert sum(counts["tp"].values()) == len(full_plan["cases"])
    # Cost model present: every case has an estimate and the total is their sum.
    assert all(c["est_s"] > 0 for c in full_plan["cases"])
    assert full_plan["total_est_s"] == pytest.approx(sum(c["est_s"] for c in full_plan["cases"]), rel=1e-3)
    assert sum(full_plan["est_s_by_tp"].values()) == pytest.approx(full_plan["total_est_s"], rel=1e-3)


def test_full_plan_skips_native_aiter_on_cpu_with_a_reason(full_plan):
    reasons = {s["id"]: s["reason"] for s in full_plan["skipped"]}
    aiter = [r for i, r in reasons.items() if i.endswith("-aiter-s0")]
    assert aiter and all(r.startswith("unavailable: ") for r in aiter)
    assert all("unavailable: " in r for i, r in reasons.items() if "-aiter-triton-" in i)
    assert {c["backend"] for c in full_plan["cases"]} == {"torch", "aiter-emulated"}


def test_full_plan_case_fields(full_plan):
    case = next(c for c in full_plan["cases"] if c["id"] == "tp2-FULL-fp8-mixed_small-torch-s0")
    assert case == {
        **case,
        "tp": 2,
        "cudagraph_mode": "FULL",
        "kv_cache_dtype": "fp8",
        "batch": "mixed_small",
        "backend": "torch",
        "seed": 0,
    }


def test_tiers_nest(tiers):
    smoke, full, nightly = (tiers[p] for p in TIERS)

    def strip(case):  # the same case in two tiers differs only in where it came from and in how
        return dataclasses.replace(case, matrix="", tier="", steps=0)  # many steps a tier gives it

    full_cases = {strip(c) for c in full.cases}
    assert {strip(c) for c in smoke.cases} <= full_cases
    assert full_cases <= {strip(c) for c in nightly.cases}
    assert len(nightly.cases) > len(full.cases)
    assert {c.tier for c in smoke.cases} == {"smoke"} and {c.tier for c in nightly.cases} == {"nightly"}


def test_smoke_shares_definitions_with_full():
    raw = yaml.safe_load(open("matrices/smoke.yaml"))
    assert raw["extends"] == "full.yaml"
    assert not {"model", "batches", "capture_sizes", "tolerances"} & set(raw)


def test_smoke_size_and_coverage():
    m = load_matrix("matrices/smoke.yaml", devices="cpu")
    assert 24 <= len(m.cases) <= 110 and not m.skipped
    assert {c.attention for c in m.cases} == {"gqa", "mla", "swa_sinks", "hybrid_gdn", "mla_sparse"}
    assert {c.mode for c in m.cases} == set(CUDAGRAPH_MODES)
    assert {c.tp for c in m.cases} == {1, 2} and {c.kv_cache_dtype for c in m.cases} == {"auto", "fp8"}
    assert {c.backend for c in m.cases} == {"torch", "aiter-emulated"}
    kinds = {c.batch.kind for c in m.cases}
    assert {"decode", "mixed"} <= kinds
    assert any(c.batch.num_tokens not in c.capture_sizes for c in m.cases)  # padding exercised
    model = m.cases[0].model
    assert model.head_size <= 16 and model.num_layers <= 2


def test_full_cpu_shape_lets_tp8_run_and_gpu_shape_is_production_like():
    cpu = load_matrix("matrices/full.yaml", devices="cpu")
    gpu = load_matrix("matrices/full.yaml", devices="gpu")
    assert any(c.tp == 8 for c in cpu.cases)
    g = gpu.skipped[0].case.model if not gpu.cases else gpu.cases[0].model
    assert (g.num_heads, g.num_kv_heads, g.head_size, g.block_size, g.dtype) == (32, 8, 128, 16, "bfloat16")
    assert g.max_num_seqs >= 256 and g.max_model_len >= 4096
    decode_counts = {c.batch.num_reqs for c in cpu.cases if c.batch.kind == "decode"}
    assert {1, 3, 7, 64, 200} <= decode_counts
    assert {c.batch.kind for c in cpu.cases} == {"decode", "mixed", "prefill"}
    chunked = [c.batch for c in cpu.cases if any(s > q > 1 for q, s in zip(c.batch.query_lens, c.batch.seq_lens))]
    assert chunked


def test_ids_stable_unique_and_safe(tiers):
    for path, m in tiers.items():
        all_ids = [c.case_id for c in m.cases] + [s.case.case_id for s in m.skipped]
        assert len(all_ids) == len(set(all_ids)), path
        # the family leads the id when it is not gqa (gqa ids are as they were before families)
        assert all(
            re.fullmatch(
                r"(mla-|swa_sinks-|hybrid_gdn-|mla_sparse-)?tp[1248]-[A-Z_]+-(auto|fp8|fp8_ds_mla)-[A-Za-z0-9_.\-]+-[A-Za-z0-9_.\-]+-s\d+",
                i,
            )
            for i in all_ids
        )
        assert all(i.startswith(f"{c.attention}-") == (c.attention != "gqa") for c in m.cases for i in [c.case_id])
        again = load_matrix(path, devices=m.device_class)
        assert [c.case_id for c in again.cases] == [c.case_id for c in m.cases]
        assert again == m


def test_plan_text_output(capsys):
    assert main(["plan", "matrices/smoke.yaml", "--devices", "cpu", "--filter", "tp=2", "-v"]) == 0
    out = capsys.readouterr().out
    assert "tp2-FULL-auto-mixed_small-torch-s0" in out
    assert "tp1-" not in out
    assert "expected wall time:" in out and "sum of case estimates:" in out and "cudagraph_mode" in out
    # Without -v no case has a line of its own (full.yaml once printed 1,730 of them).
    assert main(["plan", "matrices/smoke.yaml", "--devices", "cpu", "--filter", "tp=2"]) == 0
    out = capsys.readouterr().out
    assert "tp2-FULL-auto-mixed_small-torch-s0" not in out and "5 runnable cases" in out


def test_plan_text_lists_skips_with_reasons(capsys):
    assert main(["plan", "matrices/full.yaml", "--devices", "cpu", "--filter", "backend=aiter tp=1 decode_1"]) == 0
    out = capsys.readouterr().out
    assert "0 runnable cases" in out and "tp1-NONE-auto-decode_1-aiter-s0" not in out
    assert re.search(r"^  \d+ unavailable: needs a ROCm GPU \(aiter\)$", out, re.M), out
    assert (
        main(["plan", "matrices/full.yaml", "--devices", "cpu", "--filter", "backend=aiter tp=1 decode_1", "-v"]) == 0
    )
    out = capsys.readouterr().out
    assert "unavailable:" in out and "tp1-NONE-auto-decode_1-aiter-s0" in out


# --- what the files and docs say of themselves matches `orch plan` --------------------------


def _counts(path: str) -> tuple[int, int]:
    m = load_matrix(path, devices="cpu")
    return len(m.cases) + len(m.skipped), len(m.cases)


def test_headers_and_docs_state_what_the_plan_expands():
    # full.yaml's header said "8 batch shapes x 4 backends" (there were 10 and 5) and MATRIX.md that
    # smoke had ~50 cases (the plan: 90).
    import os

    full = open("matrices/full.yaml").read()
    header = full[: full.index("\n#\n")]
    doc = yaml.safe_load(full)
    total, runnable = _counts("matrices/full.yaml")
    assert f"{len(doc['batches'])} batch shapes" in header and f"x {len(doc['axes']['backend'])} backends" in header
    assert f"{len(doc['axes']['batch'])} of the {len(doc['batches'])}" in header
    assert f"{total} cases, {runnable} runnable on a CPU" in header, header
    smoke_total, smoke_runnable = _counts("matrices/smoke.yaml")
    assert open("matrices/smoke.yaml").readline().startswith(f"# smoke: {smoke_total} cases for every commit")
    assert smoke_total == smoke_runnable
    matrix_md = open(os.path.join("docs", "MATRIX.md")).read()
    assert f"`smoke.yaml` (every commit, {smoke_total} cases" in matrix_md
    assert f"`full.yaml` (the merge gate, {total} cases, {runnable} runnable on a CPU" in matrix_md
