"""`orch run MATRIX`: expand, record skips, execute on Ray, commit every result, gate, write outputs.

The options arrive as one RunRequest (orchestrator/run_request.py); the last lines it prints are
orchestrator/run_output.py's. Order matters for exit codes: a bad matrix/filter/store/baseline/
known-failures file is exit 2 before any case runs, and so is an --out or a store that cannot be
written exit 3 before any case runs; an unreachable cluster is exit 3 after the run row exists (it is closed as
"failed", so `--resume` can pick it up later). Ctrl-C (SIGINT) or SIGTERM closes the run as
"interrupted", keeps every committed result, writes the outputs marked INTERRUPTED (the missing
cases fail the gate) and exits 130 / 143. The outputs an earlier run left in OUT are removed
before any case runs, so no way of stopping a run leaves them looking current.
`--resume RUN_ID` finishes a run from its stored plan, into its own --out; a MATRIX that is not the
run's is exit 2. A run in which nothing ran (or a `--require`d slice did not) fails its gate unless
`--allow-empty` (orchestrator/empty_run.py). What judged the run (known failures: --known-failures,
else the file the matrix names; baseline, flakiness, --require, --allow-*) is stored with it
(RunOptions), so `orch gate` and `orch report` judge it alike (orchestrator/judging.py).
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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from backend.result import CaseResult, Status
from orchestrator import gpu_share
from orchestrator.digest import plural
from orchestrator.errors import InputError, OrchError
from orchestrator.flakiness import DEFAULT_WINDOW
from orchestrator.run_output import final_line, last_lines, time_line
from orchestrator.run_request import RunRequest
from orchestrator.store.options import NewRun, RunOptions

if TYPE_CHECKING:
    from backend.case import Case
    from orchestrator.executor.executor import Deferral
    from orchestrator.matrix import SkippedCase

# Test/benchmark hook: the per-case function the actors call (default: the checker).
RUNNER_ENV = "ORCH_RUNNER"


def _versions() -> dict[str, str]:
    import importlib.metadata

    import ray

    from orchestrator import __version__

    try:  # the installed version, read without importing torch into the driver
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "not installed"
    return {"orch": __version__, "python": platform.python_version(), "ray": ray.__version__, "torch": torch_version}


def _err(msg: str) -> None:
    """Progress, notes and warnings: stderr."""
    click.echo(f"orch: {msg}", err=True)


def _out(msg: str) -> None:
    """What the run concluded (its summary lines and verdict): stdout."""
    click.echo(msg)


@contextlib.contextmanager
def _ray_logging(verbose: bool):
    """Ray's own log lines (the token-auth banner that opened every run, worker-death warnings the
    executor reports itself) only with -v: the run's stderr is orch's lines alone."""
    import ray  # noqa: F401  (its import sets the "ray" logger's level: set ours after it)

    logger = logging.getLogger("ray")
    before = logger.level
    if not verbose:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(before)


def main(matrix: str | None = None, **options) -> int:
    """`options`: `orch run`'s options by their cli.py names, as RunRequest.from_cli takes them.
    db / out_dir None: the defaults (orchestrator/defaults.py: ORCH_DB / ORCH_OUT, else
    orch-results.db / orch-out; `--resume` reuses the run's own --out)."""
    from orchestrator.interrupts import trapped

    req = RunRequest.from_cli({"matrix": matrix, **options})
    with trapped():
        return _main(req)


def _plan(req: RunRequest, matrix: str) -> tuple[list[Case], list[SkippedCase], RunOptions, str]:
    """A new run's (cases, skips, stored options, out dir), checked before anything is written:
    a bad matrix, filter, --require or known-failures file is exit 2 here."""
    from orchestrator import defaults
    from orchestrator import known_failures as kf
    from orchestrator.filters import parse_filter, select
    from orchestrator.matrix import load_matrix

    m = load_matrix(matrix, devices=req.devices, backend_override=req.backend)
    cases = select(m.cases, req.filter_expr)
    skipped = select(m.skipped, req.filter_expr)
    if not cases and not skipped:
        raise InputError(f"no case matches --filter {req.filter_expr!r}", source=matrix)
    j = req.judging
    for expr in j.require:  # a typo in a required slice is exit 2 now, not a red gate later
        try:
            parse_filter(expr)  # (after the matrix: a plugin family's name is known from it on)
        except InputError as e:
            raise InputError(e.message, source="--require") from None
    # --known-failures FILE, else the file the matrix names (--no-known-failures: none).
    known = j.known_failures if isinstance(j.known_failures, str) else (m.known_failures or "")
    kf.load(known)  # a bad file is exit 2 now, not after the run
    out_dir = req.out_dir or defaults.out()
    options = RunOptions(
        out=os.path.abspath(out_dir),
        filter=req.filter_expr,
        backend=req.backend,
        matrix_cases=len(m.cases) + len(m.skipped),
        allow_empty=j.allow_empty,
        require=j.require,
        allow_unverifiable=j.allow_unverifiable,
        known_failures=os.path.abspath(known) if known else "",
        flaky_window=j.flaky_window or DEFAULT_WINDOW,
        flaky_threshold=j.flaky_threshold,
    )
    return list(cases), list(skipped), options, out_dir


def _main(req: RunRequest) -> int:
    from orchestrator import artifacts, defaults
    from orchestrator import known_failures as kf
    from orchestrator.interrupts import exit_code, signame
    from orchestrator.judging import unmasked
    from orchestrator.outputs import gather
    from orchestrator.store import ResultStore, find_baseline

    t0 = time.monotonic()
    cases: list[Case] = []
    skipped: list[SkippedCase] = []
    options: RunOptions | None = None
    out_dir = req.out_dir or ""
    if req.matrix is not None and req.resume_id is None:
        cases, skipped, options, out_dir = _plan(req, req.matrix)
        artifacts.check_writable(artifacts.output_paths(out_dir, req.junit_path, req.summary_path))
    judging = req.judging  # a resume's: over the run's own (below)
    phases = {"matrix": time.monotonic() - t0}
    gpus: list[int] = []  # the run's GPUs (_on_cluster appends them; none on CPU workers)
    store = ResultStore(req.db or defaults.db())
    run_id: int | None = None  # set once this driver holds the run's writer lock
    try:
        if req.resume_id is not None:
            resume_id = req.resume_id
            resumed = store.run(resume_id)  # exit 2 if absent, before any lock
            if req.label is not None and req.label != resumed.label:
                raise InputError(
                    f"--resume {resume_id}: run {resume_id} is labelled {resumed.label!r}, "
                    f"not {req.label!r} (a run keeps its label)"
                )
            note = store.acquire_writer(resume_id, sys.argv)
            run_id = resume_id
            if note:
                _err(note)
            cases, skipped = _resume(store, resume_id, req)
            # Its own outputs, where the interrupted run left them marked INTERRUPTED.
            out_dir = req.out_dir or resumed.options.out or defaults.out()
            judging = req.judging.over(resumed)
            kf.load(judging.known_failures if isinstance(judging.known_failures, str) else None)  # bad: exit 2 now
        current = req.resume_id if req.resume_id is not None else -1  # -1: the run is not created yet
        find_baseline(unmasked(judging.baseline or "", store.location, current) or None, store, current)  # bad: exit 2
        paths = artifacts.output_paths(out_dir, req.junit_path, req.summary_path)
        artifacts.check_writable(paths)  # a read-only --out is exit 3 now, before any work
        artifacts.clear(paths)  # an earlier run's outputs never outlive the start of this one
        new = NewRun(
            matrix=req.matrix or "",
            cases=[*cases, *(s.case for s in skipped)],
            argv=sys.argv,
            cluster=req.address,
            devices=req.devices,
            versions=_versions(),
            baseline=req.judging.baseline,
            label=req.label or "",
            options=options,
        )
        rid = req.resume_id if req.resume_id is not None else store.create_run(new, lock_writer=True)
        run_id = rid
        store.record_many(
            rid,
            [
                (
                    CaseResult(
                        case_id=s.case.case_id,
                        status=Status.SKIP,
                        reason=s.reason,
                        requested_mode=s.case.mode,
                        repro=s.case.repro_command(),
                        axes=s.case.axes,
                    ),
                    True,
                )
                for s in skipped
            ],
        )
        interrupted: KeyboardInterrupt | None = None
        try:
            _execute(store, rid, cases, req, phases, gpus)
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (orchestrator/interrupts.py)
            interrupted = e
        except BaseException:
            store.finish_run(rid, "failed")
            raise
        store.finish_run(rid, "interrupted" if interrupted is not None else "finished")
        # Interrupted or not, the outputs say what was recorded: an interrupted run's are marked
        # INTERRUPTED and count its unfinished cases as missing (the gate fails). The run is judged
        # as `orch gate --run N` judges it: by its stored options (what was asked here wins).
        t_out = time.monotonic()
        view = gather(store, rid, req.judging)
        share = gpu_share.measure(view.results, phases.get("cases"), sum(gpus))
        artifacts.write_view(store, view, paths, extra=f"\n{share.line()} over the cases phase.\n" if share else "")
        phases["outputs"] = time.monotonic() - t_out
        lines, warnings = last_lines(view, verbose=req.verbose)
        for line in lines:
            _out(line)
        for line in warnings:
            _err(line)
        if "cluster" in phases:
            _out(time_line(phases, share))
        _out(
            final_line(
                view,
                elapsed=time.monotonic() - t0,
                out_dir=out_dir,
                signal_name=signame(interrupted) if interrupted is not None else None,
            )
        )
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


def same_matrix(given: str, run) -> bool:
    """Whether MATRIX is run's own: the same file, or the same content (a path from another cwd)."""
    from orchestrator.store import file_sha

    if os.path.realpath(given) == os.path.realpath(run.matrix):
        return True
    return bool(run.matrix_sha) and file_sha(given) == run.matrix_sha


def _resume(store, run_id: int, req: RunRequest) -> tuple[list, list]:
    """(cases to run, skips to record) for `--resume RUN_ID`: the run's own plan, never today's
    matrix (a resume finishes what was started). A MATRIX that is not the run's is exit 2: it is
    never ignored without a word while another matrix's cases run for minutes."""
    from orchestrator.filters import select
    from orchestrator.matrix import load_matrix

    run = store.run(run_id)  # InputError if absent
    if req.matrix is not None and not same_matrix(req.matrix, run):
        raise InputError(
            f"--resume {run_id}: run {run_id} ran {run.matrix}, not {req.matrix} "
            f"(leave MATRIX out to finish run {run_id} with its own)"
        )
    missing = set(store.missing_case_ids(run_id))
    if not missing and run.status == "finished":
        raise InputError(
            f"--resume {run_id}: run {run_id} is finished, every one of its {run.num_cases} cases has a "
            f"verdict; nothing to resume (`orch gate --run {run_id}` prints its verdict)"
        )
    skipped = []
    try:  # which missing cases cannot run here today (a provider gone): recorded as skips
        m = load_matrix(req.matrix or run.matrix, devices=req.devices, backend_override=req.backend)
        skipped = select(m.skipped, req.filter_expr)
    except InputError:
        if req.matrix is not None:
            raise  # the user's file is broken: say so; the stored one may be gone, and need not load
    planned = [c for c in store.planned_cases(run_id) if c.case_id in missing]
    skip_by_id = {s.case.case_id: s for s in skipped}
    todo_skips = [skip_by_id[c.case_id] for c in planned if c.case_id in skip_by_id]
    cases = [c for c in planned if c.case_id not in skip_by_id]
    _err(f"resuming run {run_id} ({run.matrix}): {plural(len(missing), 'case')} without a final verdict")
    return cases, todo_skips


@dataclass(frozen=True)
class _Work:
    """What _execute prepares for the cluster loop besides the request."""

    phases: dict[str, float]  # filled in: where the wall time went
    log_dir: str
    history: dict[str, float]  # case_id -> last duration (the cost model)
    deferral: Deferral | None  # while the Triton warm-up runs
    per_gpu: int  # workers per GPU, resolved
    gpus: list[int]  # filled in: the run's GPUs, once connected (orchestrator/gpu_share.py)


def _execute(
    store, run_id: int, cases, req: RunRequest, phases: dict[str, float], gpus: list[int] | None = None
) -> dict[str, CaseResult]:
    """Run the cases on Ray. `phases` receives where the wall time went: cluster (connect),
    first_result (from connect to the first result: worker start-up, imports, the first session),
    cases (from then to the last result), shutdown. On this machine's GPUs, Triton's kernel cache is
    warmed by helper processes meanwhile (--precompile-jobs, None: ORCH_PRECOMPILE_JOBS or auto)."""
    if not cases:
        return {}
    log_dir = tempfile.mkdtemp(prefix="orch-workers-")
    history = store.durations()
    jit = _jit_backends(cases)
    warmup = _start_precompile(cases, req, log_dir, history, jit)  # before the cluster: its start-up overlaps ours
    results: dict[str, CaseResult] = {}
    try:
        work = _Work(
            phases,
            log_dir,
            history,
            _deferral(jit, warmup),
            _per_gpu(req.memory, cases, store, req.devices),
            gpus if gpus is not None else [],
        )
        with _ray_logging(req.verbose):
            results = _on_cluster(store, run_id, cases, req, work)
        return results
    finally:
        if warmup is not None:
            from orchestrator.executor.precompile import covered

            warmup.stop(covered=covered(cases, results))


def _per_gpu(memory, cases, store, devices: str) -> int:
    """--workers-per-gpu resolved (auto: orchestrator/executor/packing.py, on this machine's cores,
    GPUs and device memory, by the cases' needs recorded in the store)."""
    if memory.workers_per_gpu != "auto":
        return memory.workers_per_gpu
    from backend.attention.capabilities import driver_gpu_memory, local_gpu_count
    from orchestrator.executor.packing import auto_per_gpu, worker_need

    gpus = 0 if devices == "cpu" else local_gpu_count()
    device_bytes = memory.gpu_memory or driver_gpu_memory()
    packing = auto_per_gpu(
        worker_need((c.case_id for c in cases), store.memory_needs()),
        device_bytes,
        memory.utilization,
        os.cpu_count() or 1,
        gpus,
    )
    if gpus:
        _err(f"workers per GPU: {packing.why}")
    return packing.per_gpu


def _start_precompile(cases, req: RunRequest, log_dir: str, history, jit: frozenset[str]):
    """The Triton warm-up helpers (orchestrator/executor/precompile.py) for a run on this
    machine's GPUs, or None. `jit`: the run's backends whose kernels compile on first use."""
    from backend.attention.capabilities import local_gpu_count
    from orchestrator.executor import precompile

    jobs = precompile.resolve_jobs(req.precompile_jobs, other_work=any(c.backend not in jit for c in cases))
    local = req.address == "local" and not os.environ.get("RAY_ADDRESS")
    if jobs < 1 or req.devices == "cpu" or not local or os.environ.get(RUNNER_ENV):  # a test runner: no checker
        return None
    if not local_gpu_count():
        return None
    warmup = precompile.start(cases, jobs=jobs, log_dir=log_dir, history=history)
    if warmup is not None:
        _err(
            f"precompile: {plural(jobs, 'helper process', 'helper processes')} warming Triton's kernel cache "
            f"from {plural(warmup.count, 'tp 1 case')} (log {warmup.log_path})"
        )
    return warmup


def _deferral(jit: frozenset[str], warmup):
    """While the warm-up helpers run, the cases of the `jit` backends (whose kernels they compile)
    wait for the others (the worker would compile the same kernels itself)."""
    if warmup is None or not jit:
        return None
    from orchestrator.executor.executor import Deferral

    return Deferral(jit, warmup.running)


def _jit_backends(cases) -> frozenset[str]:
    """The backends among the cases whose kernels compile on first use (torch-free for builtins)."""
    from backend.attention.registry import get_capabilities

    return frozenset(b for b, f in {(c.backend, c.attention) for c in cases} if get_capabilities(b, f).jit_kernels)


def _on_cluster(store, run_id: int, cases, req: RunRequest, work: _Work) -> dict[str, CaseResult]:
    from orchestrator.executor.cluster import connect, disconnect
    from orchestrator.executor.executor import ExecConfig, Executor
    from orchestrator.executor.progress import Progress
    from orchestrator.interrupts import rearm

    t0 = time.monotonic()
    cluster = connect(
        req.address,
        devices=req.devices,
        workers=req.workers,
        min_slots=max(c.tp for c in cases),
        workers_per_gpu=work.per_gpu,
        max_gpus=req.max_gpus,
    )
    rearm()  # ray.init installed its own SIGTERM handler (sys.exit): ours closes the run first
    t_up = time.monotonic()
    phases = work.phases
    phases["cluster"] = t_up - t0
    marks: list[float] = []
    _err(cluster.banner)
    if cluster.device_kind == "gpu":
        work.gpus.append(max(1, cluster.total_slots // cluster.workers_per_gpu))
    config = ExecConfig(
        timeout_s=req.timeout_s,
        log_dir=work.log_dir,
        gpu_memory_utilization=req.memory.utilization,
        gpu_memory_bytes=req.memory.gpu_memory,
    )
    if cluster.device_kind == "gpu" and cluster.workers_per_gpu > 1:
        # Cases measured to need more than one worker's share run on wider workers (packing.slot_width).
        from backend.attention.capabilities import driver_gpu_memory

        config = dataclasses.replace(
            config, memory_needs=store.memory_needs(), device_bytes=config.gpu_memory_bytes or driver_gpu_memory()
        )
    if os.environ.get(RUNNER_ENV):
        config = dataclasses.replace(config, runner=os.environ[RUNNER_ENV])
    progress = Progress(len(cases), live=sys.stderr.isatty(), quiet=req.no_progress)

    def on_results(items: list[tuple[CaseResult, bool]]) -> None:
        store.record_many(run_id, items)  # durable before anything below reports it
        now = time.monotonic()
        marks.extend(now for _ in items)
        for result, final in items:
            if final:
                progress.update(result)

    try:
        return Executor(
            cluster, config, on_results=on_results, history=work.history, deferral=work.deferral, on_notice=_err
        ).run(cases)
    finally:
        progress.close()
        t_end = time.monotonic()
        disconnect(cluster)
        if marks:
            phases["first_result"] = marks[0] - t_up
            phases["cases"] = marks[-1] - marks[0]
        phases["shutdown"] = time.monotonic() - (marks[-1] if marks else t_end)
