"""What every reporting command needs from the store, gathered once.

`gather` resolves the run, its results, the baseline and the known failures and evaluates the gate;
`report`, `gate`, `dashboard`, `serve` and `artifacts.write_outputs` (called by `orch run`) all
start there, so they can never disagree about a verdict. Imports run one way: the writers
(junit, summary, dashboard, artifacts) import this module, never the reverse.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from backend.result import CaseResult, Status
from orchestrator import flakiness
from orchestrator.errors import InputError
from orchestrator.gate import GateOutcome, evaluate
from orchestrator.judging import Judging, unmasked
from orchestrator.known_failures import KnownFailures, load
from orchestrator.store import ResultStore, RunInfo
from orchestrator.store.refs import (
    Baseline,
    find_baseline,
    history_runs,
    label_of,
    parse_ref,
    select_run,
)


@dataclass(frozen=True)
class RunView:
    run: RunInfo
    results: tuple[CaseResult, ...]
    gate: GateOutcome
    planned: tuple[dict, ...]  # Case.axes + case_id of planned cases without a result
    baseline_given: bool
    known: KnownFailures | None
    baseline: Baseline = field(default_factory=lambda: Baseline(None))  # which run it was, or why a label found none
    flakiness: dict = field(default_factory=dict)  # case_id -> flakiness.Flakiness over the window
    window: tuple[int, ...] = ()  # the run ids the flakiness window covers, latest first
    window_label: str = ""  # the label of those runs
    judging: Judging = field(default_factory=Judging)  # what judged it (judging.py)

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
    """ "" for a finished run, else what every output must call it: INTERRUPTED (Ctrl-C, SIGTERM),
    FAILED (the driver stopped on an error), RUNNING (results still arriving)."""
    return RUN_STATES.get(run.status, "")


def headline(run: RunInfo, gate: GateOutcome) -> str:
    """The line each output leads with: which run, its state unless finished, the verdict. An
    interrupted run's outputs must never read as a finished run's."""
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
    return [
        (r.requested_mode, r.resolved_mode, str(r.axes.get("backend", "?")), str(r.axes.get("attention") or "gqa"))
        for r in results
        if r.downgraded
    ]


def pick_run(store: ResultStore, run: int | str | None) -> int:
    """`--run`: a run id, `latest`, or a label (its latest finished run, as `--baseline LABEL`
    names one); None: the store's latest run."""
    selector = "latest" if run is None or not str(run).strip() else str(run).strip()
    if selector == "latest" and store.latest_run_id() is None:
        raise InputError("no runs in this database yet (run `orch run MATRIX` first)", source=store.path)
    ref = parse_ref(selector)
    if ref.store is not None:
        raise InputError(f"--run {selector!r}: give a run id or a label of --db (another store is --db's job)")
    return select_run(store, ref.selector).id


def gather(store: ResultStore, run: int | str | None, asked: Judging | None = None) -> RunView:
    """The run (`pick_run`), its results and its gate, judged by what `asked` gives and, for what
    it does not, by what judged the run when it ran (judging.py): so `orch gate` and `orch report`
    print the verdict `orch run` printed, and may ask for another. The flakiness window is the
    history of the baseline's label when `--baseline LABEL`, else the run's own label; a
    threshold makes a failing case scoring over it `flaky` rather than gating."""
    rid = pick_run(store, run)
    info = store.run(rid)
    judging = (asked or Judging()).over(info)
    results = store.results(rid)
    known = judging.known_failures
    if not isinstance(known, KnownFailures):
        known = load(shown_path(known) if known else None)
    found = find_baseline(unmasked(judging.baseline or "", store.location, rid) or None, store, rid)
    base = list(found.results) if found.results is not None else None
    window_label = label_of(judging.baseline) or info.label
    window = history_runs(store, info, window_label, judging.flaky_window) if judging.flaky_window else []
    scores = flakiness.scores(store.status_history(run_ids=[r.id for r in window]))
    missing = store.missing_case_ids(rid)
    planned_missing: list[dict] = []
    if missing:
        wanted = set(missing)
        planned_missing = [{"case_id": c.case_id, **c.axes} for c in store.planned_cases(rid) if c.case_id in wanted]
    # A running run's unfinished cases are pending, not missing: only a closed run can miss results.
    # Nor can a running run be judged empty: its cases may still come.
    closed = info.status != "running"
    gate = evaluate(
        results,
        baseline=base,
        known=known,
        missing=missing if closed else (),
        flaky_history=flakiness.over_threshold(scores, judging.flaky_threshold),
        rules=judging.rules,
        judge_empty=closed,
    )
    return RunView(
        info,
        tuple(results),
        gate,
        tuple(planned_missing),
        base is not None,
        known,
        found,
        scores,
        tuple(r.id for r in window),
        window_label,
        judging,
    )


def shown_path(path: str) -> str:
    """A stored absolute path as messages show it: relative to the working directory when under it."""
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return path if rel.startswith("..") else rel


def memory_line(results: Sequence[CaseResult]) -> str:
    """One line on the run's device memory (CaseResult.memory), '' where none was measured
    (a CPU run records sessions only): the largest peak and the largest need, with their cases."""
    measured = [r for r in results if "peak_allocated" in r.memory]
    if not measured:
        return ""
    gib = 1024**3
    peak = max(measured, key=lambda r: r.memory.get("peak_reserved", 0))
    need = max(measured, key=lambda r: r.memory.get("needs", 0))
    budget = max((r.memory.get("budget", 0) for r in measured), default=0)
    text = (
        f"device memory: peak reserved {peak.memory.get('peak_reserved', 0) / gib:.2f} GiB ({peak.case_id}), "
        f"largest need {need.memory.get('needs', 0) / gib:.2f} GiB ({need.case_id})"
    )
    return text + (f", worker budget {budget / gib:.2f} GiB" if budget else "")
