"""`orch run` end to end: the real checker on smoke.yaml, resume after SIGKILL, unreachable cluster."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

from orchestrator.commands import run as run_cmd
from orchestrator.store import NewRun, ResultStore
from tests.executor.faulty_backends import hold_path

pytestmark = pytest.mark.xdist_group("ray")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _orch(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


@pytest.mark.slow
def test_smoke_matrix_passes_end_to_end(smoke_run):
    code, tmp, results, run = smoke_run
    assert code == 0
    assert run.status == "finished" and run.num_results == run.num_cases == len(results) > 0
    backends = {r.axes["backend"] for r in results.values()}
    assert {"torch", "aiter-emulated"} <= backends
    ran = [r for r in results.values() if r.status.value != "skip"]
    assert all(r.status.value == "pass" for r in ran), [r for r in ran if r.status.value != "pass"][:2]
    assert any(r.axes["tp"] == 2 for r in ran)  # gloo gangs ran too
    assert all(r.worker and r.graph_kind in ("emulated", "none") for r in ran)
    for name in ("junit.xml", "summary.md"):
        assert (tmp / "out" / name).stat().st_size > 0


@pytest.mark.slow
def test_resume_after_sigkill_runs_only_the_missing_cases(ray_cluster, tmp_path):
    # The child joins the session cluster (no second cluster on this machine).
    address = ray_cluster.get_runtime_context().gcs_address
    db = str(tmp_path / "r.db")
    args = [
        "run",
        "matrices/smoke.yaml",
        "--db",
        db,
        "--out",
        str(tmp_path / "out"),
        "--devices",
        "cpu",
        "--address",
        address,
        "--no-progress",
        "--workers",
        "2",
    ]
    env = {"ORCH_RUNNER": "tests.executor.faulty_backends:held_runner"}
    # The workers stop making progress once 5 results are stored, until the hold file goes: the
    # kill lands in the middle of the run on a fast machine as on a loaded one (no race with a poll).
    hold = hold_path(address)
    with open(hold, "w") as f:
        json.dump({"db": db, "after": 5}, f)
    try:
        child = _orch(*args, env=env)
        deadline = time.monotonic() + 180  # a safety net only: the hold, not the clock, stops the run
        done = 0
        while time.monotonic() < deadline and child.poll() is None and done < 5:
            time.sleep(0.3)
            try:
                with sqlite3.connect(db) as con:
                    done = con.execute("SELECT count(*) FROM results").fetchone()[0]
            except sqlite3.Error:
                continue
        assert done >= 5 and child.poll() is None, (done, child.poll())
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        os.unlink(hold)
    with ResultStore(db) as store:
        rid = store.latest_run_id()
        planned = {c.case_id for c in store.planned_cases(rid)}
        missing_before = set(store.missing_case_ids(rid))
        assert store.run(rid).status == "running"  # killed: nobody closed it
    assert 0 < len(missing_before) < len(planned)

    resumed = _orch(*args, "--resume", str(rid), env=env)
    _out, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err[-2000:]
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT case_id, count(*) FROM results WHERE run_id = ? GROUP BY case_id", (rid,)).fetchall()
        attempts = dict(
            con.execute(
                "SELECT case_id, count(*) FROM attempt_log WHERE run_id = ? GROUP BY case_id", (rid,)
            ).fetchall()
        )
        status = con.execute("SELECT status FROM runs WHERE id = ?", (rid,)).fetchone()[0]
    assert {cid for cid, _ in rows} == planned and all(n == 1 for _, n in rows)
    assert all(n == 1 for n in attempts.values())  # nothing ran twice: the resume ran only the missing
    assert status == "finished"
    assert f"resuming run {rid} (matrices/smoke.yaml): {len(missing_before)} cases without a final verdict" in err
    # Into run 1's own --out (given again here): its summary is run 1's, finished.
    assert open(tmp_path / "out" / "summary.md").read().startswith(f"## ✅ orch run {rid} — `matrices/smoke.yaml`\n")


def test_unreachable_cluster_is_exit_3_in_one_line(tmp_path):
    with socket.socket() as s:  # a loopback port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    p = _orch(
        "run",
        "matrices/smoke.yaml",
        "--db",
        str(tmp_path / "r.db"),
        "--out",
        str(tmp_path / "o"),
        "--devices",
        "cpu",
        "--address",
        f"127.0.0.1:{port}",
    )
    _out, err = p.communicate(timeout=60)
    assert p.returncode == 3
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and "unreachable" in lines[0] and f"127.0.0.1:{port}" in lines[0], err
    assert time.monotonic() - t0 < 30


# --backend -> (exit code, status of every case, text in reason or log tail)
# scenario: (backend class, status, text in reason or log tail, per-case timeout). Only the hang
# needs a short deadline; the others get room for a slow actor start on a loaded 2-core machine.
BROKEN_BACKENDS = {
    "forward kills the worker": ("CrashBackend", "error", "os._exit in forward", 60),
    "forward hangs": ("HangBackend", "timeout", "no result within 3s", 3),
    "forward hits a device error": ("DeviceErrorBackend", "error", "worker recycled", 60),
}


@pytest.mark.parametrize("scenario", BROKEN_BACKENDS)
def test_orch_run_with_a_broken_backend_fails_the_gate(ray_cluster, tmp_path, scenario):
    cls, status, text, timeout_s = BROKEN_BACKENDS[scenario]
    db = str(tmp_path / "r.db")
    code = run_cmd.main(
        "matrices/smoke.yaml",
        backend=f"tests.executor.faulty_backends:{cls}",
        filter_expr="attention=gqa tp=1 cudagraph_mode=NONE kv_cache_dtype=auto batch=decode_7",
        db=db,
        out_dir=str(tmp_path / "out"),
        devices="cpu",
        timeout_s=timeout_s,
        no_progress=True,
    )
    assert code == 1
    with ResultStore(db) as store:
        (res,) = store.results(store.latest_run_id())
    assert res.status.value == status and res.attempts == 2
    assert text in res.reason + res.log_tail, res


# The device error is raised by every attention forward: in the FULL modes that is first the graph
# warm-up inside ensure_graphs (before: labelled a capture error, not retried, worker kept and the
# next case blamed); PIECEWISE captures only dense pieces, so it surfaces in the eager step.
DEVICE_ERROR_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


@pytest.mark.parametrize("mode", DEVICE_ERROR_MODES)
def test_a_device_error_recycles_the_worker_in_every_mode(ray_cluster, tmp_path, mode):
    db = str(tmp_path / "r.db")
    code = run_cmd.main(
        "matrices/smoke.yaml",
        backend="tests.executor.faulty_backends:DeviceErrorBackend",
        filter_expr=f"attention=gqa tp=1 cudagraph_mode={mode} kv_cache_dtype=auto batch=decode_7",
        db=db,
        out_dir=str(tmp_path / "out"),
        devices="cpu",
        no_progress=True,
    )
    assert code == 1
    with ResultStore(db) as store:
        rid = store.latest_run_id()
        (res,) = store.results(rid)
        log = store.attempt_log(rid, res.case_id)
    assert res.status.value == "error" and res.error_kind == "exception", res
    assert "worker recycled" in res.reason and "capture error" not in res.reason
    assert res.attempts == 2 and [a["attempt"] for a in log] == [1, 2]


def test_a_capture_error_is_reported_once_and_keeps_the_worker(ray_cluster, tmp_path):
    """A graph capture error names cudaError*, but it is neither retried nor a reason to recycle the
    worker: the mixed cases after it run on the same actor (same pid) and pass."""
    db = str(tmp_path / "r.db")
    code = run_cmd.main(
        "matrices/smoke.yaml",
        backend="tests.executor.faulty_backends:CaptureErrorBackend",
        filter_expr="attention=gqa tp=1 cudagraph_mode=FULL,PIECEWISE kv_cache_dtype=auto batch=decode_7,mixed_small",
        db=db,
        out_dir=str(tmp_path / "out"),
        devices="cpu",
        workers=1,
        no_progress=True,
    )
    assert code == 1
    with ResultStore(db) as store:
        results = {r.axes["cudagraph_mode"] + "/" + r.axes["batch"]: r for r in store.results(store.latest_run_id())}
        rid = store.latest_run_id()
        log = store.attempt_log(rid, results["FULL/decode_7"].case_id)
    bad = results["FULL/decode_7"]
    assert bad.status.value == "error" and bad.error_kind == "capture" and bad.attempts == 1
    assert "cudaErrorStreamCaptureInvalidated" in bad.reason + bad.log_tail and "recycled" not in bad.reason
    assert [a["attempt"] for a in log] == [1]
    # PIECEWISE captures only the dense pieces: every PIECEWISE case passes, on one worker
    piecewise = [r for k, r in results.items() if k.startswith("PIECEWISE/")]
    assert len(piecewise) == 2 and all(r.status.value == "pass" for r in piecewise)
    assert len({r.worker for r in results.values()}) == 1


def test_resume_reruns_a_case_whose_retry_never_ran(ray_cluster, tmp_path, monkeypatch):
    """A driver killed between a case's failed first attempt and its retry: the resume must run it
    again (before: the first attempt's row counted as done, and the gate saw a lone failure)."""
    from backend.result import Status
    from orchestrator.filters import select
    from orchestrator.matrix import load_matrix
    from tests.results.samples import result_for

    db = str(tmp_path / "r.db")
    flt = "tp=1 cudagraph_mode=NONE,FULL kv_cache_dtype=auto"
    cases = select(load_matrix("matrices/smoke.yaml", devices="cpu").cases, flt)
    assert len(cases) >= 3
    half, absent = cases[0], cases[1]
    with ResultStore(db) as store:
        rid = store.create_run(NewRun(matrix="matrices/smoke.yaml", cases=cases))
        store.record(rid, result_for(half, Status.FAIL, reason="first attempt"), final=False)
        store.record_many(rid, [(result_for(c), True) for c in cases[2:]])
    monkeypatch.setenv(run_cmd.RUNNER_ENV, "tests.executor.faulty_backends:slow_runner")
    code = run_cmd.main(
        "matrices/smoke.yaml",
        filter_expr=flt,
        db=db,
        out_dir=str(tmp_path / "out"),
        devices="cpu",
        resume_run=str(rid),
        no_progress=True,
    )
    assert code == 0
    with ResultStore(db) as store:
        assert store.missing_case_ids(rid) == []
        final = {r.case_id: r for r in store.results(rid)}
        assert final[half.case_id].status == Status.PASS and "slow pid=" in final[half.case_id].reason
        assert [a["status"] for a in store.attempt_log(rid, half.case_id)] == ["fail", "pass"]
        assert [a["status"] for a in store.attempt_log(rid, absent.case_id)] == ["pass"]
        assert all(len(store.attempt_log(rid, c.case_id)) == 1 for c in cases[2:])  # not re-run
        assert store.writer_of(rid) is None  # lock released


@pytest.mark.slow
def test_the_driver_of_orch_run_does_not_import_torch(ray_cluster, tmp_path):
    # Start-up: plan, Ray, dispatch, the gang merge (smoke.yaml has tp 2 cases), the store and
    # the outputs run in a driver that never imports torch/triton/aiter; only the actors do.
    address = ray_cluster.get_runtime_context().gcs_address
    code = f"""
import sys
from orchestrator.commands import run as run_cmd
rc = run_cmd.main("matrices/smoke.yaml", db={str(tmp_path / "d.db")!r}, out_dir={str(tmp_path / "out")!r},
                  address={address!r}, no_progress=True, workers=2)
print("RESULT", rc, sorted(m for m in ("torch", "triton", "aiter") if m in sys.modules))
"""
    env = {**os.environ, "PYTHONPATH": REPO, "ORCH_RUNNER": "benchmarks.dispatch_bench:noop_runner"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT")]
    assert line == ["RESULT 0 []"], (done.stdout[-1500:], done.stderr[-1500:])
    with ResultStore(str(tmp_path / "d.db")) as store:
        rid = store.latest_run_id()
        assert store.run(rid).num_results == store.run(rid).num_cases > 0
