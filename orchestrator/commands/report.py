"""`orch report`: a run from the store as text, json, md or junit; exits by the run's gate."""

from __future__ import annotations

import json
import os
import sys

from orchestrator import defaults, digest, gate_notes, junit, summary
from orchestrator.artifacts import held_run
from orchestrator.errors import InfraError
from orchestrator.gate import C
from orchestrator.judging import Judging
from orchestrator.outputs import RunView, downgrades, gather, memory_line, selection, skips
from orchestrator.store import ResultStore

# Classes the text report lists (worst first), as `orch report` always has.
_LISTED = (
    C.REGRESSION,
    C.NEW,
    C.FAIL,
    C.ERROR,
    C.TIMEOUT,
    C.NOT_RUN,
    C.OOM,
    C.MISSING,
    C.UNVERIFIABLE,
    C.OLD_FAILURE,
    C.FLAKY,
    C.KNOWN_FAIL,
    C.FIXED,
)  # muted: gate_notes, by entry


def _text(view: RunView, verbose: bool = False) -> str:
    """Plain lines (no padding, nothing wider than its content): a terminal and a CI log alike.
    Per-case lines only with -v; otherwise one line per class, skip reason and downgrade kind."""
    run, gate = view.run, view.gate
    out = [
        f"orch run {run.id}  {run.matrix}  [{run.status}]  devices={run.devices or '?'}  git={run.git_sha[:12] or 'not a checkout'}"
    ]
    sel = selection(run)
    if sel:
        out.append(f"selection: {sel}")
    if view.state:
        out.append(
            f"{view.state}: {run.num_results} of {run.num_cases} planned cases have a result; "
            f"`orch run --resume {run.id}` finishes it"
        )
    ran = view.ran()
    out.append(f"{len(ran)} ran, {len(view.results) - len(ran)} skipped, {len(gate.missing)} missing")
    out.append(", ".join(f"{k}: {v}" for k, v in gate.counts.items() if v))
    if memory_line(view.results):
        out.append(memory_line(view.results))
    by_id = {r.case_id: r for r in view.results}
    if verbose:
        order = {c: i for i, c in enumerate(_LISTED)}
        rows = sorted(
            (cid for cid, c in gate.classification.items() if c in order),
            key=lambda c: (order[gate.classification[c]], c),
        )
        for cid in rows:
            r = by_id.get(cid)
            out.append(
                f"{gate.classification[cid]:<12} {cid}  {' '.join((r.reason if r else 'no result').split())[:80]}"
            )
            if r is not None and r.repro:
                out.append(f"{'':<12} repro: {r.repro}")
    else:
        out += digest.gate_lines(gate.classification, _LISTED)
        if any(c in _LISTED for c in gate.classification.values()):
            out.append("(-v lists every case with its reason and repro)")
    groups = digest.skip_lines(skips(view.results))
    if groups:
        out.append(f"skipped {len(view.results) - len(ran)} by reason:")
        out += [f"  {g}" for g in groups]
    out += [f"warning: {line}" for line in digest.downgrade_lines(downgrades(view.results))]
    out += gate_notes.lines(view, verbose=verbose)
    out.append(view.headline())
    return "\n".join(out) + "\n"


def render(view: RunView, fmt: str, verbose: bool = False) -> str:
    if fmt == "json":
        return json.dumps(
            {
                "run": view.run.to_dict(),
                "gate": view.gate.to_dict(),
                "results": [r.to_dict() for r in view.results],
                "baseline": {
                    "run": view.baseline.run.id if view.baseline.run else None,
                    "where": view.baseline.where,
                    "note": view.baseline.note,
                },
                "flakiness": {cid: f.to_dict() for cid, f in view.flakiness.items()},
                "known_failures": view.known.source if view.known is not None else None,
                "suggested_known_failures": [e.to_yaml() for e in gate_notes.suggestions(view)],
            },
            indent=2,
            sort_keys=True,
            default=str,
        )
    if fmt == "md":
        return summary.render(view.run, view.results, view.gate) + gate_notes.markdown(view)
    if fmt == "junit":
        return junit.to_string(
            view.results,
            view.gate,
            suite_name=view.run.matrix,
            run_id=view.run.id,
            run_status=view.run.status,
            planned=view.planned,
        )
    return _text(view, verbose)


def main(
    db: str | None = None,
    run_id: int | str | None = None,
    fmt: str = "text",
    output: str | None = None,
    verbose: bool = False,
    **judging,
) -> int:
    """Every format carries the verdict, so every format exits by it (0 passed, 1 failed, 3 only
    not-run). `judging`: the options of judging.CLI_KEYS given; the others are the run's own.
    Without --run, a report written into a run's out dir (`-o orch-out/report.md`) is of that run."""
    asked = Judging.from_cli(judging)
    with ResultStore(db or defaults.db(), readonly=True) as store:
        if run_id is None and output:
            run_id = held_run(store, os.path.dirname(os.path.abspath(output)))
        view = gather(store, run_id, asked)
    text = render(view, fmt, verbose)
    if output:
        try:
            with open(output, "w", encoding="utf-8") as f:
                f.write(text if text.endswith("\n") else text + "\n")
        except OSError as e:
            raise InfraError(f"cannot write report: {e.strerror}", source=output) from None
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return int(view.gate.exit_code)
