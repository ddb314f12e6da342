"""The end-of-run artifacts of `orch run`: JUnit XML, the markdown summary, the static dashboard,
all from one `outputs.gather` (so they agree with `orch report` and `orch gate`)."""

from __future__ import annotations

import os

from orchestrator import junit, summary
from orchestrator.dashboard.build import write_dashboard
from orchestrator.errors import InfraError
from orchestrator.gate import GateOutcome
from orchestrator.outputs import gather
from orchestrator.store import ResultStore


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
    junit_path = junit_path or os.path.join(out_dir, "junit.xml")
    summary_path = summary_path or os.path.join(out_dir, "summary.md")
    try:
        os.makedirs(out_dir, exist_ok=True)
        for p in (junit_path, summary_path):
            os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
        junit.write(junit_path, view.results, view.gate, suite_name=view.run.matrix, run_id=view.run.id)
        summary.write(summary_path, summary.render(view.run, view.results, view.gate))
        write_dashboard(store, view, os.path.join(out_dir, "dashboard"))
    except OSError as e:
        raise InfraError(f"cannot write outputs: {e.strerror}", source=e.filename or out_dir) from None
    return view.gate
