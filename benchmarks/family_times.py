"""Time per case by attention family (and provider) from a results store: how the MLA and
swa_sinks blocks compare with the gqa slice of the same run (the target: the MLA tp 1
slice at most 1.5x the gqa slice's time per case).

    python benchmarks/family_times.py RUN.db [--run ID] [--json]

Per (family, provider): cases, pass/fail/error/skip counts, the mean and median of each case's
own time (CaseResult.timings total_s: session, capture, steps, checks), and the ratio of each
family's mean to gqa's over the providers both ran."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from orchestrator.errors import OrchError
from orchestrator.store import ResultStore


def table(results) -> dict:
    by = defaultdict(list)
    for r in results:
        by[(r.axes.get("attention") or "gqa", r.provider or r.axes.get("backend", "?"))].append(r)
    rows = {}
    for (family, provider), rs in sorted(by.items()):
        ran = [r.timings.get("total_s") for r in rs if r.status.value != "skip" and r.timings.get("total_s")]
        counts = defaultdict(int)
        for r in rs:
            counts[r.status.value] += 1
        rows[f"{family}/{provider}"] = {
            "family": family,
            "provider": provider,
            "cases": len(rs),
            **counts,
            "mean_s": statistics.fmean(ran) if ran else None,
            "median_s": statistics.median(ran) if ran else None,
        }
    mean = lambda fam: statistics.fmean(
        [
            t
            for r in results
            if (r.axes.get("attention") or "gqa") == fam and r.status.value != "skip"
            for t in [r.timings.get("total_s")]
            if t
        ]
        or [0]
    )
    base = mean("gqa")
    ratios = {fam: (mean(fam) / base if base else None) for fam in sorted({v["family"] for v in rows.values()})}
    return {"rows": rows, "mean_s_by_family": {f: mean(f) for f in ratios}, "ratio_to_gqa": ratios}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("--run", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        if not os.path.isfile(a.db):
            raise OrchError(f"{a.db}: no such results database")
        with ResultStore(a.db, readonly=True) as store:
            rid = a.run if a.run is not None else store.latest_run_id()
            results = store.results(rid)
    except OrchError as e:
        print(f"family_times: {e}", file=sys.stderr)
        return 2
    t = table(results)
    if a.json:
        print(json.dumps(t, indent=1))
        return 0
    print(
        f"{'family/provider':34} {'cases':>5} {'pass':>5} {'fail':>4} {'err':>4} {'skip':>5} {'mean s':>8} {'median s':>8}"
    )
    for key, v in t["rows"].items():
        fmt = lambda x: f"{x:8.3f}" if x is not None else "       -"
        print(
            f"{key:34} {v['cases']:5} {v.get('pass', 0):5} {v.get('fail', 0):4} {v.get('error', 0):4} "
            f"{v.get('skip', 0):5} {fmt(v['mean_s'])} {fmt(v['median_s'])}"
        )
    print(
        "mean s per case by family: "
        + ", ".join(f"{f} {m:.3f}" for f, m in t["mean_s_by_family"].items())
        + "; ratio to gqa: "
        + ", ".join(f"{f} {r:.2f}" for f, r in t["ratio_to_gqa"].items() if r is not None)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
