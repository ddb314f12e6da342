"""Where a run's case time went, by provider and batch, from a results store.

    python benchmarks/case_times.py gpu.db [--run N] [--by provider,batch]

Sums each case's own timings (CaseResult.timings: total_s and the checker's phases) over the
groups named by --by (any axis, or provider), largest first, with the share of the run's case
time. "other" is total_s minus the phases (the case's other_s: what no phase names, see
backend/harness/timing.py).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from backend.harness.checker import PHASES
from backend.result import Status
from orchestrator.store import ResultStore

COLUMNS = ("capture_s",) + PHASES


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("--run", type=int, default=None)
    ap.add_argument("--by", default="provider,batch")
    args = ap.parse_args(argv)
    store = ResultStore(args.db, readonly=True)
    run_id = args.run or store.latest_run_id()
    results = [r for r in store.results(run_id) if r.status != Status.SKIP]
    keys = [k.strip() for k in args.by.split(",") if k.strip()]
    groups: dict[tuple[str, ...], list] = defaultdict(list)
    for r in results:
        groups[
            tuple(
                (r.provider or r.axes.get("backend", "?")) if k == "provider" else str(r.axes.get(k, "?")) for k in keys
            )
        ].append(r)
    total = sum(r.timings.get("total_s", 0.0) for r in results) or 1.0
    head = keys + ["cases", "total_s", "share", "per case"] + [c.removesuffix("_s") for c in COLUMNS] + ["other"]
    print(f"run {run_id}: {len(results)} cases, {total:.1f} s of case time\n")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    rows = sorted(groups.items(), key=lambda kv: -sum(r.timings.get("total_s", 0.0) for r in kv[1]))
    for key, rs in rows:
        t = sum(r.timings.get("total_s", 0.0) for r in rs)
        parts = [sum(r.timings.get(c, 0.0) for r in rs) for c in COLUMNS]
        print(
            "| "
            + " | ".join(key)
            + f" | {len(rs)} | {t:.2f} | {100 * t / total:.0f}% | {1000 * t / len(rs):.0f} ms | "
            + " | ".join(f"{p:.2f}" for p in parts)
            + f" | {t - sum(parts):.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
