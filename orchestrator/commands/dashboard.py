"""`orch dashboard`: write the static dashboard for a run (OUT/index.html). Exit 0 when written:
it prints no verdict (the page shows it); `orch gate` is the command that exits by one."""

from __future__ import annotations

import click

from orchestrator import defaults
from orchestrator.dashboard.build import write_dashboard
from orchestrator.errors import InfraError
from orchestrator.outputs import gather
from orchestrator.store import ResultStore


def main(db: str | None = None, run_id: str | None = None, baseline: str | None = None,
         known_failures: str | None = None, out_dir: str | None = None, allow_unverifiable: bool = False) -> int:
    out_dir = out_dir or defaults.dashboard_out()
    with ResultStore(db or defaults.db(), readonly=True) as store:
        view = gather(store, run_id, baseline=baseline, known_failures=known_failures,
                      allow_unverifiable=allow_unverifiable)
        try:
            path = write_dashboard(store, view, out_dir)
        except OSError as e:
            raise InfraError(f"cannot write dashboard: {e.strerror}", source=e.filename or out_dir) from None
    click.echo(f"dashboard: {path} (run {view.run.id}{' ' + view.state if view.state else ''})")
    return 0
