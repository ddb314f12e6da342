"""What the gate knows from history and the known-failures file, as lines for every output.

`orch run` (stdout), `orch gate`, `orch report` and the markdown summary all say the same: which
known-failures file applied, which baseline was used (or why a label found none), which cases a
`mute: true` entry keeps from gating (each with its own status, by entry), which expired
known-failures entries no longer cover a failing case, which failures the flakiness window
excused, and a paste-ready entry for the new failures, narrowed to the axes that failed
(suggest.py).
"""

from __future__ import annotations

from orchestrator import digest, suggest
from orchestrator.gate import NEW_FAILURES
from orchestrator.outputs import RunView


def new_failures(view: RunView) -> list[str]:
    return sorted(cid for cid, c in view.gate.classification.items() if c in NEW_FAILURES)


def suggestions(view: RunView) -> list[suggest.Suggestion]:
    return suggest.suggest(view.results, new_failures(view))


def muted_lines(view: RunView, *, verbose: bool = False) -> list[str]:
    """One line per `mute: true` entry that matched: "muted 2 by kf.yaml:3 (until 2027-01-31,
    https://...; not gating): a (error), b (pass)"; every case with `verbose`, else a sample."""
    gate = view.gate
    by_id = {r.case_id: r for r in view.results}
    by_entry: dict[str, list[str]] = {}
    for cid in gate.muted:
        kf = gate.known_reasons.get(cid)
        where = f"by {kf.where} (until {kf.until}, {kf.link}; not gating)" if kf else "(not gating)"
        r = by_id.get(cid)
        by_entry.setdefault(where, []).append(f"{cid} ({r.status.value if r else 'no result'})")
    out = []
    for where, ids in by_entry.items():
        shown = ", ".join(ids) if verbose else digest.sample(ids)
        out.append(f"muted {len(ids)} {where}: {shown}")
    return out


def lines(view: RunView, *, with_entries: bool = True, verbose: bool = False, with_muted: bool = True) -> list[str]:
    """`verbose`: every muted case rather than a sample; `with_muted` False where the output has a
    muted section of its own (summary.md)."""
    gate, out = view.gate, []
    if view.known is not None:  # which file applied: --known-failures, or the one the matrix names
        out.append(
            f"known failures: {view.known.source} ({len(view.known.entries)} "
            f"entr{'y' if len(view.known.entries) == 1 else 'ies'})"
        )
    if view.baseline.note:
        out.append(view.baseline.note)
    elif view.baseline.where:
        out.append(f"baseline: {view.baseline.where}")
    if with_muted:
        out += muted_lines(view, verbose=verbose)
    by_entry: dict[str, list[str]] = {}
    for cid, entry in sorted(gate.expired.items()):
        by_entry.setdefault(f"{entry.where} (until {entry.until})", []).append(cid)
    for where, ids in by_entry.items():
        out.append(f"known failure {where} has expired: {len(ids)} failing case(s) gate again: {digest.sample(ids)}")
    if gate.flaky_history:
        ids = sorted(gate.flaky_history)
        out.append(f"flaky by history (not gating) {len(ids)}: {digest.sample(ids)} ({gate.flaky_history[ids[0]]})")
    if with_entries:
        found = suggestions(view)
        if found:
            out.append(f"paste-ready known-failures entries for the {len(new_failures(view))} new failure(s):")
            out += ["    " + line for e in found for line in e.to_yaml().splitlines()]
    return out


def markdown(view: RunView) -> str:
    """The summary's section (appended after summary.render): baseline, expiries, entries."""
    notes = lines(view, with_entries=False, with_muted=False)
    found = suggestions(view)
    if not notes and not found:
        return ""
    md = ["", "### History and known failures", ""] + [f"- {n}" for n in notes]
    if found:
        md += [
            "",
            "Paste-ready known-failures entries (narrowed to the axes that failed; fill in reason and link):",
            "",
            "```yaml",
            *suggest.render(found).splitlines(),
            "```",
        ]
    return "\n".join(md) + "\n"
