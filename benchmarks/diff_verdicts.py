"""Compare the verdicts of two runs, case by case (#13: a speed-up must not change any verdict).

    python benchmarks/diff_verdicts.py BEFORE.db AFTER.db [--runs A B] [--checks] [--json]

Each side is a results database (`orch run --db`); its latest run unless --runs gives the run ids.
Compared per case id: the status, and with --checks the name and pass/fail of every check (not
the error figures: timings and float noise are not verdicts). Prints one line per difference and
a summary. Exit 0: the same verdicts for the same cases; 1: they differ (or a case is on one
side only); 2: bad input (a file that is not a results database, an unknown run id).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from orchestrator.errors import OrchError  # noqa: E402
from orchestrator.store import ResultStore  # noqa: E402


def verdicts(path: str, run_id: int | None, checks: bool) -> dict[str, tuple]:
    if not os.path.isfile(path):
        raise OrchError(f"{path}: no such results database")
    with ResultStore(path, readonly=True) as store:
        rid = run_id if run_id is not None else store.latest_run_id()
        if rid is None:
            raise OrchError(f"{path}: no runs")
        store.run(rid)  # InputError for an unknown id
        out = {}
        for r in store.results(rid):
            key: tuple = (r.status.value,)
            if checks:
                key += (tuple((c.name, c.passed) for c in r.checks),)
            out[r.case_id] = key
        return out


def diff(a: dict[str, tuple], b: dict[str, tuple]) -> list[dict]:
    rows = []
    for cid in sorted(set(a) | set(b)):
        if a.get(cid) != b.get(cid):
            rows.append({"case": cid, "before": a.get(cid), "after": b.get(cid)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--runs", nargs=2, type=int, metavar=("A", "B"), default=None)
    p.add_argument("--checks", action="store_true", help="also compare each check's pass/fail")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    runs = args.runs or (None, None)
    try:
        a = verdicts(args.before, runs[0], args.checks)
        b = verdicts(args.after, runs[1], args.checks)
    except OrchError as e:
        print(f"diff_verdicts: {e}", file=sys.stderr)
        return 2
    rows = diff(a, b)
    if args.json:
        print(json.dumps({"cases_before": len(a), "cases_after": len(b), "differences": rows}, indent=1))
    else:
        for r in rows:
            print(f"{r['case']}: {r['before'] or 'absent'} -> {r['after'] or 'absent'}")
        same = len(set(a) & set(b)) - sum(1 for r in rows if r["before"] and r["after"])
        print(f"{len(a)} cases before, {len(b)} after, {same} with the same verdict, {len(rows)} different")
    return 1 if rows else 0


if __name__ == "__main__":
    sys.exit(main())
