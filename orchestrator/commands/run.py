"""`orch run MATRIX`: expand, record skips, execute on Ray, commit every result, gate, write outputs.

Order matters for exit codes: a bad matrix/filter/store/baseline/known-failures file is exit 2
before any case runs; an unreachable cluster is exit 3 after the run row exists (it is closed as
"failed", so `--resume` can pick it up later). Ctrl-C (SIGINT) or SIGTERM closes the run as
"interrupted", keeps every committed result, writes the outputs marked INTERRUPTED (the missing
cases fail the gate) and exits 130 / 143. The outputs an earlier run left in OUT are removed
before any case runs, so no way of stopping a run leaves them looking current.
`--resume RUN_ID` finishes a run from its stored plan, into its own --out; a MATRIX that is not the
run's is exit 2. A run in which nothing ran (or a `--require`d slice did not) fails its gate unless
`--allow-empty` (orchestrator/empty_run.py); the options are stored with the run (RunOptions), so
`orch gate` and `orch report` judge it alike.
Streams: what the run concluded (gate lines, skips by reason, repro, time, the verdict) goes to
stdout, so `orch run ... | tee log` keeps it; progress, notes and warnings go to stderr, each line
`orch: `; `--no-progress` prints no progress.
Many drivers may write one --db (a SQLite file on one machine, a PostgreSQL database from many):
each holds its own run's writer lock for the whole run, so a `--resume` beside the run's live
driver is exit 3 in one line, and a killed driver's lock is taken over. Results are committed in
groups (one transaction per loop turn of the executor) and reported only after their commit.
`--label` names the run's line of history (the branch), which `--baseline LABEL` and the
flakiness window read; `--max-gpus` caps the GPUs this run holds on a shared cluster.
Device memory (docs/EXECUTION.md "GPU memory"): `--workers-per-gpu`, `--gpu-memory-utilization`,
`--gpu-memory`.
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
from orchestrator.digest import plural
from orchestrator.errors import InputError, OrchError

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


def _flaky_options(window, threshold) -> dict:
    from orchestrator.flakiness import options

    return options(window, threshold)


def _err(msg: str) -> None:
    """Progress, notes and warnings: stderr."""
    click.echo(f"orch: {msg}", err=True)


def _out(msg: str) -> None:
    """What the run concluded (its summary lines and verdict): stdout."""
    click.echo(msg)


# The `time:` line's phases, labelled by what each measures (run._on_cluster sets them).
PHASE_LABELS = {
    "matrix": "load matrix", "cluster": "start cluster", "first_result": "start to first result",
    "cases": "first to last result", "shutdown": "shutdown", "outputs": "write outputs",
}  # fmt: skip


def time_line(phases: dict[str, float]) -> str:
    return "time: " + ", ".join(f"{PHASE_LABELS.get(k, k)} {v:.1f}s" for k, v in phases.items())


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


def main(matrix=None, backend=None, filter_expr=None, db=None, out_dir=None, address="local",
         devices="auto", workers=None, timeout_s=None, junit_path=None, summary_path=None, baseline=None,
         known_failures=None, resume_run=None, no_progress=False, precompile_jobs=None, verbose=False,
         label=None, max_gpus=None, flaky_window=None, flaky_threshold=None,
         workers_per_gpu="1", gpu_memory_utilization=0.9, gpu_memory=None, allow_empty=False,
         require=(), allow_unverifiable=False) -> int:  # fmt: skip
    """db / out_dir None: the defaults (orchestrator/defaults.py: ORCH_DB / ORCH_OUT, else
    orch-results.db / orch-out; `--resume` reuses the run's own --out)."""
    from orchestrator.executor.packing import MemoryOptions
    from orchestrator.interrupts import trapped

    memory = MemoryOptions.parse(workers_per_gpu, gpu_memory_utilization, gpu_memory)

    with trapped():
        return _main(matrix, backend=backend, filter_expr=filter_expr, db=db, out_dir=out_dir, address=address,
                     devices=devices, workers=workers, timeout_s=timeout_s, junit_path=junit_path,
                     summary_path=summary_path, baseline=baseline, known_failures=known_failures,
                     resume_run=resume_run, no_progress=no_progress, precompile_jobs=precompile_jobs,
                     verbose=verbose, label=label, max_gpus=max_gpus,
                     flaky=_flaky_options(flaky_window, flaky_threshold), memory=memory,
                     allow_empty=allow_empty, require=tuple(require or ()),
                     allow_unverifiable=allow_unverifiable)  # fmt: skip


def _main(matrix, *, backend, filter_expr, db, out_dir, address, devices, workers, timeout_s, junit_path, summary_path,
          baseline, known_failures, resume_run, no_progress, precompile_jobs, verbose, label=None, max_gpus=None,
          flaky=None, memory=None, allow_empty=False, require=(), allow_unverifiable=False) -> int:  # fmt: skip
    from orchestrator import artifacts, defaults, known_failures as kf
    from orchestrator.filters import parse_filter, select
    from orchestrator.interrupts import exit_code, signame
    from orchestrator.matrix import load_matrix
    from orchestrator.outputs import gather
    from orchestrator.store import ResultStore, RunOptions, find_baseline

    t0 = time.monotonic()
    db = db or defaults.db()
    flaky = flaky or _flaky_options(None, None)
    if timeout_s is not None and timeout_s <= 0:
        raise InputError(f"--timeout must be > 0, got {timeout_s}")
    if max_gpus is not None and max_gpus < 1:
        raise InputError(f"--max-gpus must be >= 1, got {max_gpus}")
    if precompile_jobs is not None and precompile_jobs < 0:
        raise InputError(f"--precompile-jobs must be >= 0, got {precompile_jobs}")
    resume_id = _resume_id(resume_run)
    if matrix is None and resume_id is None:
        raise InputError("give the MATRIX to run (or --resume RUN_ID to finish a run with its own matrix)")
    kf.load(known_failures)  # a bad file is exit 2 now, not after the run
    cases, skipped = [], []
    options = None
    if resume_id is None:
        m = load_matrix(matrix, devices=devices, backend_override=backend)
        cases = select(m.cases, filter_expr)
        skipped = select(m.skipped, filter_expr)
        if not cases and not skipped:
            raise InputError(f"no case matches --filter {filter_expr!r}", source=matrix)
        for expr in require:  # a typo in a required slice is exit 2 now, not a red gate later
            try:
                parse_filter(expr)  # (after the matrix: a plugin family's name is known from it on)
            except InputError as e:
                raise InputError(e.message, source="--require") from None
        out_dir = out_dir or defaults.out()
        options = RunOptions(out=os.path.abspath(out_dir), filter=filter_expr, backend=backend,
                             matrix_cases=len(m.cases) + len(m.skipped), allow_empty=allow_empty, require=require,
                             allow_unverifiable=allow_unverifiable)
    phases = {"matrix": time.monotonic() - t0}
    store = ResultStore(db)
    run_id = None  # set once this driver holds the run's writer lock
    try:
        if resume_id is not None:
            resumed = store.run(resume_id)  # exit 2 if absent, before any lock
            if label is not None and label != resumed.label:
                raise InputError(f"--resume {resume_id}: run {resume_id} is labelled {resumed.label!r}, "
                                 f"not {label!r} (a run keeps its label)")  # fmt: skip
            note = store.acquire_writer(resume_id, sys.argv)
            run_id = resume_id
            if note:
                _err(note)
            _, cases, skipped = _resume(store, resume_id, matrix, devices=devices, backend=backend,
                                        filter_expr=filter_expr)  # fmt: skip
            # Its own outputs, where the interrupted run left them marked INTERRUPTED.
            out_dir = out_dir or resumed.options.out or defaults.out()
        find_baseline(baseline, store, resume_id if resume_id is not None else -1)  # bad: exit 2 now
        paths = artifacts.output_paths(out_dir, junit_path, summary_path)
        artifacts.clear(paths)  # an earlier run's outputs never outlive the start of this one
        if resume_id is None:
            run_id = store.create_run(
                matrix=matrix, cases=[*cases, *(s.case for s in skipped)], argv=sys.argv, cluster=address,
                devices=devices, versions=_versions(), baseline=baseline, label=label or "", lock_writer=True,
                options=options,
            )  # fmt: skip
        store.record_many(run_id, [(CaseResult(
            case_id=s.case.case_id, status=Status.SKIP, reason=s.reason, requested_mode=s.case.mode,
            repro=s.case.repro_command(), axes=s.case.axes,
        ), True) for s in skipped])  # fmt: skip
        interrupted: KeyboardInterrupt | None = None
        try:
            _execute(store, run_id, cases, address=address, devices=devices, workers=workers, timeout_s=timeout_s,
                     no_progress=no_progress, phases=phases, precompile_jobs=precompile_jobs,
                     verbose=verbose, max_gpus=max_gpus, memory=memory)  # fmt: skip
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (orchestrator/interrupts.py)
            interrupted = e
        except BaseException:
            store.finish_run(run_id, "failed")
            raise
        store.finish_run(run_id, "interrupted" if interrupted is not None else "finished")
        # Interrupted or not, the outputs say what was recorded: an interrupted run's are marked
        # INTERRUPTED and count its unfinished cases as missing (the gate fails).
        t_out = time.monotonic()
        view = gather(store, run_id, baseline=baseline, known_failures=known_failures, **flaky)
        artifacts.write_view(store, view, paths)
        phases["outputs"] = time.monotonic() - t_out
        lines, warnings = last_lines(view, verbose=verbose)
        for line in lines:
            _out(line)
        for line in warnings:
            _err(line)
        if "cluster" in phases:
            _out(time_line(phases))
        _out(final_line(view, elapsed=time.monotonic() - t0, out_dir=out_dir,
                        signal_name=signame(interrupted) if interrupted is not None else None))
        return exit_code(interrupted) if interrupted is not None else int(view.gate.exit_code)
    finally:
        try:
            if run_id is not None:
                # Best effort: a lock left behind dies with this process (SQLite: a dead pid is
                # stale; PostgreSQL: the session lock goes with the connection).
                with contextlib.suppress(OrchError):
                    store.release_writer(run_id)
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
    _err(f"resuming run {run_id} ({run.matrix}): {plural(len(missing), 'case')} without a final verdict")
    return run_id, cases, todo_skips


def last_lines(view, *, verbose: bool) -> tuple[list[str], list[str]]:
    """(summary lines, warnings): what the run ends with before its time and verdict lines, sized
    for a CI log: one line per gating class (a sample of ids), the first failure's repro, skips by
    reason, the history notes (gate_notes.py); and the downgrades by kind, as warnings. -v: every
    non-passing case with its reason and repro instead of the class lines."""
    from orchestrator import digest, gate_notes
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
    out += gate_notes.lines(view)
    groups = digest.skip_lines(skips(view.results))
    if groups:
        out.append(f"skipped {sum(1 for r in view.results if r.status == Status.SKIP)} by reason:\n    "
                   + "\n    ".join(groups[:MAX_REASONS]
                                   + ([f"... and {len(groups) - MAX_REASONS} more reasons (summary.md)"]
                                      if len(groups) > MAX_REASONS else [])))  # fmt: skip
    return out, [f"warning: {line}" for line in digest.downgrade_lines(downgrades(view.results))]


def final_line(view, *, elapsed: float, out_dir: str, signal_name: str | None) -> str:
    """"run 3 (6 of 90 cases, --filter 'tp=1'): 4 ran (pass 4), 2 skipped, 12.3s -> gate PASSED: ..."."""
    from orchestrator.outputs import selection

    ran = view.ran()
    counts: dict[str, int] = {}
    for r in ran:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    shown = " ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    what = f"{len(ran)} ran" + (f" ({shown})" if shown else "") + f", {len(view.results) - len(ran)} skipped"
    sel = selection(view.run)
    run = f"run {view.run.id}" + (f" ({sel})" if sel else "")
    if signal_name is None:
        return f"{run}: {what}, {elapsed:.1f}s -> {view.gate.verdict()} (outputs in {out_dir})"
    return (f"{run} INTERRUPTED by {signal_name} after {elapsed:.1f}s: {what}, "
            f"{len(view.gate.missing)} missing -> {view.gate.verdict()} (outputs in {out_dir}, marked INTERRUPTED); "
            f"finish it with `orch run --resume {view.run.id}`")


def _execute(store, run_id, cases, *, address, devices, workers, timeout_s, no_progress,
             phases: dict[str, float] | None = None, precompile_jobs: int | None = None,
             verbose: bool = False, max_gpus: int | None = None, memory=None) -> dict[str, CaseResult]:
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
        per_gpu = _per_gpu(memory, cases, store, devices) if memory is not None else 1
        results = _run_on_cluster(store, run_id, cases, address=address, devices=devices, workers=workers,
                                  timeout_s=timeout_s, no_progress=no_progress, phases=phases, log_dir=log_dir,
                                  history=history, deferral=_deferral(jit, warmup), verbose=verbose,
                                  max_gpus=max_gpus, memory=memory, per_gpu=per_gpu)
        return results
    finally:
        if warmup is not None:
            from orchestrator.executor.precompile import covered

            warmup.stop(covered=covered(cases, results))


def _per_gpu(memory, cases, store, devices) -> int:
    """--workers-per-gpu resolved (auto: orchestrator/executor/packing.py, on this machine's cores,
    GPUs and device memory, by the cases' needs recorded in the store)."""
    if memory.workers_per_gpu != "auto":
        return memory.workers_per_gpu
    from backend.attention.capabilities import driver_gpu_memory, local_gpu_count
    from orchestrator.executor.packing import auto_per_gpu, worker_need

    gpus = 0 if devices == "cpu" else local_gpu_count()
    device_bytes = memory.gpu_memory or driver_gpu_memory()
    packing = auto_per_gpu(worker_need((c.case_id for c in cases), store.memory_needs()), device_bytes,
                           memory.utilization, os.cpu_count() or 1, gpus)
    if gpus:
        _err(f"workers per GPU: {packing.why}")
    return packing.per_gpu


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
        _err(f"precompile: {plural(jobs, 'helper process', 'helper processes')} warming Triton's kernel cache "
             f"from {plural(warmup.count, 'tp 1 case')} (log {warmup.log_path})")
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
                    history, deferral=None, verbose: bool = False, max_gpus: int | None = None, memory=None,
                    per_gpu: int = 1) -> dict[str, CaseResult]:
    with _ray_logging(verbose):
        return _on_cluster(store, run_id, cases, address=address, devices=devices, workers=workers,
                           timeout_s=timeout_s, no_progress=no_progress, phases=phases, log_dir=log_dir,
                           history=history, deferral=deferral, max_gpus=max_gpus, memory=memory,
                           per_gpu=per_gpu)  # fmt: skip


def _on_cluster(store, run_id, cases, *, address, devices, workers, timeout_s, no_progress, phases, log_dir,
                history, deferral, max_gpus=None, memory=None, per_gpu: int = 1) -> dict[str, CaseResult]:
    from orchestrator.executor.cluster import connect, disconnect
    from orchestrator.executor.executor import ExecConfig, Executor
    from orchestrator.executor.progress import Progress
    from orchestrator.interrupts import rearm

    t0 = time.monotonic()
    cluster = connect(address, devices=devices, workers=workers, min_slots=max(c.tp for c in cases),
                      workers_per_gpu=per_gpu, max_gpus=max_gpus)
    rearm()  # ray.init installed its own SIGTERM handler (sys.exit): ours closes the run first
    t_up = time.monotonic()
    phases["cluster"] = t_up - t0
    marks: list[float] = []
    _err(cluster.banner)
    config = ExecConfig(timeout_s=timeout_s, log_dir=log_dir)
    if memory is not None:
        config = dataclasses.replace(config, gpu_memory_utilization=memory.utilization,
                                     gpu_memory_bytes=memory.gpu_memory)
    if cluster.device_kind == "gpu" and cluster.workers_per_gpu > 1:
        # Cases measured to need more than one worker's share run on wider workers (packing.slot_width).
        from backend.attention.capabilities import driver_gpu_memory

        config = dataclasses.replace(config, memory_needs=store.memory_needs(),
                                     device_bytes=config.gpu_memory_bytes or driver_gpu_memory())
    if os.environ.get(RUNNER_ENV):
        config = dataclasses.replace(config, runner=os.environ[RUNNER_ENV])
    progress = Progress(len(cases), live=sys.stderr.isatty(), quiet=no_progress)

    def on_results(items: list[tuple[CaseResult, bool]]) -> None:
        store.record_many(run_id, items)  # durable before anything below reports it
        now = time.monotonic()
        marks.extend(now for _ in items)
        for result, final in items:
            if final:
                progress.update(result)

    try:
        return Executor(cluster, config, on_results=on_results, history=history, deferral=deferral,
                        on_notice=_err).run(cases)  # fmt: skip
    finally:
        progress.close()
        t_end = time.monotonic()
        disconnect(cluster)
        if marks:
            phases["first_result"] = marks[0] - t_up
            phases["cases"] = marks[-1] - marks[0]
        phases["shutdown"] = time.monotonic() - (marks[-1] if marks else t_end)
