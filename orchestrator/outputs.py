"""What every reporting command needs from the store, gathered once.

`gather` resolves the run, its results, the baseline and the known failures and evaluates the gate;
`report`, `gate`, `dashboard`, `serve` and `artifacts.write_outputs` (called by `orch run`) all
start there, so they can never disagree about a verdict. Imports run one way: the writers
(junit, summary, dashboard, artifacts) import this module, never the reverse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backend.result import CaseResult, Status
from orchestrator.errors import InputError
from orchestrator.gate import GateOutcome, evaluate
from orchestrator.known_failures import KnownFailures, load
from orchestrator.store import ResultStore, RunInfo, resolve_baseline


@dataclass(frozen=True)
class RunView:
    run: RunInfo
    results: tuple[CaseResult, ...]
    gate: GateOutcome
    planned: tuple[dict, ...]  # Case.axes + case_id of planned cases without a result
    baseline_given: bool
    known: KnownFailures | None

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
    allow_unverifiable: bool = False,
) -> RunView:
    rid = pick_run(store, run_id)
    run = store.run(rid)
    results = store.results(rid)
    known = known_failures if isinstance(known_failures, KnownFailures) else load(known_failures)
    base = resolve_baseline(baseline or None, store, rid)
    missing = store.missing_case_ids(rid)
    planned_missing: list[dict] = []
    if missing:
        wanted = set(missing)
        planned_missing = [{"case_id": c.case_id, **c.axes} for c in store.planned_cases(rid) if c.case_id in wanted]
    # A running run's unfinished cases are pending, not missing: only a closed run can miss results.
    gate = evaluate(results, baseline=base, known=known, missing=missing if run.status != "running" else (),
                    allow_unverifiable=allow_unverifiable)
    return RunView(run, tuple(results), gate, tuple(planned_missing), base is not None, known)
