"""--workers-per-gpu: tp 1 workers sharing a GPU through Ray's fractional GPUs, and its refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_three_workers_share_one_gpu():
    p = subprocess.run([sys.executable, "-m", "tests.executor.shared_gpu_script"], cwd=REPO, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": ""})  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(next(l for l in p.stdout.splitlines() if l.startswith("RESULT "))[len("RESULT "):])
    assert out["slots"] == 3 and "3 per GPU" in out["banner"]
    results = out["results"]
    assert len(results) == 12 and all(status == "pass" for status, _, _ in results.values())
    pids = {reason.split("pid=")[1] for _, reason, _ in results.values()}
    assert len(pids) == 3, results  # three actor processes ran cases, all on GPU 0
    assert {worker.split("@")[0] for _, _, worker in results.values()} == {"gpu0"}


@pytest.mark.parametrize("args,needle", [
    (["--workers-per-gpu", "2"], "the selection has tp 2 cases, whose ranks need whole GPUs"),
    (["--workers-per-gpu", "2", "--filter", "tp=1", "--devices", "cpu"], "--workers-per-gpu needs GPU workers"),
])
def test_refusals_are_one_line_exit_2(tmp_path, capsys, args, needle):
    db = tmp_path / "r.db"
    code = main(["run", "matrices/smoke.yaml", "--db", str(db), "--out", str(tmp_path / "o"), "--no-progress", *args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert "Traceback" not in err
