"""Start and stop the kernel-cache warm-up of a local GPU run (backend/harness/precompile.py).

The driver imports no torch: it writes the run's tp 1 cases (longest expected first, the order the
dispatcher hands them out) to a JSON file and starts `python -m backend.harness.precompile` in its own
process group, before Ray's cluster starts, so that the helpers' imports and compiles overlap the
cluster's and the workers' start-up. `stop()` ends the group when the run is over (the helpers
also stop by themselves at their deadline or when the driver is gone).

Only for the embedded local cluster (the helpers warm the cache of this machine, which is where
the workers run) and GPU devices.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from backend.case import Case
from backend.result import CaseResult, Status
from orchestrator.scheduling.cost import estimate_all

AUTO_JOBS_MAX = 3  # helpers share the GPU's memory with the worker (a session each: GBs)
ENV = "ORCH_PRECOMPILE_JOBS"  # a default for --precompile-jobs (0 turns the warm-up off)


def covered(cases: Sequence[Case], results: Mapping[str, CaseResult]) -> bool:
    """Whether a run ran every tp 1 case in its workers to a verdict (none timed out, crashed or
    never ran): then Triton's cache holds every kernel the warm-up's representatives need, and
    `Precompile.stop(covered=True)` lets the helpers leave their marker."""
    tp1 = [c.case_id for c in cases if c.tp == 1]
    return bool(tp1) and all(
        cid in results
        and results[cid].status not in (Status.TIMEOUT, Status.NOT_RUN)
        and results[cid].error_kind != "crash"
        for cid in tp1
    )


def auto_jobs(other_work: bool = False) -> int:
    """Helpers when none were asked for. `other_work`: the run has cases of backends that compile
    nothing, which it dispatches while the helpers run (executor.Deferral): then one helper, since
    the helpers' GPU contexts time-slice with the worker's and one still keeps ahead of it
    (docs/BENCHMARKS.md). With nothing else to run, up to AUTO_JOBS_MAX compile in parallel."""
    if other_work:
        return 1
    return max(1, min(AUTO_JOBS_MAX, (os.cpu_count() or 1) // 4))


def resolve_jobs(jobs: int | None, other_work: bool = False) -> int:
    if jobs is not None:
        return jobs
    env = os.environ.get(ENV, "").strip()
    if env:
        try:
            return int(env)
        except ValueError:
            from orchestrator.errors import InputError

            raise InputError(f"{ENV} must be an integer, got {env!r}") from None
    return auto_jobs(other_work)


@dataclass
class Precompile:
    proc: subprocess.Popen
    log_path: str
    cases_path: str
    count: int

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 3.0, covered: bool = False) -> None:
        """End the helpers (their whole process group) and remove the case file. `covered`: the
        run ran every one of its tp 1 cases itself, so the helpers' warm-up is complete as far as
        the cache goes: they are asked (SIGUSR1) to end and leave their marker first."""
        if covered and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGUSR1)
                self.proc.wait(timeout=grace_s)
            except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace_s)
            except (ProcessLookupError, PermissionError):
                pass
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=grace_s)
        try:
            os.unlink(self.cases_path)
        except OSError:
            pass


def start(
    cases: Sequence[Case], *, jobs: int, log_dir: str, history: dict[str, float] | None = None, device: str = "cuda"
) -> Precompile | None:
    """Start the warm-up for the tp 1 cases among `cases`, or None when there is nothing to do
    (jobs < 1, no tp 1 case). Which backends JIT-compile is for the helper to find out (that
    needs their classes, hence torch)."""
    tp1 = [c for c in cases if c.tp == 1]
    if jobs < 1 or not tp1:
        return None
    est = estimate_all(tp1, history or {})
    tp1.sort(key=lambda c: -est[c.case_id])  # stable: ties keep the matrix order
    os.makedirs(log_dir, exist_ok=True)
    fd, cases_path = tempfile.mkstemp(prefix="precompile-", suffix=".json", dir=log_dir)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump([c.to_dict() for c in tp1], f)
    log_path = os.path.join(log_dir, "precompile.log")
    env = dict(os.environ)
    root = os.getcwd()  # import-path backends resolve as in the workers (actors.actor_env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    argv = [
        sys.executable,
        "-m",
        "backend.harness.precompile",
        "--cases",
        cases_path,
        "--jobs",
        str(jobs),
        "--parent",
        str(os.getpid()),
        "--device",
        device,
    ]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=root,
        )
    return Precompile(proc, log_path, cases_path, len(tp1))
