"""`orch gate`: recompute the verdict of a run from the store; exit 0 (passed) or 1 (failed)."""

from __future__ import annotations

import click

from orchestrator.outputs import gather
from orchestrator.store import ResultStore


def main(db: str, run_id: str | None = None, baseline: str | None = None, known_failures: str | None = None) -> int:
    with ResultStore(db, readonly=True) as store:
        view = gather(store, run_id, baseline=baseline, known_failures=known_failures)
    gate = view.gate
    for cid in gate.gating:
        click.echo(f"{gate.classification[cid]}: {cid}")
    for cid in gate.fixed:
        click.echo(f"fixed (remove its known-failures entry): {cid}")
    click.echo(f"run {view.run.id}: {gate.verdict()}")
    return int(gate.exit_code)
