"""`orch dashboard`: write the static dashboard for a run (OUT/index.html). Exit 0 when written:
it prints no verdict (the page shows it); `orch gate` is the command that exits by one.

Without --run: the run whose outputs the folder holds (a run's own OUT/dashboard, or a dashboard
written there before: artifacts.held_run), else the store's latest. The run is judged as `orch run`
judged it unless an option here says otherwise."""

from __future__ import annotations

import click

from orchestrator import defaults
from orchestrator.artifacts import held_run
from orchestrator.dashboard.build import write_dashboard
from orchestrator.errors import InfraError
from orchestrator.judging import Judging
from orchestrator.outputs import gather
from orchestrator.store import ResultStore


def main(db: str | None = None, run_id: int | str | None = None, out_dir: str | None = None, **judging) -> int:
    """`judging`: the options of judging.CLI_KEYS given; the others are the run's own."""
    asked = Judging.from_cli(judging)
    out_dir = out_dir or defaults.dashboard_out()
    with ResultStore(db or defaults.db(), readonly=True) as store:
        if run_id is None:
            run_id = held_run(store, out_dir)
        view = gather(store, run_id, asked)
        try:
            path = write_dashboard(store, view, out_dir)
        except OSError as e:
            raise InfraError(f"cannot write dashboard: {e.strerror}", source=e.filename or out_dir) from None
    click.echo(f"dashboard: {path} (run {view.run.id}{' ' + view.state if view.state else ''})")
    return 0
