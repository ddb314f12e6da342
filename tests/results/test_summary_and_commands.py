"""Markdown summary, `orch report` formats, `orch gate` exit codes and the end-of-run outputs."""

from __future__ import annotations

import json
import re

import pytest
from junitparser import JUnitXml

from orchestrator.artifacts import write_outputs
from orchestrator.cli import main as cli_main
from orchestrator.store import NewRun, ResultStore
from tests.results import samples


@pytest.fixture
def db(tmp_path):
    """Run 1 = the baseline, run 2 = the sample results; a known-failures file beside it."""
    return samples.write_sample_db(tmp_path)[0]


def _run(capsys, *argv):
    code = cli_main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_markdown_lists_regressions_first_with_repro(db, tmp_path, capsys):
    code, md, _ = _run(
        capsys, "report", "--db", db, "--format", "md", "--baseline", "1", "--known-failures", str(tmp_path / "kf.yaml")
    )
    assert code == 1  # the report exits by the verdict it prints
    heads = re.findall(r"^### (.+?) \(\d+\)", md, re.M)
    assert heads[:2] == ["Regressions", "New failures"]
    assert (
        heads.index("Old failures (not gating)")
        < heads.index("Flaky (not gating)")
        < heads.index("Fixed known failures")
    )
    reg = md[md.index("### Regressions") : md.index("### New failures")]
    assert f"orch repro {samples.REGRESSION} --matrix matrices/sample.yaml" in reg and "(baseline: pass)" in reg
    assert re.search(r"[^ ] \(baseline: pass\)", reg), reg  # one space between the reason and the note
    assert "max_abs=0.812" in reg
    assert "gate FAILED: 2 regressions, 1 new failure; 31 ran (24 pass), 1 skipped" in md
    # Case text outside code blocks is escaped (Buildkite annotations render HTML).
    new = md[md.index("### New failures") : md.index("### Old failures")]
    assert "&lt;script&gt;" in new.splitlines()[4] and "\x1b" not in md
    # Grid: one row per tp x mode, a column per kv x batch; the regression cell is marked.
    assert re.search(r"^\| tp2 FULL \| ✅↓ \| ✅ \| ✅ \| 🔻 \|$", md, re.M), md


def test_report_json_and_text(db, capsys):
    code, out, _ = _run(capsys, "report", "--db", db, "--format", "json", "--baseline", "1")
    doc = json.loads(out)
    assert code == 1 and doc["run"]["id"] == 2 and len(doc["results"]) == 32
    assert doc["gate"]["regressions"] == sorted([samples.REGRESSION, samples.TIMEOUT])
    code, out, _ = _run(capsys, "report", "--db", db, "--run", "1")
    assert code == 1 and "orch run 1" in out and "gate FAILED" in out


def test_report_to_file_junit(db, tmp_path, capsys):
    out = tmp_path / "j.xml"
    assert _run(capsys, "report", "--db", db, "--format", "junit", "-o", str(out))[0] == 1
    [suite] = list(JUnitXml.fromfile(str(out)))
    assert suite.tests == 32


GATE = {
    "regressions fail": (["--baseline", "1"], 1, "gate FAILED"),
    "no baseline: every failure gates": ([], 1, "gate FAILED"),
    "baseline run does not exist": (["--baseline", "9"], 2, "no run 9"),
    "baseline is the gated run": (["--baseline", "2"], 2, "is the run being gated"),
    "an unknown label": (["--run", "x"], 2, "no finished run labelled 'x'"),
    "another store is not a run of --db": (["--run", "other.db#3"], 2, "give a run id or a label of --db"),
}


@pytest.mark.parametrize("name", list(GATE))
def test_gate_command_exit_codes(db, capsys, name):
    args, code, words = GATE[name]
    rc, out, err = _run(capsys, "gate", "--db", db, *args)
    assert rc == code and words in (out + err)


def test_gate_passes_when_only_old_known_and_flaky_remain(tmp_path, capsys):
    path = str(tmp_path / "r.db")
    cases = samples.make_cases()
    keep = [
        r
        for r in samples.make_results(cases)
        if r.case_id not in (samples.REGRESSION, samples.TIMEOUT, samples.NEW_FAILURE)
    ]
    with ResultStore(path) as s:
        b = s.create_run(NewRun(matrix="m.yaml", cases=cases))
        for r in samples.make_baseline(cases):
            s.record(b, r)
        s.finish_run(b, "finished")
        rid = s.create_run(NewRun(matrix="m.yaml", cases=[c for c in cases if c.case_id in {r.case_id for r in keep}]))
        for r in keep:
            s.record(rid, r)
        s.finish_run(rid, "finished")
    (tmp_path / "kf.yaml").write_text(samples.KNOWN_YAML)
    rc, out, _ = _run(capsys, "gate", "--db", path, "--baseline", "1", "--known-failures", str(tmp_path / "kf.yaml"))
    assert rc == 0 and "gate PASSED" in out and f"fixed 1 (remove their known-failures entries): {samples.FIXED}" in out
    rc, out, _ = _run(
        capsys, "gate", "--db", path, "--baseline", "1", "--known-failures", str(tmp_path / "kf.yaml"), "-v"
    )
    assert rc == 0 and f"remove its known-failures entry): {samples.FIXED}" in out


def test_interrupted_run_is_missing_results_and_fails(tmp_path, capsys):
    path = str(tmp_path / "r.db")
    cases = samples.make_cases()
    with ResultStore(path) as s:
        rid = s.create_run(NewRun(matrix="m.yaml", cases=cases))
        for c in cases[:5]:
            s.record(rid, samples.result_for(c))
        s.finish_run(rid, "interrupted")
    rc, out, _ = _run(capsys, "gate", "--db", path)
    assert rc == 1 and "27 missing" in out


def test_write_outputs_writes_junit_summary_dashboard_and_step_summary(db, tmp_path, monkeypatch):
    step = tmp_path / "step.md"
    step.write_text("previous step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    out = tmp_path / "out"
    with ResultStore(db) as s:
        gate = write_outputs(
            s,
            2,
            out_dir=str(out),
            junit_path=None,
            summary_path=None,
            baseline="1",
            known_failures=str(tmp_path / "kf.yaml"),
        )
    assert not gate.passed and gate.known_failures == (samples.KNOWN_FAIL,)
    assert (out / "junit.xml").is_file() and (out / "dashboard" / "index.html").is_file()
    md = (out / "summary.md").read_text()
    assert step.read_text() == "previous step\n" + md  # appended, not overwritten
    assert "Known failures (xfail)" in md


def test_empty_db_has_no_runs(tmp_path, capsys):
    path = str(tmp_path / "r.db")
    ResultStore(path).close()
    rc, _, err = _run(capsys, "report", "--db", path)
    assert rc == 2 and "no runs" in err
