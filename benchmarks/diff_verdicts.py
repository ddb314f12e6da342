"""Compare the verdicts of two runs, case by case (a speed-up must not change any verdict).

A thin wrapper over `orch diff`'s comparison (orchestrator/diff.py), kept for the benchmark
scripts and docs that call it; `orch diff A B` groups the same changes by transition and axis
and also reads PostgreSQL stores.

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

from orchestrator.diff import compare
from orchestrator.errors import OrchError
from orchestrator.store import ResultStore


def _results(path: str, run_id: int | None):
    if not os.path.isfile(path):
        raise OrchError(f"{path}: no such results database")
    with ResultStore(path, readonly=True) as store:
        rid = run_id if run_id is not None else store.latest_run_id()
        if rid is None:
            raise OrchError(f"{path}: no runs")
        store.run(rid)  # InputError for an unknown id
        return store.results(rid)


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
        result = compare(_results(args.before, runs[0]), _results(args.after, runs[1]), checks=args.checks)
    except OrchError as e:
        print(f"diff_verdicts: {e}", file=sys.stderr)
        return 2
    rows = [{"case": c.case_id, "before": c.before, "after": c.after} for c in result.changes]
    if args.json:
        print(
            json.dumps(
                {"cases_before": result.cases_before, "cases_after": result.cases_after, "differences": rows}, indent=1
            )
        )
    else:
        for r in rows:
            print(f"{r['case']}: {r['before'] or 'absent'} -> {r['after'] or 'absent'}")
        print(
            f"{result.cases_before} cases before, {result.cases_after} after, {result.same} with the same verdict, "
            f"{len(rows)} different"
        )
    return 1 if rows else 0


if __name__ == "__main__":
    sys.exit(main())
