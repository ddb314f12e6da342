"""One verdict per run, whoever asks: `orch gate` and `orch report` judge a stored run with what
judged it when it ran (baseline, known failures) unless told otherwise; `--run` takes a label; a
command writing into a run's out dir defaults to that run. No Ray, no torch: a store of samples."""

from __future__ import annotations

import json
import os

import pytest

from orchestrator.artifacts import write_outputs
from orchestrator.cli import main as cli_main
from orchestrator.commands.repro import _from_store
from orchestrator.errors import InputError
from orchestrator.store import NewRun, ResultStore, RunOptions
from tests.results import samples


def _cli(capsys, *argv):
    code = cli_main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


@pytest.fixture
def judged(tmp_path):
    """Run 2 judged by `orch run ... --baseline 1 --known-failures kf.yaml` (stored as orch run stores them)."""
    kf = str(tmp_path / "kf.yaml")
    db, _ = samples.write_sample_db(tmp_path, options=RunOptions(known_failures=kf))
    return db, kf


def test_gate_and_report_give_the_verdict_the_run_was_given(judged, capsys):
    db, kf = judged
    _, as_run, _ = _cli(capsys, "gate", "--db", db, "--run", "2", "--baseline", "1", "--known-failures", kf)
    code, stored, _ = _cli(capsys, "gate", "--db", db, "--run", "2")
    assert code == 1 and stored.splitlines()[-1] == as_run.splitlines()[-1], (stored, as_run)
    assert f"known failures: {kf} (2 entries)" in stored and "baseline: run 1" in stored
    _, report, _ = _cli(capsys, "report", "--db", db, "--run", "2", "--format", "json")
    doc = json.loads(report)
    assert doc["gate"]["verdict"] == as_run.splitlines()[-1].removeprefix("run 2: ")
    assert doc["gate"]["known_failures"] == [samples.KNOWN_FAIL] and doc["baseline"]["run"] == 1
    assert doc["known_failures"] == kf
    # The command may ask for another judgement: stricter without either.
    _, bare, _ = _cli(capsys, "gate", "--db", db, "--run", "2", "--no-baseline", "--no-known-failures")
    assert bare.splitlines()[-1] != stored.splitlines()[-1] and "known failures:" not in bare
    code, _, err = _cli(capsys, "gate", "--db", db, "--known-failures", kf, "--no-known-failures")
    assert code == 2 and "contradict" in err


def _labelled_store(tmp_path) -> str:
    """Run 1 labelled main, run 2 pr-101 (fails), run 3 pr-102 (passes): the latest is pr-102's."""
    db = str(tmp_path / "r.db")
    cases = samples.make_cases()
    with ResultStore(db) as s:
        for label, results in (
            ("main", samples.make_baseline(cases)),
            ("pr-101", samples.make_results(cases)),
            ("pr-102", [samples.result_for(c) for c in cases]),
        ):
            rid = s.create_run(NewRun(matrix="matrices/sample.yaml", cases=cases, label=label))
            s.record_many(rid, [(r, True) for r in results])
            s.finish_run(rid, "finished")
    return db


def test_run_takes_a_label_everywhere(tmp_path, capsys):
    db = _labelled_store(tmp_path)
    code, out, _ = _cli(capsys, "gate", "--db", db, "--run", "pr-101")
    assert code == 1 and out.splitlines()[-1].startswith("run 2: gate FAILED")
    code, out, _ = _cli(capsys, "report", "--db", db, "--run", "pr-101")
    assert code == 1 and out.startswith("orch run 2 ")
    code, out, _ = _cli(capsys, "dashboard", "--db", db, "--run", "pr-101", "--out", str(tmp_path / "d"))
    assert code == 0 and out.strip().endswith("(run 2)")
    assert _from_store(samples.REGRESSION, db, "pr-101").case_id == samples.REGRESSION
    with pytest.raises(InputError, match="no case 'nope' in run 2 of"):
        _from_store("nope", db, "pr-101")


def test_commands_writing_into_a_runs_out_dir_default_to_that_run(tmp_path, capsys):
    db = _labelled_store(tmp_path)
    out = tmp_path / "pr-101-out"
    with ResultStore(db) as s:
        write_outputs(s, 2, out_dir=str(out))  # what `orch run --out pr-101-out` left there
    code, said, _ = _cli(capsys, "dashboard", "--db", db, "--out", str(out / "dashboard"))
    assert code == 0 and said.strip().endswith("(run 2)"), said
    code, _, _ = _cli(capsys, "report", "--db", db, "--format", "md", "-o", str(out / "report.md"))
    assert code == 1 and "orch run 2 " in (out / "report.md").read_text()
    # A folder that holds no run's outputs: the store's latest.
    code, said, _ = _cli(capsys, "dashboard", "--db", db, "--out", str(tmp_path / "site"))
    assert code == 0 and said.strip().endswith("(run 3)")
    # Outputs of another store's run 2 (another matrix) are not this store's run 2.
    with ResultStore(str(tmp_path / "other.db")) as s:
        rid = s.create_run(NewRun(matrix="matrices/other.yaml", cases=samples.make_cases("matrices/other.yaml")))
        s.finish_run(rid, "finished")
        rid = s.create_run(NewRun(matrix="matrices/other.yaml", cases=samples.make_cases("matrices/other.yaml")))
        s.finish_run(rid, "finished")
        write_outputs(s, rid, out_dir=str(tmp_path / "foreign"))
    code, said, _ = _cli(capsys, "dashboard", "--db", db, "--out", str(tmp_path / "foreign" / "dashboard"))
    assert code == 0 and said.strip().endswith("(run 3)")
    assert os.path.isfile(tmp_path / "foreign" / "dashboard" / "index.html")


def test_a_resume_is_judged_as_its_run_was_a_gone_file_before_any_case(tmp_path, capsys):
    db, kf = str(tmp_path / "r.db"), tmp_path / "kf.yaml"  # the file the run applied, gone since
    with ResultStore(db) as s:
        rid = s.create_run(
            NewRun(
                matrix="matrices/sample.yaml", cases=samples.make_cases(), options=RunOptions(known_failures=str(kf))
            )
        )
        s.finish_run(rid, "interrupted")
    code, out, err = _cli(capsys, "run", "--resume", str(rid), "--db", db, "--out", str(tmp_path / "o"))
    assert (
        code == 2
        and out == ""
        and err.splitlines()[-1] == f"orch: {kf}: cannot read known-failures file: No such file or directory"
    ), err
    with ResultStore(db) as s:
        assert s.results(rid) == [] and s.run(rid).status == "interrupted"  # no case ran
