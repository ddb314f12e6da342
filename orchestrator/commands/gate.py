"""`orch gate`: recompute the verdict of a run from the store; exit 0 (passed) or 1 (failed).

Sized for a CI log: one line per class that gates (a count and a few ids), the fixed known
failures, the run's selection when it is not its whole matrix, then the headline (run id,
INTERRUPTED when it did not finish, the verdict). -v lists every case instead. Then the history
notes (gate_notes.py): the known-failures file, the baseline used, the muted cases (every one with
-v), expired known failures, paste-ready entries. The run is judged as `orch run` judged it (its
stored options) unless an option here says otherwise.
"""

from __future__ import annotations

import click

from orchestrator import defaults, digest, gate_notes
from orchestrator.gate import CLASSIFICATIONS, GATING
from orchestrator.judging import Judging
from orchestrator.outputs import gather, selection
from orchestrator.store import ResultStore


def main(db: str | None = None, run_id: str | None = None, verbose: bool = False, **judging) -> int:
    """`judging`: the options of judging.CLI_KEYS given; the others are the run's own."""
    asked = Judging.from_cli(judging)
    with ResultStore(db or defaults.db(), readonly=True) as store:
        view = gather(store, run_id, asked)
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
    for line in gate_notes.lines(view, verbose=verbose):
        click.echo(line)
    sel = selection(view.run)
    if sel:  # a filtered or re-targeted run's verdict covers that slice only
        click.echo(f"selection: {sel}")
    click.echo(view.headline())
    return int(gate.exit_code)
