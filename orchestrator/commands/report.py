"""`orch report`: a run from the store as text (rich), json, md or junit."""

from __future__ import annotations

import io
import json
import sys

from orchestrator import junit, summary
from orchestrator.errors import InfraError
from orchestrator.outputs import RunView, gather
from orchestrator.store import ResultStore


def _text(view: RunView) -> str:
    from rich.console import Console
    from rich.table import Table

    console = Console(record=True, width=140, file=io.StringIO(), force_terminal=False, markup=False, highlight=False)
    run, gate = view.run, view.gate
    console.print(f"orch run {run.id}  {run.matrix}  [{run.status}]  devices={run.devices or '?'}  git={run.git_sha[:12] or '?'}")
    console.print(", ".join(f"{k}: {v}" for k, v in gate.counts.items() if v))
    by_id = {r.case_id: r for r in view.results}
    order = {c: i for i, c in enumerate(("regression", "new", "fail", "error", "timeout", "missing", "old-failure",
                                         "flaky", "known-fail", "fixed"))}  # fmt: skip
    rows = sorted((cid for cid, c in gate.classification.items() if c in order), key=lambda c: (order[gate.classification[c]], c))
    if rows:
        table = Table("class", "case", "reason", "repro", show_lines=False, expand=False)
        for cid in rows:
            r = by_id.get(cid)
            table.add_row(gate.classification[cid], cid, (r.reason if r else "no result")[:80], r.repro if r else "")
        console.print(table)
    for cid in gate.downgraded:
        r = by_id[cid]
        console.print(f"warning: {cid}: mode downgraded {r.requested_mode} -> {r.resolved_mode}")
    console.print(gate.verdict())
    return console.export_text()


def render(view: RunView, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(
            {"run": view.run.to_dict(), "gate": view.gate.to_dict(), "results": [r.to_dict() for r in view.results]},
            indent=2, sort_keys=True, default=str,
        )  # fmt: skip
    if fmt == "md":
        return summary.render(view.run, view.results, view.gate)
    if fmt == "junit":
        return junit.to_string(view.results, view.gate, suite_name=view.run.matrix, run_id=view.run.id)
    return _text(view)


def main(db: str, run_id: str | None = None, fmt: str = "text", baseline: str | None = None,
         known_failures: str | None = None, output: str | None = None) -> int:  # fmt: skip
    with ResultStore(db, readonly=True) as store:
        view = gather(store, run_id, baseline=baseline, known_failures=known_failures)
    text = render(view, fmt)
    if output:
        try:
            with open(output, "w", encoding="utf-8") as f:
                f.write(text if text.endswith("\n") else text + "\n")
        except OSError as e:
            raise InfraError(f"cannot write report: {e.strerror}", source=output) from None
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0
