"""Paste-ready known-failures entries for a run's new failures, each narrowed to the axes that failed.

Per backend (and attention family: their ids differ in shape), the failing cases F; against them
every case of the run that ran and did not fail, P (pass, flaky, unverifiable). A pattern is a
case-id glob built from the axes (`tp*-FULL-fp8-*-mybackend-s*`): from the first failure not yet
covered, with every axis spelled out, each axis is widened to `*` in turn while the glob still
matches no case of P; the glob then covers every failure it matches, and the next uncovered one
starts the next glob. What stays spelled out is what separates the failures from the passes:
`tp*-FULL-fp8-*` says "every tp, every batch, FULL with fp8", which one case id cannot. An axis
with one value in the run stays spelled out (a run filtered to FULL says nothing of PIECEWISE).
Skipped cases are neither: a glob may cover a tp this machine could not run.

Widening order: seed, batch, tp, spec tokens, kv dtype, mode (the axes least likely to be the cause
go first, so the cause stays spelled out). Backend and family are never widened.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from backend.result import CaseResult, Status

WIDEN_ORDER = ("seed", "batch", "tp", "spec_tokens", "kv_cache_dtype", "cudagraph_mode")
DEFAULT_DAYS = 30  # `until` of a suggested entry: a month to fix it, then it gates again
MAX_ENTRIES = 20  # per run: past that, the failures are not one cause to mute
_FAILING = frozenset({Status.FAIL, Status.ERROR, Status.TIMEOUT})
_OK = frozenset({Status.PASS, Status.FLAKY})
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")  # what Case.case_id replaces by "_"


@dataclass(frozen=True)
class Suggestion:
    pattern: str
    cases: tuple[str, ...]  # the failures it covers
    reason: str  # the first failure's reason, as a start
    until: dt.date

    def to_yaml(self) -> str:
        reason = " ".join(self.reason.split()).replace('"', "'")
        if len(reason) > 100:  # a start for the author, cut at a word
            reason = reason[:100].rsplit(" ", 1)[0] + " ..."
        return (
            f'- case: "{self.pattern}"   # {len(self.cases)} failing case(s)\n'
            f'  reason: "TODO: why ({reason})"\n'
            f'  link: "TODO: the ticket"\n'
            f"  until: {self.until.isoformat()}\n"
        )


def _seg(value) -> str:
    return _UNSAFE.sub("_", str(value))


def glob_for(axes: dict, wild: frozenset[str]) -> str:
    """The case-id glob of `axes` (backend.case.Case.case_id's layout) with the `wild` axes as *."""

    def v(name: str) -> str:
        return "*" if name in wild else _seg(axes.get(name))

    family = axes.get("attention") or "gqa"
    head = "" if family == "gqa" else f"{_seg(family)}-"
    k = int(axes.get("spec_tokens") or 0)
    if "kv_cache_dtype" in wild:
        kv = "*"
    elif "spec_tokens" in wild:
        kv = f"{v('kv_cache_dtype')}*"
    else:
        kv = v("kv_cache_dtype") + (f"-k{k}" if k else "")
    backend = str(axes.get("backend", ""))
    label = backend.rsplit(":", 1)[-1] if ":" in backend else backend
    return f"{head}tp{v('tp')}-{v('cudagraph_mode')}-{kv}-{v('batch')}-{_seg(label)}-s{v('seed')}"


def cover(
    failing: Sequence[CaseResult], passing: Sequence[CaseResult], limit: int | None = None
) -> list[tuple[str, list[CaseResult]]]:
    """Greedy: the first failure not yet covered, all its axes spelled out, then each axis in
    WIDEN_ORDER widened to * while the glob matches no pass; the glob covers what it matches.
    At most `limit` globs (each costs a pass over the run's passes per axis)."""
    # Only an axis the run has several values of can be widened: a run filtered to FULL cannot
    # say whether PIECEWISE fails too.
    seen = (*failing, *passing)
    order = [a for a in WIDEN_ORDER if len({str(r.axes.get(a)) for r in seen}) > 1]
    left = list(failing)
    out: list[tuple[str, list[CaseResult]]] = []
    while left and (limit is None or len(out) < limit):
        axes = left[0].axes
        wild: frozenset[str] = frozenset()
        for a in order:
            pattern = glob_for(axes, wild | {a})
            if not any(fnmatch.fnmatchcase(p.case_id, pattern) for p in passing):
                wild = wild | {a}
        pattern = glob_for(axes, wild)
        covered = [r for r in left if fnmatch.fnmatchcase(r.case_id, pattern)]
        if not covered:  # an id from before an axis existed: the id itself
            pattern, covered = left[0].case_id, [left[0]]
        out.append((pattern, covered))
        left = [r for r in left if r not in covered]
    return out


def suggest(
    results: Sequence[CaseResult],
    new_failures: Sequence[str],
    *,
    today: dt.date | None = None,
    days: int = DEFAULT_DAYS,
) -> list[Suggestion]:
    """Entries for the `new_failures` (case ids; the gate's gating failures) of a run."""
    wanted = set(new_failures)
    until = (today or dt.date.today()) + dt.timedelta(days=days)
    groups: dict[tuple[str, str], tuple[list[CaseResult], list[CaseResult]]] = {}
    for r in results:
        key = (str(r.axes.get("backend", "")), str(r.axes.get("attention") or "gqa"))
        if r.case_id in wanted and r.status in _FAILING:
            groups.setdefault(key, ([], []))[0].append(r)
        elif r.status in _OK:
            groups.setdefault(key, ([], []))[1].append(r)
    out: list[Suggestion] = []
    for key in sorted(groups):
        failing, passing = groups[key]
        if not failing:
            continue
        # Every pass of the run counts, not only this backend's: a glob must not cover another's.
        others = [p for k, (_, ps) in groups.items() for p in ps if k != key]
        left = MAX_ENTRIES - len(out)
        if left <= 0:
            break
        for pattern, covered in cover(sorted(failing, key=lambda r: r.case_id), passing + others, left):
            out.append(
                Suggestion(
                    pattern, tuple(r.case_id for r in covered), covered[0].reason or covered[0].status.value, until
                )
            )
    return out


def render(suggestions: Sequence[Suggestion]) -> str:
    return "".join(s.to_yaml() for s in suggestions)
