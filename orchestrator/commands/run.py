"""`orch run MATRIX`: expand, record skips, execute on Ray, commit every result, gate, write outputs.

Order matters for exit codes: a bad matrix/filter/store is exit 2 before anything starts; an
unreachable cluster is exit 3 after the run row exists (it is closed as "failed", so `--resume`
can pick it up later). Ctrl-C closes the run as "interrupted" and keeps every committed result.
The driver holds the store's writer lock for the whole run: a second `orch run` (or a `--resume`
beside a live driver) on the same --db is exit 3 in one line; a killed driver's lock is taken over.
Results are committed in groups (one transaction per loop turn of the executor) and reported only
after their commit.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import tempfile
import time

import click

from backend.result import CaseResult, Status
from orchestrator.commands.repro import verdict_line
from orchestrator.errors import InputError

# Test/benchmark hook: the per-case function the actors call (default: the checker).
RUNNER_ENV = "ORCH_RUNNER"
_REPORT = (Status.FAIL, Status.ERROR, Status.TIMEOUT, Status.FLAKY, Status.NOT_RUN)


def _versions() -> dict[str, str]:
    import importlib.metadata

    import ray

    from orchestrator import __version__

    try:  # the installed version, read without importing torch into the driver (#13)
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "not installed"
    return {"orch": __version__, "python": platform.python_version(), "ray": ray.__version__, "torch": torch_version}


def _err(msg: str) -> None:
    click.echo(f"orch: {msg}", err=True)


def main(matrix, backend=None, filter_expr=None, db="orch-results.db", out_dir="orch-out", address="local",
         devices="auto", workers=None, timeout_s=None, junit_path=None, summary_path=None, baseline=None,
         known_failures=None, resume_run=None, no_progress=False, precompile_jobs=None) -> int:  # fmt: skip
    from orchestrator.filters import select
    from orchestrator.matrix import load_matrix
    from orchestrator.artifacts import write_outputs
    from orchestrator.store import ResultStore

    t0 = time.monotonic()
    if timeout_s is not None and timeout_s <= 0:
        raise InputError(f"--timeout must be > 0, got {timeout_s}")
    if precompile_jobs is not None and precompile_jobs < 0:
        raise InputError(f"--precompile-jobs must be >= 0, got {precompile_jobs}")
    m = load_matrix(matrix, devices=devices, backend_override=backend)
    phases = {"matrix": time.monotonic() - t0}
    cases = select(m.cases, filter_expr)
    skipped = select(m.skipped, filter_expr)
    if not cases and not skipped:
        raise InputError(f"no case matches --filter {filter_expr!r}", source=matrix)
    store = ResultStore(db)
    locked = False
    try:
        note = store.acquire_writer(sys.argv)
        locked = True
        if note:
            _err(note)
        if resume_run is not None:
            try:
                run_id = int(resume_run)
            except ValueError:
                raise InputError(f"--resume must be a run id, got {resume_run!r}") from None
            store.run(run_id)  # InputError if absent
            missing = set(store.missing_case_ids(run_id))
            # The run's own plan, not today's matrix: a resume finishes what was started.
            planned = [c for c in store.planned_cases(run_id) if c.case_id in missing]
            skip_by_id = {s.case.case_id: s for s in skipped}
            todo_skips = [skip_by_id[c.case_id] for c in planned if c.case_id in skip_by_id]
            cases = [c for c in planned if c.case_id not in skip_by_id]
            skipped = todo_skips
            _err(f"resuming run {run_id}: {len(missing)} case(s) without a final verdict")
        else:
            run_id = store.create_run(
                matrix=matrix, cases=[*cases, *(s.case for s in skipped)], argv=sys.argv, cluster=address,
                devices=devices, versions=_versions(), baseline=baseline,
            )  # fmt: skip
        store.record_many(run_id, [(CaseResult(
            case_id=s.case.case_id, status=Status.SKIP, reason=s.reason, requested_mode=s.case.mode,
            repro=s.case.repro_command(), axes=s.case.axes,
        ), True) for s in skipped])  # fmt: skip
        try:
            results = _execute(store, run_id, cases, address=address, devices=devices, workers=workers,
                               timeout_s=timeout_s, no_progress=no_progress, phases=phases,
                               precompile_jobs=precompile_jobs)  # fmt: skip
        except KeyboardInterrupt:
            store.finish_run(run_id, "interrupted")
            _err(f"interrupted: run {run_id} keeps what was recorded; finish it with --resume {run_id}")
            raise
        except BaseException:
            store.finish_run(run_id, "failed")
            raise
        store.finish_run(run_id, "finished")
        t_out = time.monotonic()
        gate = write_outputs(store, run_id, out_dir=out_dir, junit_path=junit_path, summary_path=summary_path,
                             baseline=baseline, known_failures=known_failures)  # fmt: skip
        phases["outputs"] = time.monotonic() - t_out
        counts: dict[str, int] = {}
        for r in [*results.values()]:
            counts[r.status.value] = counts.get(r.status.value, 0) + 1
        for r in sorted(results.values(), key=lambda r: r.case_id):
            if r.status in _REPORT:
                _err(f"{verdict_line(r.replace(reason=r.reason[:200]))}\n    repro: {r.repro}")
        shown = " ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        if "cluster" in phases:
            _err("time: " + ", ".join(f"{k} {v:.1f}s" for k, v in phases.items()))
        _err(f"run {run_id}: {len(results)} ran ({shown}), {len(skipped)} skipped, "
             f"{time.monotonic() - t0:.1f}s -> {gate.verdict()} (outputs in {out_dir})")  # fmt: skip
        return int(gate.exit_code)
    finally:
        try:
            if locked:
                store.release_writer()
        finally:
            store.close()


def _execute(store, run_id, cases, *, address, devices, workers, timeout_s, no_progress,
             phases: dict[str, float] | None = None, precompile_jobs: int | None = None) -> dict[str, CaseResult]:
    """Run the cases on Ray. `phases` receives where the wall time went: cluster (connect),
    first_result (from connect to the first result: worker start-up, imports, the first session),
    cases (from then to the last result), shutdown. On this machine's GPUs, Triton's kernel cache is
    warmed by helper processes meanwhile (`precompile_jobs`, None: ORCH_PRECOMPILE_JOBS or auto)."""
    if not cases:
        return {}
    phases = phases if phases is not None else {}
    log_dir = tempfile.mkdtemp(prefix="orch-workers-")
    history = store.durations()
    jit = _jit_backends(cases)
    warmup = _start_precompile(cases, address=address, devices=devices, jobs=precompile_jobs, log_dir=log_dir,
                               history=history, jit=jit)  # before the cluster: its start-up overlaps ours
    results: dict[str, CaseResult] = {}
    try:
        results = _run_on_cluster(store, run_id, cases, address=address, devices=devices, workers=workers,
                                  timeout_s=timeout_s, no_progress=no_progress, phases=phases, log_dir=log_dir,
                                  history=history, deferral=_deferral(jit, warmup))
        return results
    finally:
        if warmup is not None:
            from orchestrator.executor.precompile import covered

            warmup.stop(covered=covered(cases, results))


def _start_precompile(cases, *, address, devices, jobs, log_dir, history, jit: frozenset[str]):
    """The Triton warm-up helpers (orchestrator/executor/precompile.py) for a run on this
    machine's GPUs, or None. `jit`: the run's backends whose kernels compile on first use."""
    from backend.attention.capabilities import local_gpu_count
    from orchestrator.executor import precompile

    jobs = precompile.resolve_jobs(jobs, other_work=any(c.backend not in jit for c in cases))
    local = address == "local" and not os.environ.get("RAY_ADDRESS")
    if jobs < 1 or devices == "cpu" or not local or os.environ.get(RUNNER_ENV):  # a test runner: no checker
        return None
    if not local_gpu_count():
        return None
    warmup = precompile.start(cases, jobs=jobs, log_dir=log_dir, history=history)
    if warmup is not None:
        _err(f"precompile: {jobs} helper process(es) warming Triton's kernel cache from the {warmup.count} "
             f"tp 1 case(s) (log {warmup.log_path})")
    return warmup


def _deferral(jit: frozenset[str], warmup):
    """While the warm-up helpers run, the cases of the `jit` backends (whose kernels they compile)
    wait for the others (the worker would compile the same kernels itself, ~10 s on a cold H200)."""
    if warmup is None or not jit:
        return None
    from orchestrator.executor.executor import Deferral

    return Deferral(jit, warmup.running)


def _jit_backends(cases) -> frozenset[str]:
    """The backends among the cases whose kernels compile on first use (torch-free for builtins)."""
    from backend.attention.registry import get_capabilities

    return frozenset(b for b, f in {(c.backend, c.attention) for c in cases} if get_capabilities(b, f).jit_kernels)


def _run_on_cluster(store, run_id, cases, *, address, devices, workers, timeout_s, no_progress, phases, log_dir,
                    history, deferral=None) -> dict[str, CaseResult]:
    from orchestrator.executor.cluster import connect, disconnect
    from orchestrator.executor.executor import ExecConfig, Executor
    from orchestrator.executor.progress import Progress

    t0 = time.monotonic()
    cluster = connect(address, devices=devices, workers=workers, min_slots=max(c.tp for c in cases))
    t_up = time.monotonic()
    phases["cluster"] = t_up - t0
    marks: list[float] = []
    _err(cluster.banner)
    config = ExecConfig(timeout_s=timeout_s, log_dir=log_dir)
    if os.environ.get(RUNNER_ENV):
        config = dataclasses.replace(config, runner=os.environ[RUNNER_ENV])
    progress = Progress(len(cases), live=(not no_progress and sys.stderr.isatty()))

    def on_results(items: list[tuple[CaseResult, bool]]) -> None:
        store.record_many(run_id, items)  # durable before anything below reports it
        now = time.monotonic()
        marks.extend(now for _ in items)
        for result, final in items:
            if final:
                progress.update(result)

    try:
        return Executor(cluster, config, on_results=on_results, history=history, deferral=deferral).run(cases)
    finally:
        progress.close()
        t_end = time.monotonic()
        disconnect(cluster)
        if marks:
            phases["first_result"] = marks[0] - t_up
            phases["cases"] = marks[-1] - marks[0]
        phases["shutdown"] = time.monotonic() - (marks[-1] if marks else t_end)
