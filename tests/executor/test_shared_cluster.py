"""Three `orch run` drivers at once on one Ray cluster and one PostgreSQL database.

The cluster is a `ray start --head` of its own (1 CPU, 2 fake GPUs, token auth on): drivers A and
B run CPU workers (real gloo tp 2 gangs; fake GPUs cannot form NCCL gangs) and ask for more than
the CPU there is, so one waits for the other's workers; driver C runs on the fake GPUs, capped to
one by --max-gpus. Every case of every run must be recorded once, and each gate must be what its
matrix slice makes it (tests/executor/shared_runner.py fails exactly the FULL fp8 cases).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from orchestrator.errors import InputError
from orchestrator.store import ResultStore

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Per case: A's 28 cases on 4 workers hold the CPU ~20 s after B starts, well past B's 5 s notice
# even when B's own start-up is slow on a loaded machine.
HOLD_S = "3.0"
RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_tree(proc: subprocess.Popen, tag: str) -> None:
    """The head's process group (ray start --block and its daemons), then anything of this head
    left outside it (worker processes name its temp dir): only what this fixture started."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        time.sleep(2)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if tag.encode() in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


@pytest.fixture(scope="module")
def ray_head():
    """A persistent head as CI would keep one: 1 CPU, 2 fake GPUs, on this machine only."""
    if not os.path.exists(RAY):
        pytest.skip(f"no ray CLI beside {sys.executable}")
    tmp = tempfile.mkdtemp(prefix="orch-head-", dir="/tmp")
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "ORCH_TEST_HOLD_S": HOLD_S, "PYTHONPATH": REPO}
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen(
        [
            RAY,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=1",
            "--num-gpus=2",
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={tmp}",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    probe = f"import ray; ray.init(address={address!r}, log_to_driver=False); assert ray.cluster_resources().get('GPU') == 2"
    try:
        deadline = time.monotonic() + 120
        while True:
            ok = (
                subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=120).returncode == 0
            )
            if ok:
                break
            if time.monotonic() > deadline or head.poll() is not None:
                pytest.fail(f"ray head did not come up at {address}", pytrace=False)
            time.sleep(1)
        yield address, env
    finally:
        _kill_tree(head, tmp)
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


# driver -> (orch run arguments, expected exit code)
DRIVERS = {
    "A": (
        [
            "--devices",
            "cpu",
            "--workers",
            "4",
            "--label",
            "main",
            "--filter",
            "attention=gqa backend=torch cudagraph_mode=NONE,PIECEWISE,FULL_DECODE_ONLY,FULL_AND_PIECEWISE",
        ],
        0,
    ),
    "B": (
        [
            "--devices",
            "cpu",
            "--workers",
            "4",
            "--label",
            "pr-1",
            "--filter",
            "attention=gqa backend=torch cudagraph_mode=FULL",
        ],
        1,
    ),
    # auto: the driver's machine has no GPU (the matrix is planned for CPU shapes), the cluster has.
    "C": (
        [
            "--devices",
            "auto",
            "--max-gpus",
            "1",
            "--label",
            "gpu",
            "--filter",
            "attention=gqa backend=torch cudagraph_mode=FULL_AND_PIECEWISE tp=1",
        ],
        0,
    ),
}


def _driver(name: str, address: str, env: dict, db: str, out: str) -> subprocess.Popen:
    args, _ = DRIVERS[name]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            "matrices/smoke.yaml",
            "--address",
            address,
            "--db",
            db,
            "--out",
            out,
            "--no-progress",
            *args,
        ],
        cwd=REPO,
        env={**env, "ORCH_RUNNER": "tests.executor.shared_runner:shared_runner"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_three_drivers_share_one_cluster_and_one_database(ray_head, pg_url, pg_server, tmp_path):
    address, env = ray_head
    procs = {"A": _driver("A", address, env, pg_url, str(tmp_path / "A"))}
    # A first, holding the CPU; B and C while A's cases run.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and procs["A"].poll() is None:
        try:
            with ResultStore(pg_url, readonly=True) as s:
                if s.latest_run_id() is not None and s.run(s.latest_run_id()).num_results > 0:
                    break
        except InputError:  # not created or migrated yet
            pass
        time.sleep(0.3)
    procs["B"] = _driver("B", address, env, pg_url, str(tmp_path / "B"))
    procs["C"] = _driver("C", address, env, pg_url, str(tmp_path / "C"))
    outs = {k: p.communicate(timeout=400) for k, p in procs.items()}
    for name, p in procs.items():
        assert p.returncode == DRIVERS[name][1], (name, outs[name][1][-3000:])
        assert pg_server.password not in outs[name][0] + outs[name][1]
    with ResultStore(pg_url, readonly=True) as store:
        runs = {r.label: r for r in store.runs()}
        assert set(runs) == {"main", "pr-1", "gpu"}
        for label, run in runs.items():
            results = store.results(run.id)
            planned = [c.case_id for c in store.planned_cases(run.id)]
            # Every case of every run recorded once: one final row per planned case, and as many
            # attempts in the log as the result says (no case ran twice, none lost).
            assert run.status == "finished" and sorted(r.case_id for r in results) == sorted(planned) and planned
            assert store.missing_case_ids(run.id) == []
            for r in results:
                assert len(store.attempt_log(run.id, r.case_id)) == r.attempts, (label, r.case_id)
        b = {r.case_id: r for r in store.results(runs["pr-1"].id)}
        failing = sorted(cid for cid, r in b.items() if r.status.value == "fail")
        assert failing == sorted(cid for cid in b if "-FULL-fp8-" in cid) and failing
        c = store.results(runs["gpu"].id)
        assert [r.status.value for r in c] == ["pass"] * 6 and all(r.worker.startswith("gpu") for r in c), c[0]
        assert len({r.worker for r in c}) == 1, {r.worker for r in c}  # --max-gpus 1: one GPU at a time
        assert runs["gpu"].device_model == "Fake GPU 80GB" and runs["main"].device_model == "cpu", (
            {r.device for r in c},
            runs,
        )
    out_b, err_b = outs["B"]  # what the run concluded on stdout, waiting notices on stderr
    assert 'case: "tp*-FULL-fp8-*-torch-s0"' in out_b  # the paste-ready entry, narrowed
    assert f"gate FAILED: {len(failing)} new failures" in out_b
    # B asked for CPU that A held: it waited and said so, instead of failing its placements.
    assert "waiting for" in err_b and "held by other jobs on this cluster" in err_b, err_b[-3000:]
