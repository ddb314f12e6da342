"""The pytest plugin: same case ids and verdicts as `orch run`, GPU pinning per xdist worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.pytest_plugin import pin_worker_gpu

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PINNING = {
    # worker, existing mask, expected GPU
    "gw0 takes the first visible GPU": ("gw0", "3,5", "3"),
    "gw1 takes the second": ("gw1", "3,5", "5"),
    "more workers than GPUs wrap around": ("gw2", "3,5", "3"),
    "the controller is not pinned": (None, "3,5", None),
}


@pytest.mark.parametrize("scenario", PINNING)
def test_pin_worker_gpu(scenario, monkeypatch):
    worker, mask, expected = PINNING[scenario]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mask)
    env: dict[str, str] = {}
    assert pin_worker_gpu(worker, env) == expected
    if expected is not None:
        assert env == {"CUDA_VISIBLE_DEVICES": expected, "HIP_VISIBLE_DEVICES": expected}


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_plugin_verdicts_match_orch_run(smoke_run, tmp_path):
    _, _, run_results, _ = smoke_run
    out = tmp_path / "statuses.json"
    junit = tmp_path / "junit.xml"
    # tp 1 and tp 2 (a local gloo gang), torch and aiter-emulated, under two xdist workers.
    flt = "batch=mixed_small cudagraph_mode=FULL,FULL_AND_PIECEWISE"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "orchestrator.pytest_plugin",
        "--orch-matrix",
        "matrices/smoke.yaml",
        "--orch-devices",
        "cpu",
        "--orch-filter",
        flt,
        "--orch-results",
        str(out),
        "-n",
        "2",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        "matrices/",
    ]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    statuses = json.loads(out.read_text())
    assert len(statuses) >= 5 and any(cid.startswith("tp2-") for cid in statuses)
    assert statuses == {cid: run_results[cid].status.value for cid in statuses}
    # node id = case id: JUnit names the items by case id as well.
    xml = junit.read_text()
    assert all(f'name="{cid}"' in xml for cid in statuses)
