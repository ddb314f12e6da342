"""`orch run MATRIX`: expand, record skips, execute on Ray, commit every result, gate, write outputs.

Order matters for exit codes: a bad matrix/filter/store/baseline/known-failures file is exit 2
before any case runs; an unreachable cluster is exit 3 after the run row exists (it is closed as
"failed", so `--resume` can pick it up later). Ctrl-C (SIGINT) or SIGTERM closes the run as
"interrupted", keeps every committed result, writes the outputs marked INTERRUPTED (the missing
cases fail the gate) and exits 130 / 143. The outputs an earlier run left in OUT are removed
before any case runs, so no way of stopping a run leaves them looking current.
`--resume RUN_ID` finishes a run from its stored plan; a MATRIX that is not the run's is exit 2.
The driver holds the store's writer lock for the whole run: a second `orch run` (or a `--resume`
beside a live driver) on the same --db is exit 3 in one line; a killed driver's lock is taken over.
Results are committed in groups (one transaction per loop turn of the executor) and reported only
after their commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
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
_REPORT = (Status.FAIL, Status.ERROR, Status.TIMEOUT, Status.UNVERIFIABLE, Status.FLAKY, Status.NOT_RUN)
MAX_REASONS = 5  # skip reasons in the run's last lines; summary.md has them all


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


@contextlib.contextmanager
def _ray_logging(verbose: bool):
    """Ray's own log lines (the token-auth banner that opened every run, worker-death warnings the
    executor reports itself) only with -v: the run's stderr is orch's lines alone (#33)."""
    import ray  # noqa: F401  (its import sets the "ray" logger's level: set ours after it)

    logger = logging.getLogger("ray")
    before = logger.level
    if not verbose:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(before)


def main(matrix=None, backend=None, filter_expr=None, db="orch-results.db", out_dir="orch-out", address="local",
         devices="auto", workers=None, timeout_s=None, junit_path=None, summary_path=None, baseline=None,
         known_failures=None, resume_run=None, no_progress=False, precompile_jobs=None, verbose=False,
         allow_unverifiable=False) -> int:  # fmt: skip
    from orchestrator.interrupts import trapped

    with trapped():
        return _main(matrix, backend=backend, filter_expr=filter_expr, db=db, out_dir=out_dir, address=address,
                     devices=devices, workers=workers, timeout_s=timeout_s, junit_path=junit_path,
                     summary_path=summary_path, baseline=baseline, known_failures=known_failures,
                     resume_run=resume_run, no_progress=no_progress, precompile_jobs=precompile_jobs,
                     verbose=verbose, allow_unverifiable=allow_unverifiable)  # fmt: skip


def _main(matrix, *, backend, filter_expr, db, out_dir, address, devices, workers, timeout_s, junit_path, summary_path,
          baseline, known_failures, resume_run, no_progress, precompile_jobs, verbose,
          allow_unverifiable=False) -> int:  # fmt: skip
    from orchestrator import artifacts, known_failures as kf
    from orchestrator.filters import select
    from orchestrator.interrupts import exit_code, signame
    from orchestrator.matrix import load_matrix
    from orchestrator.outputs import gather
    from orchestrator.store import ResultStore, resolve_baseline

    t0 = time.monotonic()
    if timeout_s is not None and timeout_s <= 0:
        raise InputError(f"--timeout must be > 0, got {timeout_s}")
    if precompile_jobs is not None and precompile_jobs < 0:
        raise InputError(f"--precompile-jobs must be >= 0, got {precompile_jobs}")
    resume_id = _resume_id(resume_run)
    if matrix is None and resume_id is None:
        raise InputError("give the MATRIX to run (or --resume RUN_ID to finish a run with its own matrix)")
    kf.load(known_failures)  # a bad file is exit 2 now, not after the run
    cases, skipped = [], []
    if resume_id is None:
        m = load_matrix(matrix, devices=devices, backend_override=backend)
        cases = select(m.cases, filter_expr)
        skipped = select(m.skipped, filter_expr)
        if not cases and not skipped:
            raise InputError(f"no case matches --filter {filter_expr!r}", source=matrix)
    phases = {"matrix": time.monotonic() - t0}
    store = ResultStore(db)
    locked = False
    try:
        note = store.acquire_writer(sys.argv)
        locked = True
        if note:
            _err(note)
        if resume_id is not None:
            run_id, cases, skipped = _resume(store, resume_id, matrix, devices=devices, backend=backend,
                                             filter_expr=filter_expr)  # fmt: skip
        resolve_baseline(baseline, store, resume_id if resume_id is not None else -1)  # bad: exit 2 now
        paths = artifacts.output_paths(out_dir, junit_path, summary_path)
        artifacts.clear(paths)  # an earlier run's outputs never outlive the start of this one
        if resume_id is None:
            run_id = store.create_run(
                matrix=matrix, cases=[*cases, *(s.case for s in skipped)], argv=sys.argv, cluster=address,
                devices=devices, versions=_versions(), baseline=baseline,
            )  # fmt: skip
        store.record_many(run_id, [(CaseResult(
            case_id=s.case.case_id, status=Status.SKIP, reason=s.reason, requested_mode=s.case.mode,
            repro=s.case.repro_command(), axes=s.case.axes,
        ), True) for s in skipped])  # fmt: skip
        interrupted: KeyboardInterrupt | None = None
        try:
            _execute(store, run_id, cases, address=address, devices=devices, workers=workers, timeout_s=timeout_s,
                     no_progress=no_progress, phases=phases, precompile_jobs=precompile_jobs,
                     verbose=verbose)  # fmt: skip
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (orchestrator/interrupts.py)
            interrupted = e
        except BaseException:
            store.finish_run(run_id, "failed")
            raise
        store.finish_run(run_id, "interrupted" if interrupted is not None else "finished")
        # Interrupted or not, the outputs say what was recorded: an interrupted run's are marked
        # INTERRUPTED and count its unfinished cases as missing (the gate fails).
        t_out = time.monotonic()
        view = gather(store, run_id, baseline=baseline, known_failures=known_failures,
                      allow_unverifiable=allow_unverifiable)
        artifacts.write_view(store, view, paths)
        phases["outputs"] = time.monotonic() - t_out
        for line in last_lines(view, verbose=verbose):
            _err(line)
        if "cluster" in phases:
            _err("time: " + ", ".join(f"{k} {v:.1f}s" for k, v in phases.items()))
        _err(final_line(view, elapsed=time.monotonic() - t0, out_dir=out_dir,
                        signal_name=signame(interrupted) if interrupted is not None else None))
        return exit_code(interrupted) if interrupted is not None else int(view.gate.exit_code)
    finally:
        try:
            if locked:
                store.release_writer()
        finally:
            store.close()


def _resume_id(resume_run) -> int | None:
    if resume_run is None:
        return None
    try:
        return int(resume_run)
    except (TypeError, ValueError):
        raise InputError(f"--resume must be a run id, got {resume_run!r}") from None


def same_matrix(given: str, run) -> bool:
    """Whether MATRIX is run's own: the same file, or the same content (a path from another cwd)."""
    from orchestrator.store import file_sha

    if os.path.realpath(given) == os.path.realpath(run.matrix):
        return True
    return bool(run.matrix_sha) and file_sha(given) == run.matrix_sha


def _resume(store, run_id: int, matrix: str | None, *, devices, backend, filter_expr):
    """(run id, cases to run, skips to record) for `--resume RUN_ID`: the run's own plan, never
    today's matrix (a resume finishes what was started). A MATRIX that is not the run's is exit 2
    (#33: it used to be ignored without a word, and another matrix's cases ran for minutes)."""
    from orchestrator.filters import select
    from orchestrator.matrix import load_matrix

    run = store.run(run_id)  # InputError if absent
    if matrix is not None and not same_matrix(matrix, run):
        raise InputError(f"--resume {run_id}: run {run_id} ran {run.matrix}, not {matrix} "
                         f"(leave MATRIX out to finish run {run_id} with its own)")  # fmt: skip
    missing = set(store.missing_case_ids(run_id))
    if not missing and run.status == "finished":
        raise InputError(f"--resume {run_id}: run {run_id} is finished, every one of its {run.num_cases} cases has a "
                         f"verdict; nothing to resume (`orch gate --run {run_id}` prints its verdict)")  # fmt: skip
    skipped = []
    try:  # which missing cases cannot run here today (a provider gone): recorded as skips
        m = load_matrix(matrix or run.matrix, devices=devices, backend_override=backend)
        skipped = select(m.skipped, filter_expr)
    except InputError:
        if matrix is not None:
            raise  # the user's file is broken: say so; the stored one may be gone, and need not load
    planned = [c for c in store.planned_cases(run_id) if c.case_id in missing]
    skip_by_id = {s.case.case_id: s for s in skipped}
    todo_skips = [skip_by_id[c.case_id] for c in planned if c.case_id in skip_by_id]
    cases = [c for c in planned if c.case_id not in skip_by_id]
    _err(f"resuming run {run_id} ({run.matrix}): {len(missing)} case(s) without a final verdict")
    return run_id, cases, todo_skips


def last_lines(view, *, verbose: bool) -> list[str]:
    """What the run ends with before its time and verdict lines, sized for a CI log: one line per
    gating class (a sample of ids), the first failure's repro, skips by reason, downgrades by
    kind. -v: every non-passing case with its reason and repro instead of the class lines."""
    from orchestrator import digest
    from orchestrator.gate import CLASSIFICATIONS, GATING
    from orchestrator.outputs import downgrades, skips

    gate = view.gate
    out: list[str] = []
    if verbose:
        for r in view.results:  # sorted by case id (store order)
            if r.status in _REPORT:
                out.append(f"{verdict_line(r.replace(reason=r.reason[:200]))}\n    repro: {r.repro}")
    else:
        shown = [c for c in CLASSIFICATIONS if c in GATING or c in ("flaky", "fixed")]
        out += digest.gate_lines(gate.classification, shown)
        by_id = {r.case_id: r for r in view.results}
        first = next((by_id[c] for c in gate.gating if c in by_id and by_id[c].repro), None)
        if first is not None:
            out.append(f"repro {first.case_id}: {first.repro}")
        if out:
            out.append("-v lists every case with its reason and repro; so does the summary")
    groups = digest.skip_lines(skips(view.results))
    if groups:
        out.append(f"skipped {sum(1 for r in view.results if r.status == Status.SKIP)} by reason:\n    "
                   + "\n    ".join(groups[:MAX_REASONS]
                                   + ([f"... and {len(groups) - MAX_REASONS} more reasons (summary.md)"]
                                      if len(groups) > MAX_REASONS else [])))  # fmt: skip
    out += [f"warning: {line}" for line in digest.downgrade_lines(downgrades(view.results))]
    return out


def final_line(view, *, elapsed: float, out_dir: str, signal_name: str | None) -> str:
    ran = view.ran()
    counts: dict[str, int] = {}
    for r in ran:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    shown = " ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    what = f"{len(ran)} ran" + (f" ({shown})" if shown else "") + f", {len(view.results) - len(ran)} skipped"
    if signal_name is None:
        return f"run {view.run.id}: {what}, {elapsed:.1f}s -> {view.gate.verdict()} (outputs in {out_dir})"
    return (f"run {view.run.id} INTERRUPTED by {signal_name} after {elapsed:.1f}s: {what}, "
            f"{len(view.gate.missing)} missing -> {view.gate.verdict()} (outputs in {out_dir}, marked INTERRUPTED); "
            f"finish it with `orch run --resume {view.run.id}`")


def _execute(store, run_id, cases, *, address, devices, workers, timeout_s, no_progress,
             phases: dict[str, float] | None = None, precompile_jobs: int | None = None,
             verbose: bool = False) -> dict[str, CaseResult]:
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
                                  history=history, deferral=_deferral(jit, warmup), verbose=verbose)
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
                    history, deferral=None, verbose: bool = False) -> dict[str, CaseResult]:
    with _ray_logging(verbose):
        return _on_cluster(store, run_id, cases, address=address, devices=devices, workers=workers,
                           timeout_s=timeout_s, no_progress=no_progress, phases=phases, log_dir=log_dir,
                           history=history, deferral=deferral)  # fmt: skip


def _on_cluster(store, run_id, cases, *, address, devices, workers, timeout_s, no_progress, phases, log_dir,
                history, deferral) -> dict[str, CaseResult]:
    from orchestrator.executor.cluster import connect, disconnect
    from orchestrator.executor.executor import ExecConfig, Executor
    from orchestrator.executor.progress import Progress
    from orchestrator.interrupts import rearm

    t0 = time.monotonic()
    cluster = connect(address, devices=devices, workers=workers, min_slots=max(c.tp for c in cases))
    rearm()  # ray.init installed its own SIGTERM handler (sys.exit): ours closes the run first
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
