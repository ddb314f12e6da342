"""The Triton warm-up at the start of a local GPU run (backend/harness/precompile.py,
orchestrator/executor/precompile.py): which cases its helpers run, that they run them and stop,
and that the driver ends them. On the CPU the helpers run a torch backend that declares
jit_kernels (tests/executor/jit_backend.py); on the GPU the same code warms AITER's Triton cache."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from backend.harness.precompile import WARM_MODES, group_of, representatives, split
from orchestrator.executor import precompile as launcher
from orchestrator.matrix import load_matrix

JIT = "tests.executor.jit_backend:JitTorchBackend"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def full_cases():
    return load_matrix(os.path.join(ROOT, "matrices/full.yaml"), devices="cpu", backend_checks=False).cases


@pytest.mark.parametrize(
    "jit, expect_backends",
    [
        ({"aiter-triton"}, {"aiter-triton"}),
        ({"aiter-triton", "aiter-triton-pa"}, {"aiter-triton", "aiter-triton-pa"}),
        (set(), set()),
        ({"no-such-backend"}, set()),
    ],
)
def test_representatives_cover_every_group_of_the_jit_backends_at_tp1(full_cases, jit, expect_backends):
    reps = representatives(full_cases, jit)
    assert {c.backend for c in reps} == expect_backends
    assert all(c.tp == 1 and c.mode in WARM_MODES for c in reps)
    groups = {group_of(c) for c in full_cases if c.tp == 1 and c.backend in jit}
    assert {group_of(c) for c in reps} == groups  # every group warmed
    assert len(reps) == len({(group_of(c), c.mode) for c in reps})  # once per (group, mode)
    assert len(reps) < len([c for c in full_cases if c.tp == 1 and c.backend in jit]) or not reps


def test_a_group_without_the_warm_modes_is_warmed_by_its_first_case(full_cases):
    none_only = [c for c in full_cases if c.tp == 1 and c.backend == "aiter-triton" and c.mode in ("NONE", "PIECEWISE")]
    reps = representatives(none_only, {"aiter-triton"})
    assert len(reps) == len({group_of(c) for c in none_only})
    firsts = {}
    for c in none_only:
        firsts.setdefault(group_of(c), c)
    assert reps == list(firsts.values())


@pytest.mark.parametrize("n, jobs, sizes", [(7, 3, [3, 2, 2]), (2, 3, [1, 1]), (5, 1, [5]), (4, 0, [4])])
def test_split_is_round_robin_and_covers_each_case_once(n, jobs, sizes):
    parts = split(list(range(n)), jobs)
    assert [len(p) for p in parts] == sizes
    assert sorted(x for p in parts for x in p) == list(range(n))
    assert parts[0][0] == 0 and (len(parts) == 1 or parts[1][0] == 1)  # each helper starts near the front


def _tiny_cases(full_cases, backend: str, n: int):
    picked = [
        c
        for c in full_cases
        if c.tp == 1
        and c.backend == "torch"
        and c.batch.name == "decode_1"
        and c.kv_cache_dtype == "auto"
        and c.spec_tokens == 0
        and c.seed == 0
    ][:n]
    return [dataclasses.replace(c, backend=backend) for c in picked]


def _helper(tmp_path, cases, *args, timeout=120):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([c.to_dict() for c in cases]))
    env = {**os.environ, "PYTHONPATH": ROOT, "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    return subprocess.run(
        [sys.executable, "-m", "backend.harness.precompile", "--cases", str(path), "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def test_helpers_run_the_representatives_of_jit_backends_only(tmp_path, full_cases):
    jit = _tiny_cases(full_cases, JIT, 5)
    plain = _tiny_cases(full_cases, "torch", 5)
    assert len(jit) == 5
    out = _helper(tmp_path, [*jit, *plain], "--jobs", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    ran = [
        line.split()[1:3] for line in out.stdout.splitlines() if line.startswith("precompile: ") and " (helper " in line
    ]
    want = {c.case_id for c in jit if c.mode in WARM_MODES}
    assert {cid for cid, _ in ran} == want and len(ran) == len(want)
    assert all(status == "ran" for _, status in ran)
    assert "over 2 helper(s)" in out.stdout
    assert "complete, marker" in out.stdout
    again = _helper(tmp_path, [*jit, *plain], "--jobs", "2")  # the same warm-up, completed: a no-op
    assert again.returncode == 0 and "already warm" in again.stdout and " (helper " not in again.stdout
    other = _helper(tmp_path, jit[:2], "--jobs", "1")  # other representatives: another marker
    assert " (helper " in other.stdout


@pytest.mark.parametrize(
    "args, expect",
    [
        (("--jobs", "0"), "nothing to warm"),
        (("--jobs", "2", "--deadline-s", "0"), "done"),
    ],
)
def test_helpers_with_nothing_to_do_run_nothing(tmp_path, full_cases, args, expect):
    out = _helper(tmp_path, _tiny_cases(full_cases, JIT, 5), *args)
    assert out.returncode == 0, out.stdout + out.stderr
    assert expect in out.stdout
    assert " (helper " not in out.stdout
    assert not list((tmp_path / "triton").glob("orch-precompile-*"))  # nothing warmed: no marker


def test_helpers_stop_when_the_driver_is_gone(tmp_path, full_cases):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    out = _helper(tmp_path, _tiny_cases(full_cases, JIT, 5), "--jobs", "1", "--parent", str(gone.pid))
    assert out.returncode == 0, out.stdout + out.stderr
    assert " (helper " not in out.stdout  # not one case ran for a driver that is not there


def test_unreadable_case_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "cases.json"
    bad.write_text("{not json")
    out = subprocess.run(
        [sys.executable, "-m", "backend.harness.precompile", "--cases", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert out.stdout.strip().startswith("precompile: cannot read") and len(out.stdout.strip().splitlines()) == 1


def test_driver_starts_the_helpers_and_stop_ends_their_process_group(tmp_path, full_cases):
    cases = _tiny_cases(full_cases, JIT, 5)
    warm = launcher.start(cases, jobs=1, log_dir=str(tmp_path), device="cpu")
    assert warm is not None and warm.count == len(cases) and warm.running()
    from backend.case import Case
    from orchestrator.scheduling.cost import estimate_all

    written = [Case.from_dict(d) for d in json.loads(open(warm.cases_path).read())]
    est = estimate_all(cases, {})
    assert sorted(c.case_id for c in written) == sorted(c.case_id for c in cases)
    assert [est[c.case_id] for c in written] == sorted(est.values(), reverse=True)  # the dispatcher's order
    time.sleep(0.5)
    warm.stop()
    assert not warm.running()
    with pytest.raises(ProcessLookupError):
        os.killpg(warm.proc.pid, 0)  # the whole group, helpers included
    assert not os.path.exists(warm.cases_path)
    assert os.path.exists(warm.log_path)


def _wait_for(path, text: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path) and text in open(path).read():
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {path} after {timeout_s}s")


def test_a_run_that_covered_the_warm_up_completes_it(tmp_path, full_cases, monkeypatch):
    """A run that ran every case before its helpers finished: stop(covered=True) asks them to end
    and leave their marker (the worker compiled what they had left), so the next run starts none;
    a plain stop() leaves no marker. The helpers run a backend held while a file exists, so they
    are certainly not done when stopped (a helper that finished first left its marker on a fast
    machine, and the `covered=False` half failed)."""
    from tests.executor.jit_backend import HOLD_ENV

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    hold = tmp_path / "hold"
    hold.touch()
    monkeypatch.setenv(HOLD_ENV, str(hold))
    cases = _tiny_cases(full_cases, "tests.executor.jit_backend:HeldJitBackend", 5)
    for covered in (False, True):
        warm = launcher.start(cases, jobs=1, log_dir=str(tmp_path / f"run-{covered}"), device="cpu")
        _wait_for(warm.log_path, "over 1 helper(s)")  # started; held in its first case until stopped
        warm.stop(covered=covered)
        assert not warm.running()
        assert bool(list((tmp_path / "triton").glob("orch-precompile-*.done"))) == covered
    assert "covered by the run, complete, marker" in open(warm.log_path).read()
    again = launcher.start(cases, jobs=1, log_dir=str(tmp_path / "next-run"), device="cpu")
    try:
        _wait_for(again.log_path, "already warm")  # the next run's helpers have nothing to do
    finally:
        again.stop()


def test_covered_means_every_tp1_case_came_to_a_verdict(full_cases):
    from backend.result import CaseResult, Status

    cases = [c for c in full_cases if c.tp == 1][:4] + [c for c in full_cases if c.tp == 2][:1]

    def results(*statuses, kind=""):
        return {
            c.case_id: CaseResult(case_id=c.case_id, status=s, requested_mode=c.mode, error_kind=kind)
            for c, s in zip(cases, statuses)
        }

    assert launcher.covered(cases, results(Status.PASS, Status.FAIL, Status.ERROR, Status.SKIP))
    assert not launcher.covered(cases, results(Status.PASS, Status.PASS, Status.PASS))  # one never came back
    assert not launcher.covered(cases, results(Status.PASS, Status.TIMEOUT, Status.PASS, Status.PASS))
    assert not launcher.covered(cases, results(Status.PASS, Status.PASS, Status.PASS, Status.NOT_RUN))
    assert not launcher.covered(cases, results(Status.ERROR, Status.PASS, Status.PASS, Status.PASS, kind="crash"))
    assert not launcher.covered(cases[4:], {})  # no tp 1 case: nothing was warmed


def test_driver_does_nothing_without_jobs_or_tp1_cases(tmp_path, full_cases):
    assert launcher.start(_tiny_cases(full_cases, JIT, 2), jobs=0, log_dir=str(tmp_path)) is None
    tp2 = [c for c in full_cases if c.tp == 2][:3]
    assert launcher.start(tp2, jobs=2, log_dir=str(tmp_path)) is None


@pytest.mark.parametrize(
    "env, jobs, expect", [("", 2, 2), ("0", None, 0), ("5", None, 5), ("", None, launcher.auto_jobs())]
)
def test_jobs_come_from_the_option_then_the_environment(monkeypatch, env, jobs, expect):
    monkeypatch.setenv(launcher.ENV, env)
    assert launcher.resolve_jobs(jobs) == expect


@pytest.mark.parametrize(
    "cores, other_work, expect", [(16, False, 3), (16, True, 1), (4, False, 1), (128, False, 3), (2, True, 1)]
)
def test_auto_jobs_one_helper_when_the_worker_has_other_work(monkeypatch, cores, other_work, expect):
    monkeypatch.setenv(launcher.ENV, "")
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: cores)
    assert launcher.resolve_jobs(None, other_work=other_work) == expect
    monkeypatch.setenv(launcher.ENV, "2")  # asked for: the rule does not apply
    assert launcher.resolve_jobs(None, other_work=other_work) == 2


def test_a_bad_environment_value_is_an_input_error(monkeypatch):
    from orchestrator.errors import InputError

    monkeypatch.setenv(launcher.ENV, "many")
    with pytest.raises(InputError, match="ORCH_PRECOMPILE_JOBS"):
        launcher.resolve_jobs(None)


def test_negative_precompile_jobs_is_one_line_and_exit_2(tmp_path, capsys):
    from orchestrator.cli import main

    code = main(
        [
            "run",
            os.path.join(ROOT, "matrices/full.yaml"),
            "--precompile-jobs",
            "-1",
            "--db",
            str(tmp_path / "x.db"),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == ["orch: --precompile-jobs must be >= 0, got -1"]
    assert not (tmp_path / "x.db").exists()  # refused before anything was recorded


def test_warm_kernels_runs_a_cases_steps_and_graphs_without_checks(full_cases):
    """The helpers' per-case work: every step's eager and graph run through the backend (its
    kernels), the graphs the case dispatches to captured, no context written."""
    import torch

    from backend.attention.registry import get_backend
    from backend.harness.checker import SessionCache, _dispatch_plan, _session_plan, warm_kernels
    from tests.executor.jit_backend import CountingJitBackend

    case = dataclasses.replace(
        _tiny_cases(full_cases, "tests.executor.jit_backend:CountingJitBackend", 5)[0], mode="FULL_AND_PIECEWISE"
    )
    sessions = SessionCache(capacity=1)
    CountingJitBackend.calls = 0
    assert warm_kernels(case, device=torch.device("cpu"), sessions=sessions) is True
    plan = _session_plan(case, get_backend(case.backend), 0, torch.device("cpu"))
    steps, _, keys = _dispatch_plan(case, plan.mode, plan.sizes)
    session = sessions.get(plan.key, lambda: pytest.fail("warm_kernels did not keep its session"))
    assert {k for k in keys if k is not None} <= set(session.graphs)
    # eager + graph run per step, one attention call per layer each (capture's own runs on top)
    assert CountingJitBackend.calls >= 2 * len(steps) * case.model.num_layers


@pytest.mark.parametrize("change", [{"tp": 2}, {"backend": "no.such.module:Backend"}])
def test_warm_kernels_does_not_run_what_the_worker_would_not(full_cases, change):
    import torch

    from backend.attention.registry import BackendLoadError
    from backend.harness.checker import SessionCache, warm_kernels

    case = dataclasses.replace(_tiny_cases(full_cases, JIT, 1)[0], **change)
    if "backend" in change:
        with pytest.raises(BackendLoadError):
            warm_kernels(case, device=torch.device("cpu"), sessions=SessionCache())
    else:
        assert warm_kernels(case, device=torch.device("cpu"), sessions=SessionCache()) is False


class _Helpers:
    def __init__(self, alive: bool):
        self.alive = alive

    def running(self) -> bool:
        return self.alive


@pytest.mark.parametrize(
    "backends, warmup, expected",
    [
        (("torch", "aiter-triton", "aiter-triton-pa"), _Helpers(True), {"aiter-triton", "aiter-triton-pa"}),
        (("torch", JIT), _Helpers(True), {JIT}),  # a plugin that declares jit_kernels
        (("torch", "aiter-emulated"), _Helpers(True), None),  # nothing to wait for
        (("torch", "aiter-triton"), None, None),  # no warm-up (CPU, a joined cluster, jobs 0)
    ],
)
def test_the_run_defers_the_backends_its_warm_up_compiles(full_cases, backends, warmup, expected):
    from orchestrator.commands.run import _deferral, _jit_backends

    cases = [dataclasses.replace(full_cases[0], backend=b) for b in backends]
    deferral = _deferral(_jit_backends(cases), warmup)
    if expected is None:
        assert deferral is None
        return
    assert deferral.backends == expected
    assert deferral.pending() is True
    warmup.alive = False
    assert deferral.pending() is False  # asks the helpers each time, so the wait ends with them
