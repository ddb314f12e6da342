"""A newcomer's first hour, on the real CLI, the session's Ray cluster, real SQLite and real
signals: `--resume` with another matrix, an interrupted run's outputs and exit code, every
subcommand exiting by the verdict it prints, a run's last lines sized for a CI log with its skips
grouped by reason, `orch doctor --matrix` agreeing with `orch run`. Synchronised on result rows
and on a runner that holds, never on how fast the machine is."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from junitparser import JUnitXml

from backend.result import Status
from orchestrator.cli import cli, main
from orchestrator.filters import select
from orchestrator.matrix import load_matrix
from orchestrator.store import NewRun, ResultStore
from tests.results import samples

pytestmark = pytest.mark.xdist_group("ray")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = "matrices/smoke.yaml"
PASS_RUNNER = "tests.executor.faulty_backends:fault_runner"  # passes every smoke case at once
FAIL_RUNNER = "tests.executor.faulty_backends:fail_runner"
SMALL = "attention=gqa tp=1 cudagraph_mode=NONE kv_cache_dtype=auto"


def _cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _run_args(db, out, *extra):
    return ["--db", str(db), "--out", str(out), "--devices", "cpu", "--no-progress", *extra]


# --- 1. --resume with another matrix ---------------------------------------------------------


@pytest.fixture
def half_run(tmp_path):
    """Run 1 of smoke.yaml's SMALL slice with one case recorded and the rest missing (a driver
    that died), closed as interrupted."""
    db = tmp_path / "r.db"
    cases = select(load_matrix(SMOKE, devices="cpu").cases, SMALL)
    with ResultStore(str(db)) as s:
        rid = s.create_run(NewRun(matrix=SMOKE, cases=cases))
        s.record(rid, samples.result_for(cases[0]))
        s.finish_run(rid, "interrupted")
    return db, tmp_path / "out", cases


def _attempts(db) -> int:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT count(*) FROM attempt_log").fetchone()[0]


def test_resume_with_another_matrix_is_one_line_exit_2_and_runs_nothing(half_run, capsys):
    db, out, _ = half_run
    code, _, err = _cli(capsys, "run", "matrices/full.yaml", "--resume", "1", *_run_args(db, out))
    assert code == 2
    assert err.splitlines() == [
        "orch: --resume 1: run 1 ran matrices/smoke.yaml, not matrices/full.yaml "
        "(leave MATRIX out to finish run 1 with its own)"
    ]
    assert _attempts(db) == 1  # nothing ran (not run 1's cases, without a word about full.yaml)


def test_resume_finishes_a_run_with_its_own_matrix_then_says_it_is_finished(half_run, ray_cluster, capsys, monkeypatch):
    db, out, cases = half_run
    monkeypatch.setenv("ORCH_RUNNER", PASS_RUNNER)
    code, _, err = _cli(capsys, "run", "--resume", "1", *_run_args(db, out))  # no MATRIX: the run's own
    assert code == 0, err
    assert f"orch: resuming run 1 (matrices/smoke.yaml): {len(cases) - 1} cases without a final verdict" in err
    with ResultStore(str(db)) as s:
        assert s.missing_case_ids(1) == [] and s.run(1).status == "finished" and len(s.runs()) == 1
    # The same file under another path is the run's matrix too.
    code, _, err = _cli(capsys, "run", os.path.join(REPO, SMOKE), "--resume", "1", *_run_args(db, out))
    assert code == 2 and err.splitlines() == [
        "orch: --resume 1: run 1 is finished, every one of its 5 cases has a verdict; nothing to resume "
        "(`orch gate --run 1` prints its verdict)"
    ]


def test_run_without_a_matrix_or_resume_is_usage(tmp_path, capsys):
    code, _, err = _cli(capsys, "run", *_run_args(tmp_path / "r.db", tmp_path / "o"))
    assert code == 2 and err.splitlines() == [
        "orch: give the MATRIX to run (or --resume RUN_ID to finish a run with its own matrix)"
    ]


# --- 2. an interrupted run: outputs marked INTERRUPTED, 130 / 143 ---------------------------------


def _earlier_green_run(db: str, out: str) -> None:
    """Run 1 of `db`, finished and passing, with its outputs written to `out`."""
    from orchestrator.artifacts import write_outputs

    cases = select(load_matrix(SMOKE, devices="cpu").cases, SMALL)
    with ResultStore(db) as s:
        rid = s.create_run(NewRun(matrix=SMOKE, cases=cases))
        s.record_many(rid, [(samples.result_for(c), True) for c in cases])
        s.finish_run(rid, "finished")
        assert write_outputs(s, rid, out_dir=out).passed
    assert open(os.path.join(out, "summary.md")).read().startswith("## ✅ orch run 1")


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_writes_its_outputs_marked_interrupted(ray_cluster, tmp_path, sig, code):
    db, out = str(tmp_path / "r.db"), str(tmp_path / "out")
    _earlier_green_run(db, out)
    gangs = len([c for c in load_matrix(SMOKE, devices="cpu").cases if c.tp > 1])
    address = ray_cluster.get_runtime_context().gcs_address
    child = subprocess.Popen(  # the held runner passes the tp 2 cases and never finishes a tp 1 case
        [sys.executable, "-m", "orchestrator.cli", "run", SMOKE, *_run_args(db, out, "--address", address)],
        cwd=REPO,
        env={**os.environ, "ORCH_RUNNER": "tests.executor.faulty_backends:hold_runner"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, done = time.monotonic() + 180, 0
        while time.monotonic() < deadline and child.poll() is None and done < gangs:
            time.sleep(0.2)
            with sqlite3.connect(db) as con:
                done = con.execute("SELECT count(*) FROM results WHERE run_id = 2 AND status = 'pass'").fetchone()[0]
        assert child.poll() is None and done == gangs, f"{done} of {gangs} gang cases recorded"
        # Run 1's outputs went when run 2 started: no signal (SIGKILL included) can leave them current.
        assert not os.path.exists(os.path.join(out, "summary.md"))
        assert not os.path.exists(os.path.join(out, "junit.xml"))
        child.send_signal(sig)
        stdout, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == code, err
    # Ray's banners (token auth...) only with -v: every stderr line is orch's (continuations
    # indented); what the run concluded is on stdout (`orch run | tee log` kept nothing).
    assert all(ln.startswith(("orch: ", "    ")) for ln in err.splitlines()), err
    lines = stdout.splitlines()
    with ResultStore(db) as s:
        run, missing = s.run(2), s.missing_case_ids(2)
    assert run.status == "interrupted" and missing and run.num_results == gangs
    name = signal.Signals(sig).name
    assert lines[-1].startswith(f"run 2 INTERRUPTED by {name} after ") and "--resume 2" in lines[-1], lines[-1]
    ran = run.num_cases - len(missing)
    assert f"{len(missing)} missing -> gate FAILED: {len(missing)} missing; {ran} ran ({ran} pass)" in lines[-1]
    md = open(os.path.join(out, "summary.md")).read()
    assert md.startswith(f"## ⛔ orch run 2 — `{SMOKE}` — INTERRUPTED\n") and "orch run 1" not in md
    assert f"**run 2 INTERRUPTED ({run.num_results} of {run.num_cases} cases recorded): gate FAILED" in md
    [suite] = list(JUnitXml.fromfile(os.path.join(out, "junit.xml")))
    props = {p.name: p.value for p in suite.properties()}
    assert (props["run_id"], props["run_status"]) == ("2", "interrupted")
    assert sorted(tc.name for tc in suite if any(r.type == "missing" for r in tc.result)) == sorted(missing)
    page = open(os.path.join(out, "dashboard", "index.html")).read()
    assert f"<title>orch run 2 INTERRUPTED — {SMOKE}</title>" in page
    assert f"run 2 INTERRUPTED ({run.num_results} of {run.num_cases} cases recorded)" in page


# --- 3. every subcommand exits by the verdict it prints -----------------------------------------


def _passing_store(tmp_path) -> str:
    path = str(tmp_path / "pass.db")
    cases = samples.make_cases()
    with ResultStore(path) as s:
        rid = s.create_run(NewRun(matrix="matrices/sample.yaml", cases=cases))
        s.record_many(rid, [(samples.result_for(c), True) for c in cases])
        s.finish_run(rid, "finished")
    return path


def _printed_verdict(text: str) -> int | None:
    """The exit code the printed verdict calls for: a gate's or a diff's, or `orch repro`'s case verdict."""
    if re.search(r"(gate|diff) FAILED", text) or re.search(r"^(FAIL|ERROR|TIMEOUT|FLAKY) ", text, re.M):
        return 1
    if re.search(r"(gate|diff) PASSED", text) or re.search(r"^(PASS|SKIP) ", text, re.M):
        return 0
    return None


def _serve(db: str, sig: int = signal.SIGINT, ignore_sigint: bool = False) -> tuple[int, str]:
    """`orch serve` until Ctrl-C (its way to stop): exit code and what it printed. ignore_sigint:
    started as a script's background job is, SIGINT ignored from the start."""
    cmd = [sys.executable, "-m", "orchestrator.cli", "serve", "--db", db, "--port", "0"]
    if ignore_sigint:
        cmd = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *cmd]
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline()  # printed once it listens
    p.send_signal(sig)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return -1, first + out + err
    return p.returncode, first + out + err


@pytest.mark.parametrize("sig,ignored", [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_serve_stops_on_ctrl_c_or_sigterm_whatever_it_inherited(tmp_path, sig, ignored):
    db = _passing_store(tmp_path)
    code, printed = _serve(db, sig, ignore_sigint=ignored)
    assert code == 0 and printed.startswith("orch dashboard on http://127.0.0.1:"), (code, printed)


def test_every_subcommand_exits_by_the_verdict_it_prints(ray_cluster, tmp_path, capsys, monkeypatch):
    failing, _ = samples.write_sample_db(tmp_path)  # run 2 fails its gate
    stores = {"passing": (_passing_store(tmp_path), 0), "failing": (failing, 1)}
    mutant = ["tp1-FULL-auto-mixed_small-Backend-s0", "--backend", "tests.mutants.seed_aiter_fa:Backend"]
    walked: set[str] = set()
    for label, (db, expected) in stores.items():
        out = str(tmp_path / label)
        runner = PASS_RUNNER if expected == 0 else FAIL_RUNNER
        repro = ["tp1-FULL-auto-decode_7-torch-s0"] if expected == 0 else mutant
        walk = [  # (command, argv, environment)
            ("plan", ["plan", SMOKE, "--db", db], {}),
            ("run", ["run", SMOKE, "--filter", SMALL, *_run_args(db, out)], {"ORCH_RUNNER": runner}),
            ("repro", ["repro", *repro, "--matrix", SMOKE, "--devices", "cpu"], {}),
            ("report", ["report", "--db", db, "--run", "latest"], {}),
            ("report", ["report", "--db", db, "--format", "json"], {}),
            ("report", ["report", "--db", db, "--format", "md"], {}),
            ("report", ["report", "--db", db, "--format", "junit"], {}),
            ("gate", ["gate", "--db", db], {}),
            # The failing store's run 2 regressed from its run 1; the passing store's never did.
            ("diff", ["diff", "--db", db, "1", "2" if expected else "latest"], {}),
            ("dashboard", ["dashboard", "--db", db, "--out", out + "/site"], {}),
            ("simulate", ["simulate", "--gpus", "8", "--nodes", "1", "--cases", "50"], {}),
            ("doctor", ["doctor"], {}),
        ]
        for command, argv, env in walk:
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            code, stdout, stderr = _cli(capsys, *argv)
            for k in env:
                monkeypatch.delenv(k)
            verdict = _printed_verdict(stdout + stderr)
            walked.add(command)
            if command in ("run", "repro", "report", "gate", "diff"):
                assert (verdict, code) == (expected, expected), (label, argv, code, stdout[-500:], stderr[-500:])
            else:  # prints no verdict, so it says only whether it did its job
                assert (verdict, code) == (None, 0), (label, argv, code, stdout[-500:], stderr[-500:])
        code, printed = _serve(db)
        walked.add("serve")
        assert (_printed_verdict(printed), code) == (None, 0), printed
    assert walked == set(cli.commands)  # a new subcommand joins the walk


# --- 4/5. the run's last lines: one line per kind, skips by reason --------------------------------


FULL_SLICE = "attention=gqa tp=1 cudagraph_mode=FULL kv_cache_dtype=auto batch=decode_7"


def test_a_failing_runs_last_lines_fold_its_cases_and_group_its_skips(ray_cluster, tmp_path, capsys, monkeypatch):
    m = load_matrix("matrices/full.yaml", devices="cpu")
    cases, skipped = select(m.cases, FULL_SLICE), select(m.skipped, FULL_SLICE)
    assert len(cases) > 3 and {s.case.backend for s in skipped} == {"aiter", "aiter-triton", "aiter-triton-pa"}
    monkeypatch.setenv("ORCH_RUNNER", FAIL_RUNNER)
    db, out = tmp_path / "r.db", tmp_path / "out"
    code, out_text, _ = _cli(capsys, "run", "matrices/full.yaml", "--filter", FULL_SLICE, *_run_args(db, out))
    assert code == 1
    ids = sorted(c.case_id for c in cases)
    assert f"fail {len(cases)}: {', '.join(ids[:3])} and {len(ids) - 3} more" in out_text.splitlines()
    assert not re.search(r"^FAIL ", out_text, re.M)  # no line per case without -v
    by_reason: dict[str, int] = {}
    for s in skipped:
        by_reason[s.reason] = by_reason.get(s.reason, 0) + 1
    assert f"skipped {len(skipped)} by reason:" in out_text
    for reason, n in by_reason.items():
        assert re.search(rf"^    {n} {re.escape(reason)} \(", out_text, re.M), out_text
    md = (out / "summary.md").read_text()
    assert md.index(f"**{len(cases)} ran** ({len(cases)} fail) · {len(skipped)} skipped") < md.index("### Failures")
    for reason, n in by_reason.items():
        assert f"| {n} | {reason} |" in md
    assert "#### `aiter-triton`" not in md and "#### `torch`" in md  # grids only for what ran
    code, out_text, _ = _cli(capsys, "run", "matrices/full.yaml", "--filter", FULL_SLICE, *_run_args(db, out), "-v")
    assert code == 1 and len(re.findall(r"^FAIL tp1-", out_text, re.M)) == len(cases)


# --- 6. doctor --matrix agrees with orch run ------------------------------------------------------


@pytest.mark.skipif(os.path.exists("/dev/kfd"), reason="aiter can run on a ROCm machine")
def test_doctor_and_run_agree_on_a_matrix_with_a_provider_skipped_here(ray_cluster, tmp_path, capsys):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(
        f"extends: {os.path.join(REPO, 'matrices/full.yaml')}\nname: agree\ninclude: []\naxes:\n"
        "  tp: [1]\n  cudagraph_mode: [FULL]\n  kv_cache_dtype: [auto]\n  batch: [decode_7]\n"
        "  backend: [torch, aiter]\n  seed: [0]\n  spec_tokens: [0]\n"
    )
    run_code, _, err = _cli(capsys, "run", str(matrix), *_run_args(tmp_path / "r.db", tmp_path / "out"))  # the checker
    doctor_code, out, _ = _cli(capsys, "doctor", "--matrix", str(matrix), "--json")
    assert run_code == doctor_code == 0, err
    with ResultStore(str(tmp_path / "r.db")) as s:
        results = s.results(1)
    report = json.loads(out)["matrix"]
    assert [p["provider"] for p in report["usable"]] == sorted(
        {r.axes["backend"] for r in results if r.status != Status.SKIP}
    )
    assert [p["provider"] for p in report["unusable"]] == sorted(
        {r.axes["backend"] for r in results if r.status == Status.SKIP}
    )
    assert report["unusable"][0]["reason"] in {r.reason for r in results if r.status == Status.SKIP}


# --- 7. the worker count orch plan estimates for is the one orch run starts -----------------------


@pytest.mark.parametrize("workers,max_tp", [(None, 1), (None, 8), (3, 2)])
def test_plans_worker_layout_is_the_runs(ray_cluster, workers, max_tp):
    from orchestrator.executor.cluster import CPU_PER_WORKER, local_layout, node_slots

    (node,) = node_slots("cpu", workers, CPU_PER_WORKER, max_tp)  # what connect() gives the executor
    cpus = int(ray_cluster.cluster_resources()["CPU"])
    layout = local_layout("cpu", workers, max_tp, cpus=cpus, gpus=0)  # what orch plan assumes
    assert (layout.workers, layout.cores) == (node.slots, node.cores)
