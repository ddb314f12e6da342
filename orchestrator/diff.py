"""Which verdicts changed between two runs (`orch diff`, benchmarks/diff_verdicts.py): pure.

A case's verdict is its status, and with `checks` also the name and pass/fail of every check (not
the error figures: timings and float noise are not verdicts). Changes are grouped by transition
("pass -> fail", "absent -> pass", ...); within a group the changed cases are described by the
case-id globs that cover them and none of the run's unchanged cases (suggest.cover), and counted
per axis value. A regression is a case that passed (or was flaky) before and fails now, as the
gate counts one against a baseline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from backend.result import CaseResult, Status
from orchestrator import suggest

ABSENT = "absent"
_FAILING = frozenset({Status.FAIL.value, Status.ERROR.value, Status.TIMEOUT.value})
_PASSED = frozenset({Status.PASS.value, Status.FLAKY.value})
AXES = ("attention", "tp", "cudagraph_mode", "kv_cache_dtype", "spec_tokens", "batch", "backend", "seed", "cg_padding")


def verdict(r: CaseResult, checks: bool) -> tuple:
    key: tuple = (r.status.value,)
    if checks:
        key += (tuple((c.name, c.passed) for c in r.checks),)
    return key


@dataclass(frozen=True)
class Change:
    case_id: str
    before: tuple | None  # verdict(...) in run A, None: absent
    after: tuple | None

    @property
    def transition(self) -> str:
        a = self.before[0] if self.before else ABSENT
        b = self.after[0] if self.after else ABSENT
        return f"{a} -> {b}" + (" (checks)" if a == b else "")

    @property
    def regressed(self) -> bool:
        if not (self.before and self.after):
            return False
        return self.before[0] in _PASSED and self.after[0] in _FAILING


@dataclass(frozen=True)
class RunDiff:
    changes: tuple[Change, ...]
    cases_before: int
    cases_after: int
    same: int  # cases of both runs with the same verdict

    @property
    def regressions(self) -> tuple[str, ...]:
        return tuple(c.case_id for c in self.changes if c.regressed)

    def transitions(self) -> dict[str, list[Change]]:
        """Worst first: regressions, then new failures, then the rest by name."""
        groups: dict[str, list[Change]] = {}
        for c in self.changes:
            groups.setdefault(c.transition, []).append(c)

        def rank(t: str) -> tuple:
            a, _, b = t.partition(" -> ")
            b = b.split(" ")[0]
            return (0 if a in _PASSED and b in _FAILING else 1 if b in _FAILING else 2, t)

        return {t: groups[t] for t in sorted(groups, key=rank)}


def compare(before: Sequence[CaseResult], after: Sequence[CaseResult], *, checks: bool = False) -> RunDiff:
    a = {r.case_id: verdict(r, checks) for r in before}
    b = {r.case_id: verdict(r, checks) for r in after}
    changes = tuple(Change(cid, a.get(cid), b.get(cid)) for cid in sorted(set(a) | set(b)) if a.get(cid) != b.get(cid))
    same = sum(1 for cid in set(a) & set(b) if a[cid] == b[cid])
    return RunDiff(changes, len(a), len(b), same)


def describe(group: Sequence[Change], after: Sequence[CaseResult], before: Sequence[CaseResult]) -> list[str]:
    """Globs covering the group's cases and no unchanged case of the run (the later run's results,
    or the earlier's for a case that is gone)."""
    ids = {c.case_id for c in group}
    pool = {r.case_id: r for r in before} | {r.case_id: r for r in after}
    changed = [pool[i] for i in sorted(ids)]
    unchanged = [r for cid, r in pool.items() if cid not in ids]
    return [pattern for pattern, _ in suggest.cover(changed, unchanged)]


def axis_counts(group: Sequence[Change], results: Sequence[CaseResult]) -> dict[str, Counter]:
    """axis -> Counter of its values among the group's cases, for the axes that vary in the run."""
    pool = {r.case_id: r for r in results}
    varying = {a for a in AXES if len({str(r.axes.get(a)) for r in results}) > 1}
    out: dict[str, Counter] = {}
    for c in group:
        r = pool.get(c.case_id)
        if r is None:
            continue
        for a in AXES:
            if a in varying:
                out.setdefault(a, Counter())[str(r.axes.get(a))] += 1
    return out


def versions_side_by_side(a: dict, b: dict) -> list[tuple[str, str, str, bool]]:
    """(name, A, B, differs) for every version either run records."""
    keys = sorted(set(a) | set(b))
    return [(k, str(a.get(k, "")), str(b.get(k, "")), str(a.get(k, "")) != str(b.get(k, ""))) for k in keys]
