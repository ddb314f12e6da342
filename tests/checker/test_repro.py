"""`orch repro` through the real CLI: same verdict as run_case_local, exit codes, bad ids."""

from __future__ import annotations

import json

import torch

from backend.harness.checker import run_case_local
from backend.result import CORE_CHECKS
from orchestrator.cli import main
from orchestrator.commands.repro import verdict_line
from orchestrator.matrix import load_matrix
from orchestrator.store import NewRun

SMOKE = "matrices/smoke.yaml"
CASE_ID = "tp1-FULL-auto-decode_7-torch-s0"


def test_repro_prints_the_checker_verdict(capsys):
    case = load_matrix(SMOKE, devices="cpu").find(CASE_ID)
    expected = run_case_local(case, device=torch.device("cpu"))  # as `--devices cpu` below, on a GPU machine too
    assert main(["repro", CASE_ID, "--matrix", SMOKE, "--devices", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == verdict_line(expected) == f"PASS {CASE_ID}"
    printed = [ln.strip() for ln in lines if ln.strip().split(":")[0] in CORE_CHECKS]
    assert [ln.split(":")[0] for ln in printed] == list(CORE_CHECKS)  # a line per check, in order
    assert printed == [c.summary() for c in expected.checks]


def test_repro_json_and_failing_exit_code(capsys):
    mutant = "tests.mutants.seed_aiter_fa:Backend"  # red in FULL under vLLM's capture
    case_id = "tp1-FULL-auto-mixed_small-Backend-s0"
    code = main(["repro", case_id, "--matrix", SMOKE, "--backend", mutant, "--devices", "cpu", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert out["status"] == "fail" and out["reason"].startswith("replay check failed")
    assert out["repro"] == f"orch repro {case_id} --matrix {SMOKE} --backend {mutant}"


def test_unknown_case_is_one_line_exit_2_with_suggestions(capsys):
    assert main(["repro", "tp1-FULL-auto-decode_7-torh-s0", "--matrix", SMOKE, "--devices", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"did you mean: {CASE_ID}" in err


def test_without_matrix_or_db_asks_for_matrix(capsys, tmp_path):
    assert main(["repro", CASE_ID, "--db", str(tmp_path / "none.db")]) == 2
    assert "give --matrix" in capsys.readouterr().err


def test_case_looked_up_in_the_results_store(capsys, tmp_path):
    from orchestrator.store import ResultStore
    from tests.checker.conftest import DECODE, make_case

    case = make_case("torch", "PIECEWISE", "auto", DECODE)
    db = str(tmp_path / "results.db")
    with ResultStore(db) as store:
        store.create_run(NewRun(matrix="tests/tiny.yaml", cases=[case]))
    assert main(["repro", case.case_id, "--db", db, "--devices", "cpu"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"PASS {case.case_id}"
    assert main(["repro", case.case_id + "x", "--db", db]) == 2
    # suggested (the bad id alone contains the good one as a prefix: look for the suggestion itself)
    assert f"did you mean: {case.case_id}?" in capsys.readouterr().err
