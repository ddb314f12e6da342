"""A GPU worker runs torch on its share of its node's cores, not on every core: the pure rule
(threads.worker_threads) and, on a Ray cluster of fake GPUs with torch preloaded in its workers,
what each worker's torch reports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.executor.cluster import ClusterInfo, DeviceKind, NodeSlots
from orchestrator.executor.threads import worker_threads

SHARES = [
    # (name, node cores, node slots, worker width in slots, threads)
    ("one worker per GPU, 8 GPUs, 128 cores", 128, 8, 1, 16),
    ("4 per GPU on one GPU, 16 cores", 16, 4, 1, 4),
    ("8 per GPU on one GPU, 16 cores", 16, 8, 1, 2),
    ("a gang's rank holds a whole GPU (4 slots)", 16, 8, 4, 8),
    ("a worker two shares wide", 16, 8, 2, 4),
    ("more workers than cores: at least one", 4, 32, 1, 1),
    ("cores unknown: one", 0, 8, 1, 1),
]


@pytest.mark.parametrize("name,cpus,slots,width,expected", SHARES, ids=[s[0] for s in SHARES])
def test_worker_threads(name, cpus, slots, width, expected):
    assert worker_threads(cpus, slots, width) == expected


def test_the_banner_says_the_threads():
    info = ClusterInfo("local", DeviceKind.GPU, (NodeSlots("n", "1.2.3.4", 4, cpus=16),), workers_per_gpu=4)
    assert info.banner == "4 GPU worker(s), 4 per GPU on 1 node(s), 4 torch threads each (16 cores / 4 workers)"


def test_a_gpu_worker_runs_its_share_of_the_cores(tmp_path):
    """12 cores, 2 fake GPUs, 2 workers per GPU (4 slots): a tp 1 worker runs 3 torch threads, a tp 2
    gang's rank (a whole GPU: 2 slots) 6, though torch was imported before the actor started."""
    log = tmp_path / "cases.jsonl"
    proc = subprocess.run(
        [sys.executable, "tests/executor/packing_script.py", "2", str(log), "threads"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["statuses"] == ["pass"] and "3 torch threads each (12 cores / 4 workers)" in report["banner"]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    by_tp = {tp: {(r["torch_threads"], r["omp"]) for r in rows if r["tp"] == tp} for tp in (1, 2)}
    assert by_tp == {1: {(3, "3")}, 2: {(6, "6")}}
