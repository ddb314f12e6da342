"""What `orch run` ends with on stdout: the gate's lines (one per gating class, a sample of ids),
the first failure's repro, skips by reason, the history notes, the `time:` line and the final
line with the verdict; downgrades come back as warnings for stderr. Sized for a CI log; -v lists
every non-passing case with its reason and repro instead of the class lines.
"""

from __future__ import annotations

from backend.result import Status
from orchestrator.commands.repro import verdict_line
from orchestrator.gpu_share import GpuShare

_REPORT = (Status.FAIL, Status.ERROR, Status.TIMEOUT, Status.UNVERIFIABLE, Status.FLAKY, Status.NOT_RUN)
MAX_REASONS = 5  # skip reasons in the run's last lines; summary.md has them all

# The `time:` line's phases, labelled by what each measures (commands/run.py sets them).
PHASE_LABELS = {
    "matrix": "load matrix", "cluster": "start cluster", "first_result": "start to first result",
    "cases": "first to last result", "shutdown": "shutdown", "outputs": "write outputs",
}  # fmt: skip # a table: one row per line, as it reads


def time_line(phases: dict[str, float], share: GpuShare | None = None) -> str:
    """'time: load matrix 0.1s, ...'; on GPUs with the busy share they were kept at (gpu_share.py)."""
    line = "time: " + ", ".join(f"{PHASE_LABELS.get(k, k)} {v:.1f}s" for k, v in phases.items())
    return f"{line}; {share.line()}" if share is not None else line


def last_lines(view, *, verbose: bool) -> tuple[list[str], list[str]]:
    """(summary lines, warnings): what the run ends with before its time and verdict lines, sized
    for a CI log: one line per gating class (a sample of ids), the first failure's repro, skips by
    reason, the history notes (gate_notes.py); and the downgrades by kind, as warnings. -v: every
    non-passing case with its reason and repro instead of the class lines."""
    from orchestrator import digest, gate_notes
    from orchestrator.gate import CLASSIFICATIONS, GATING
    from orchestrator.outputs import downgrades, skips

    gate = view.gate
    out: list[str] = []
    if verbose:
        for r in view.results:  # sorted by case id (store order)
            if r.status in _REPORT:
                out.append(f"{verdict_line(r.replace(reason=r.reason[:200]))}\n    repro: {r.repro}")
    else:
        shown = [c for c in CLASSIFICATIONS if c in GATING or c in ("flaky", "fixed")]
        out += digest.gate_lines(gate.classification, shown)
        by_id = {r.case_id: r for r in view.results}
        first = next((by_id[c] for c in gate.gating if c in by_id and by_id[c].repro), None)
        if first is not None:
            out.append(f"repro {first.case_id}: {first.repro}")
        if out:
            out.append("-v lists every case with its reason and repro; so does the summary")
    out += gate_notes.lines(view)
    groups = digest.skip_lines(skips(view.results))
    if groups:
        out.append(
            f"skipped {sum(1 for r in view.results if r.status == Status.SKIP)} by reason:\n    "
            + "\n    ".join(
                groups[:MAX_REASONS]
                + (
                    [f"... and {len(groups) - MAX_REASONS} more reasons (summary.md)"]
                    if len(groups) > MAX_REASONS
                    else []
                )
            )
        )
    return out, [f"warning: {line}" for line in digest.downgrade_lines(downgrades(view.results))]


def final_line(view, *, elapsed: float, out_dir: str, signal_name: str | None) -> str:
    """ "run 3 (6 of 90 cases, --filter 'tp=1'): 4 ran (pass 4), 2 skipped, 12.3s -> gate PASSED: ..."."""
    from orchestrator.outputs import selection

    ran = view.ran()
    counts: dict[str, int] = {}
    for r in ran:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    shown = " ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    what = f"{len(ran)} ran" + (f" ({shown})" if shown else "") + f", {len(view.results) - len(ran)} skipped"
    sel = selection(view.run)
    run = f"run {view.run.id}" + (f" ({sel})" if sel else "")
    if signal_name is None:
        return f"{run}: {what}, {elapsed:.1f}s -> {view.gate.verdict()} (outputs in {out_dir})"
    return (
        f"{run} INTERRUPTED by {signal_name} after {elapsed:.1f}s: {what}, "
        f"{len(view.gate.missing)} missing -> {view.gate.verdict()} (outputs in {out_dir}, marked INTERRUPTED); "
        f"finish it with `orch run --resume {view.run.id}`"
    )
