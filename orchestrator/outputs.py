"""What every reporting command needs from the store, gathered once.

`gather` resolves the run, its results, the baseline and the known failures and evaluates the gate;
`report`, `gate`, `dashboard`, `serve` and `artifacts.write_outputs` (called by `orch run`) all
start there, so they can never disagree about a verdict. Imports run one way: the writers
(junit, summary, dashboard, artifacts) import this module, never the reverse.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from backend.result import CaseResult, Status
from orchestrator import flakiness
from orchestrator.errors import InputError
from orchestrator.gate import GateOutcome, evaluate
from orchestrator.known_failures import KnownFailures, load
from orchestrator.store import ResultStore, RunInfo
from orchestrator.store.refs import Baseline, find_baseline, history_runs, label_of


@dataclass(frozen=True)
class RunView:
    run: RunInfo
    results: tuple[CaseResult, ...]
    gate: GateOutcome
    planned: tuple[dict, ...]  # Case.axes + case_id of planned cases without a result
    baseline_given: bool
    known: KnownFailures | None
    baseline: Baseline = Baseline(None)  # which run it was, or why a label found none
    flakiness: dict = field(default_factory=dict)  # case_id -> flakiness.Flakiness over the window
    window: tuple[int, ...] = ()  # the run ids the flakiness window covers, latest first
    window_label: str = ""  # the label of those runs

    @property
    def state(self) -> str:
        return run_state(self.run)

    def headline(self) -> str:
        return headline(self.run, self.gate)

    def ran(self) -> tuple[CaseResult, ...]:
        return tuple(r for r in self.results if r.status != Status.SKIP)


# runs.status -> the word outputs show; "finished" shows none.
RUN_STATES = {"interrupted": "INTERRUPTED", "failed": "FAILED", "running": "RUNNING"}


def run_state(run: RunInfo) -> str:
    """"" for a finished run, else what every output must call it: INTERRUPTED (Ctrl-C, SIGTERM),
    FAILED (the driver stopped on an error), RUNNING (results still arriving)."""
    return RUN_STATES.get(run.status, "")


def headline(run: RunInfo, gate: GateOutcome) -> str:
    """The line each output leads with: which run, its state unless finished, the verdict. An
    interrupted run's outputs must never read as a finished run's (#33)."""
    state = run_state(run)
    if not state:
        return f"run {run.id}: {gate.verdict()}"
    return f"run {run.id} {state} ({run.num_results} of {run.num_cases} cases recorded): {gate.verdict()}"


def selection(run: RunInfo) -> str:
    """What of its matrix a run covers, when it is not all of it as written: "6 of 90 cases,
    --filter 'tp=1', --backend vllm:FLEX_ATTENTION" ("" for a whole matrix; RunOptions). M counts
    the matrix's cases before --filter, with --backend applied."""
    opts = run.options
    parts = []
    if opts.filter or opts.backend or (opts.matrix_cases and opts.matrix_cases != run.num_cases):
        parts.append(f"{run.num_cases} of {opts.matrix_cases} cases" if opts.matrix_cases else f"{run.num_cases} cases")
    if opts.filter:
        parts.append(f"--filter {shlex.quote(opts.filter)}")
    if opts.backend:
        parts.append(f"--backend {shlex.quote(opts.backend)}")
    return ", ".join(parts)


def skips(results: Sequence[CaseResult]) -> list[tuple[str, str]]:
    """(reason, backend) per skipped case, for digest.skip_groups."""
    return [(r.reason or "skipped", str(r.axes.get("backend", "?"))) for r in results if r.status == Status.SKIP]


def downgrades(results: Sequence[CaseResult]) -> list[tuple[str, str, str, str]]:
    """(requested, resolved, backend, attention family) per downgraded case, for digest.downgrade_groups."""
    return [(r.requested_mode, r.resolved_mode, str(r.axes.get("backend", "?")), str(r.axes.get("attention") or "gqa"))
            for r in results if r.downgraded]


def pick_run(store: ResultStore, run_id: int | str | None) -> int:
    if run_id is None or str(run_id).strip() in ("", "latest"):
        latest = store.latest_run_id()
        if latest is None:
            raise InputError("no runs in this database yet (run `orch run MATRIX` first)", source=store.path)
        return latest
    try:
        return int(run_id)
    except (TypeError, ValueError):
        raise InputError(f"--run must be a run id (an integer), got {run_id!r}") from None


def gather(
    store: ResultStore,
    run_id: int | str | None,
    *,
    baseline: str | None = None,
    known_failures: str | KnownFailures | None = None,
    flaky_window: int = flakiness.DEFAULT_WINDOW,
    flaky_threshold: float | None = None,
    require: Sequence[str] = (),
    allow_empty: bool = False,
    allow_unverifiable: bool = False,
) -> RunView:
    """flaky_window: runs of the history (the baseline's label when `--baseline LABEL`, else the
    run's own) whose verdicts score each case's flakiness; flaky_threshold: a failing case scoring
    over it is `flaky` rather than gating (None: scores are shown, never used). `require` /
    `allow_empty` add to the run's own (RunOptions: what `orch run` was given), so `orch gate` and
    `orch report` judge a run as `orch run` did, and may ask for more."""
    rid = pick_run(store, run_id)
    run = store.run(rid)
    results = store.results(rid)
    known = known_failures if isinstance(known_failures, KnownFailures) else load(known_failures)
    found = find_baseline(baseline or None, store, rid)
    base = list(found.results) if found.results is not None else None
    window_label = label_of(baseline) or run.label
    window = history_runs(store, run, window_label, flaky_window) if flaky_window > 0 else []
    scores = flakiness.scores(store.status_history(run_ids=[r.id for r in window]))
    missing = store.missing_case_ids(rid)
    planned_missing: list[dict] = []
    if missing:
        wanted = set(missing)
        planned_missing = [{"case_id": c.case_id, **c.axes} for c in store.planned_cases(rid) if c.case_id in wanted]
    # A running run's unfinished cases are pending, not missing: only a closed run can miss results.
    # Nor can a running run be judged empty: its cases may still come.
    closed = run.status != "running"
    gate = evaluate(results, baseline=base, known=known, missing=missing if closed else (),
                    flaky_history=flakiness.over_threshold(scores, flaky_threshold),
                    require=tuple(dict.fromkeys([*run.options.require, *require])),
                    allow_empty=run.options.allow_empty or allow_empty, judge_empty=closed,
                    allow_unverifiable=run.options.allow_unverifiable or allow_unverifiable)  # fmt: skip
    return RunView(run, tuple(results), gate, tuple(planned_missing), base is not None, known, found, scores,
                   tuple(r.id for r in window), window_label)  # fmt: skip


def memory_line(results: Sequence[CaseResult]) -> str:
    """One line on the run's device memory (CaseResult.memory, issue 37), '' where none was measured
    (a CPU run records sessions only): the largest peak and the largest need, with their cases."""
    measured = [r for r in results if "peak_allocated" in r.memory]
    if not measured:
        return ""
    gib = 1024**3
    peak = max(measured, key=lambda r: r.memory.get("peak_reserved", 0))
    need = max(measured, key=lambda r: r.memory.get("needs", 0))
    budget = max((r.memory.get("budget", 0) for r in measured), default=0)
    text = (f"device memory: peak reserved {peak.memory.get('peak_reserved', 0) / gib:.2f} GiB ({peak.case_id}), "
            f"largest need {need.memory.get('needs', 0) / gib:.2f} GiB ({need.case_id})")
    return text + (f", worker budget {budget / gib:.2f} GiB" if budget else "")
