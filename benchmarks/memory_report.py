"""Device memory and verdicts of GPU runs: what each family's cases needed, whether the
harness ran out of memory anywhere, and whether other runs gave the same verdicts.

    python benchmarks/memory_report.py REF.db [OTHER.db ...] [--json]

REF: its latest run gives the memory table (per family and provider: cases, median and max of
CaseResult.memory needs / peak_reserved / session, GiB) and the reference verdicts. Each OTHER: the
union of all its runs' final results (so one store can hold a family-by-family run), compared case
by case with REF's status and failed-check names. Every store is searched for an out-of-memory
anywhere: a result of error_kind oom, or OutOfMemoryError / "out of memory" in a result's reason or
log, or in any attempt's reason (the attempt log). Exit 0 when no store has one and every OTHER
agrees with REF on the cases they share; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from orchestrator.store import ResultStore

GIB = 1024**3
OOM_TEXT = ("OutOfMemoryError", "out of memory")


def _verdict(r) -> tuple:
    return r.status.value, tuple(sorted(c.name for c in r.failed_checks))


def _oom(r) -> bool:
    return r.error_kind == "oom" or any(t in f"{r.reason}\n{r.log_tail}" for t in OOM_TEXT)


def load(path: str, latest_only: bool) -> tuple[dict, int]:
    """case_id -> result, and the out-of-memory count over every attempt of every run."""
    with ResultStore(path, readonly=True) as store:
        runs = [store.latest_run_id()] if latest_only else [r.id for r in store.runs()]
        results = {}
        oom = 0
        for rid in runs:
            for r in store.results(rid):
                results[r.case_id] = r
                oom += _oom(r)
                oom += sum(
                    any(t in a["reason"] for t in OOM_TEXT)
                    for a in store.attempt_log(rid, r.case_id)
                    if a["attempt"] < r.attempts
                )
        return results, oom


def memory_table(results: dict) -> dict:
    by = defaultdict(list)
    for r in results.values():
        if r.memory.get("peak_allocated") is not None:
            by[f"{r.axes.get('attention') or 'gqa'}/{r.provider}"].append(r.memory)
    out = {}
    for key, mems in sorted(by.items()):
        row = {"cases": len(mems)}
        for field in ("needs", "peak_reserved", "session"):
            vals = [m[field] / GIB for m in mems if field in m]
            if vals:
                row[f"{field}_median_gib"] = round(statistics.median(vals), 2)
                row[f"{field}_max_gib"] = round(max(vals), 2)
        out[key] = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref")
    ap.add_argument("others", nargs="*")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    ref, ref_oom = load(a.ref, latest_only=True)
    report = {"ref": a.ref, "cases": len(ref), "oom": {a.ref: ref_oom}, "memory": memory_table(ref), "diffs": {}}
    for path in a.others:
        other, oom = load(path, latest_only=False)
        report["oom"][path] = oom
        shared = sorted(set(ref) & set(other))
        report["diffs"][path] = {
            "shared": len(shared),
            "differ": [
                {"case": c, "ref": _verdict(ref[c]), "other": _verdict(other[c])}
                for c in shared
                if _verdict(ref[c]) != _verdict(other[c])
            ],
        }
    if a.json:
        print(json.dumps(report, indent=1))
    else:
        print(
            f"{a.ref}: {len(ref)} cases; out-of-memory anywhere: "
            + ", ".join(f"{os.path.basename(p)} {n}" for p, n in report["oom"].items())
        )
        print(f"{'family/provider':<28} cases  needs med/max GiB  peak reserved med/max  session med/max")
        for key, row in report["memory"].items():
            f = lambda k: f"{row.get(k + '_median_gib', '-')}/{row.get(k + '_max_gib', '-')}"
            print(f"{key:<28} {row['cases']:>5}  {f('needs'):>17}  {f('peak_reserved'):>21}  {f('session'):>15}")
        for path, d in report["diffs"].items():
            print(f"verdicts {os.path.basename(path)} vs ref: {d['shared']} shared cases, {len(d['differ'])} differ")
            for x in d["differ"][:20]:
                print(f"  {x['case']}: {x['ref']} -> {x['other']}")
    bad = any(report["oom"].values()) or any(d["differ"] for d in report["diffs"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
