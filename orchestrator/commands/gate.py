"""`orch gate`: recompute the verdict of a run from the store; exit 0 (passed) or 1 (failed).

Sized for a CI log: one line per class that gates (a count and a few ids), the fixed known
failures, then the headline (run id, INTERRUPTED when it did not finish, the verdict). -v lists
every case instead (`orch gate --run 2` once printed 702 lines of missing cases, #33).
"""

from __future__ import annotations

import click

from orchestrator import digest
from orchestrator.gate import CLASSIFICATIONS, GATING
from orchestrator.outputs import gather
from orchestrator.store import ResultStore


def main(db: str, run_id: str | None = None, baseline: str | None = None, known_failures: str | None = None,
         verbose: bool = False, allow_unverifiable: bool = False) -> int:  # fmt: skip
    with ResultStore(db, readonly=True) as store:
        view = gather(store, run_id, baseline=baseline, known_failures=known_failures,
                      allow_unverifiable=allow_unverifiable)
    gate = view.gate
    if verbose:
        for cid in gate.gating:
            click.echo(f"{gate.classification[cid]}: {cid}")
        for cid in gate.fixed:
            click.echo(f"fixed (remove its known-failures entry): {cid}")
    else:
        for line in digest.gate_lines(gate.classification, [c for c in CLASSIFICATIONS if c in GATING]):
            click.echo(line)
        if gate.fixed:
            click.echo(f"fixed {len(gate.fixed)} (remove their known-failures entries): {digest.sample(gate.fixed)}")
        if gate.gating or gate.fixed:
            click.echo("(-v lists every case)")
    click.echo(view.headline())
    return int(gate.exit_code)
