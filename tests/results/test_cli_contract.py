"""The CLI as a newcomer and a CI log meet it, on real stores (SQLite) and the real CLI:
every option explained, output folded to a CI log's size, summaries that say what they left out,
interrupted runs that say so, default output folders that git ignores. The walk of every
subcommand against a passing and a failing store, and everything that needs Ray, is in
tests/executor/test_newcomer.py."""

from __future__ import annotations

import os
import re
import subprocess

import click
import pytest
from junitparser import JUnitXml

from backend.case import BatchSpec, Case
from backend.result import Status
from orchestrator.cli import cli, main
from orchestrator.store import NewRun, ResultStore
from tests.results.samples import result_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _cases(n: int, backend: str = "aiter-emulated", mode: str = "FULL", prefix: str = "b") -> list[Case]:
    return [
        Case(backend, 1, mode, "auto", BatchSpec(f"{prefix}{i:04d}", (1,), (8,)), matrix="m.yaml") for i in range(n)
    ]


def _store(tmp_path, *, passed=(), downgraded=(), skipped=(), missing=(), status="finished") -> str:
    """One run: `passed` cases pass, `downgraded` pass with FULL resolved to FULL_AND_PIECEWISE,
    `skipped` are (case, reason) skips, `missing` are planned without a result."""
    path = str(tmp_path / "r.db")
    planned = [*passed, *downgraded, *(c for c, _ in skipped), *missing]
    with ResultStore(path) as s:
        rid = s.create_run(NewRun(matrix="m.yaml", cases=planned))
        s.record_many(
            rid,
            [(result_for(c), True) for c in passed]
            + [(result_for(c, resolved_mode="FULL_AND_PIECEWISE", downgraded=True), True) for c in downgraded]
            + [(result_for(c, Status.SKIP, reason=why, checks=()), True) for c, why in skipped],
        )
        s.finish_run(rid, status)
    return path


def test_every_option_of_every_command_has_help():
    # `--db`, `--run`, `--baseline`, `--known-failures`, `--out` had none in report/gate/dashboard/serve.
    bare = [
        f"{name} {'/'.join(p.opts)}"
        for name, cmd in cli.commands.items()
        for p in cmd.params
        if isinstance(p, click.Option) and not (p.help or "").strip()
    ]
    assert bare == []
    assert all((cmd.help or "").strip() for cmd in cli.commands.values())


def test_workers_help_states_the_default_the_run_uses():
    from orchestrator.executor.cluster import default_cpu_workers, local_layout

    (workers,) = [p for p in cli.commands["run"].params if p.name == "workers"]
    assert "one per GPU" in workers.help and "at least the largest tp" in workers.help and "cores" in workers.help
    # full.yaml on 2 cores: 8 workers (its tp 8 gang), no more than 2 ranks running at once.
    assert default_cpu_workers(2, 8) == 8 and default_cpu_workers(16, 8) == 16
    layout = local_layout("cpu", None, 8, cpus=2, gpus=0)
    assert (layout.workers, layout.parallel) == (8, 2)
    assert layout.describe() == "8 CPU worker(s), at most 2 running at once (2 cores)"


def test_gate_folds_hundreds_of_missing_cases_into_one_line(tmp_path, capsys):
    # `orch gate --run 2` printed 702 lines, one per missing case.
    db = _store(tmp_path, passed=_cases(3, prefix="p"), missing=_cases(700), status="interrupted")
    code, out, _ = _run(capsys, "gate", "--db", db)
    lines = out.splitlines()
    assert code == 1 and len(lines) == 3, out
    assert (
        lines[0] == "missing 700: tp1-FULL-auto-b0000-aiter-emulated-s0, tp1-FULL-auto-b0001-aiter-emulated-s0, "
        "tp1-FULL-auto-b0002-aiter-emulated-s0 and 697 more"
    )
    assert lines[-1] == "run 1 INTERRUPTED (3 of 703 cases recorded): gate FAILED: 700 missing; 3 ran (3 pass)"
    code, out, _ = _run(capsys, "gate", "--db", db, "-v")
    assert code == 1 and len([ln for ln in out.splitlines() if ln.startswith("missing: ")]) == 700


def test_report_folds_repeated_downgrade_warnings(tmp_path, capsys):
    # `orch report` printed 74 `mode downgraded` warnings before its verdict.
    db = _store(tmp_path, passed=_cases(5, backend="torch"), downgraded=_cases(74))
    code, out, _ = _run(capsys, "report", "--db", db)
    warnings = [ln for ln in out.splitlines() if ln.startswith("warning:")]
    assert code == 0 and warnings == [
        "warning: 74 cases: FULL downgraded to FULL_AND_PIECEWISE for UNIFORM_BATCH gqa backends (aiter-emulated)"
    ]
    assert out.splitlines()[-1] == "run 1: gate PASSED: 79 ran (79 pass), no new failures"
    assert not [ln for ln in out.splitlines() if ln != ln.rstrip()]  # no padding


def test_summary_says_how_many_each_list_left_out(tmp_path, capsys):
    # "Downgraded modes (74)" listed 25 with no "and 49 more"; now every list is folded or capped
    # with its remainder, and the skips are grouped by reason.
    skipped = [(c, f"unavailable: reason {i % 30:02d}") for i, c in enumerate(_cases(90, backend="aiter", prefix="s"))]
    db = _store(
        tmp_path,
        passed=_cases(3, backend="torch"),
        downgraded=_cases(74),
        skipped=skipped,
        missing=_cases(40, backend="torch", prefix="m"),
        status="interrupted",
    )
    code, md, _ = _run(capsys, "report", "--db", db, "--format", "md")
    assert code == 1
    down = md[md.index("### Downgraded modes (74)") : md.index("### Skipped")]
    assert "- 74 cases: FULL downgraded to FULL_AND_PIECEWISE for UNIFORM_BATCH gqa backends (aiter-emulated)" in down
    missing = md[md.index("### Missing results (40)") : md.index("### Downgraded")]
    assert missing.count("— no result") == 25 and "- … and 15 more (see `orch report`)" in missing
    skips = md[md.index("### Skipped (90)") : md.index("### Grid")]
    assert (
        skips.count("| 3 | unavailable: reason ") == 25
        and "| 15 | … and 5 more reasons (see `orch report`) | |" in skips
    )
    # It leads with the run's state and what ran; an all-skipped provider gets no grid.
    head = md.splitlines()
    assert head[0] == "## ⛔ orch run 1 — `m.yaml` — INTERRUPTED"
    assert md.index("**77 ran** (77 pass) · 90 skipped · 40 missing") < md.index("### Missing results")
    assert "#### `aiter-emulated`" in md and "#### `aiter`" not in md


def test_an_interrupted_runs_junit_names_it_and_fails_its_missing_cases(tmp_path, capsys):
    db = _store(tmp_path, passed=_cases(3), missing=_cases(4, prefix="m"), status="interrupted")
    out = tmp_path / "j.xml"
    code, _, _ = _run(capsys, "report", "--db", db, "--format", "junit", "-o", str(out))
    assert code == 1
    [suite] = list(JUnitXml.fromfile(str(out)))
    props = {p.name: p.value for p in suite.properties()}
    assert props["run_id"] == "1" and props["run_status"] == "interrupted"
    assert suite.tests == 7 and suite.errors == 4  # a shorter green suite is what a CI would have shown
    errors = [tc for tc in suite for r in tc.result if r._tag == "error"]
    assert {tc.name for tc in errors} == {c.case_id for c in _cases(4, prefix="m")}
    assert {r.type for tc in errors for r in tc.result} == {"missing"}


def test_a_finished_run_of_only_passes_says_nothing_of_interruption(tmp_path, capsys):
    db = _store(tmp_path, passed=_cases(3))
    code, md, _ = _run(capsys, "report", "--db", db, "--format", "md")
    assert code == 0 and md.startswith("## ✅ orch run 1 — `m.yaml`\n") and "INTERRUPTED" not in md


@pytest.mark.parametrize(
    "argv",
    [["plan", "matrices/full.yaml", "--devices", "cpu"], ["simulate", "--gpus", "8", "--nodes", "1", "--cases", "50"]],
)
def test_rich_output_is_not_padded_when_redirected(capsys, argv):
    # (doctor: tests/backend/test_doctor.py) rich filled lines to the console width in a pipe.
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("\n") > 5 and not [ln for ln in out.splitlines() if ln != ln.rstrip()]


def test_plan_estimates_the_wall_time_on_the_workers_apart_from_the_sum(capsys):
    # "estimated cost: 814.7 s" was a sum over cases against a cases phase of 87.5 s.
    import json

    argv = ["plan", "matrices/full.yaml", "--devices", "cpu", "--filter", "tp=1", "--json", "--db", "none.db"]
    assert main([*argv, "--workers", "4"]) == 0
    plan = json.loads(capsys.readouterr().out)
    wall, total = plan["wall"], plan["total_est_s"]
    longest = max(c["est_s"] for c in plan["cases"])
    assert (wall["workers"], wall["parallel"]) == (4, 4)
    assert total / 4 <= wall["est_s"] <= total / 4 + longest  # four at once, the last case alone at worst
    assert main([*argv, "--workers", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["wall"]["est_s"] == pytest.approx(total, rel=1e-3)
    assert main(argv[:-3] + ["--workers", "4"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^expected wall time: [\d.]+ s for the cases on 4 CPU worker\(s\);", text, re.M), text
    assert f"sum of case estimates: {total:.1f} s of worker time" in text


@pytest.mark.parametrize("path", ["orch-out/summary.md", "site/index.html", "orch-results.db"])
def test_the_readme_examples_outputs_are_ignored_by_git(path):
    # `orch dashboard --out site/` (the README's example) left site/ untracked in git status.
    proc = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO)
    assert proc.returncode == 0, f"{path} is not in .gitignore"
