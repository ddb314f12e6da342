"""The end-of-run artifacts of `orch run`: JUnit XML, the markdown summary, the static dashboard,
all from one `outputs.gather` (so they agree with `orch report` and `orch gate`).

Each names its run (summary heading, JUnit `run_id`/`run_status` properties, dashboard header) and
says INTERRUPTED when the run did not finish. A run clears the artifacts it will write before
any case runs (`clear`): whatever stops it later (Ctrl-C, SIGTERM, SIGKILL), an earlier run's
green summary is never left in OUT looking current (#33).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from orchestrator import gate_notes, junit, summary
from orchestrator.dashboard.build import write_dashboard
from orchestrator.errors import InfraError
from orchestrator.gate import GateOutcome
from orchestrator.outputs import RunView, gather
from orchestrator.store import ResultStore


@dataclass(frozen=True)
class OutputPaths:
    out_dir: str
    junit: str
    summary: str
    dashboard_dir: str

    @property
    def files(self) -> tuple[str, ...]:
        return (self.junit, self.summary, os.path.join(self.dashboard_dir, "index.html"))


def output_paths(out_dir: str, junit_path: str | None = None, summary_path: str | None = None) -> OutputPaths:
    return OutputPaths(out_dir, junit_path or os.path.join(out_dir, "junit.xml"),
                       summary_path or os.path.join(out_dir, "summary.md"), os.path.join(out_dir, "dashboard"))


def clear(paths: OutputPaths) -> list[str]:
    """Remove the artifacts an earlier run left where this run will write; returns what went."""
    gone = []
    for path in paths.files:
        for p in (path, path + ".tmp"):
            try:
                os.remove(p)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise InfraError(f"cannot remove an earlier run's output: {e.strerror}", source=p) from None
            gone.append(p)
    return gone


def write_view(store: ResultStore, view: RunView, paths: OutputPaths) -> None:
    """JUnit XML, markdown summary (+ $GITHUB_STEP_SUMMARY), dashboard for a gathered run."""
    try:
        os.makedirs(paths.out_dir, exist_ok=True)
        for p in (paths.junit, paths.summary):
            os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
        junit.write(paths.junit, view.results, view.gate, suite_name=view.run.matrix, run_id=view.run.id,
                    run_status=view.run.status, planned=view.planned)  # fmt: skip
        summary.write(paths.summary, summary.render(view.run, view.results, view.gate) + gate_notes.markdown(view))
        write_dashboard(store, view, paths.dashboard_dir)
    except OSError as e:
        raise InfraError(f"cannot write outputs: {e.strerror}", source=e.filename or paths.out_dir) from None


def write_outputs(
    store: ResultStore,
    run_id: int,
    *,
    out_dir: str,
    junit_path: str | None = None,
    summary_path: str | None = None,
    baseline: str | None = None,
    known_failures: str | None = None,
) -> GateOutcome:
    """End of `orch run`: gate, JUnit XML, markdown summary (+ $GITHUB_STEP_SUMMARY), dashboard."""
    view = gather(store, run_id, baseline=baseline, known_failures=known_failures)
    write_view(store, view, output_paths(out_dir, junit_path, summary_path))
    return view.gate
