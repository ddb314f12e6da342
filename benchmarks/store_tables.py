"""Tables for docs/BENCHMARKS.md from a results store (e.g. the one the GPU run brought back).

    python benchmarks/store_tables.py gpu.db [--run N]

Prints markdown: verdicts per provider; per batch, the median eager step, replay step and
replay/eager speedup per provider (graph modes only, passing cases); capture time per provider.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from backend.result import Status
from orchestrator.store import ResultStore


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("--run", type=int, default=None)
    args = ap.parse_args(argv)
    store = ResultStore(args.db, readonly=True)
    run_id = args.run or store.latest_run_id()
    results = [r for r in store.results(run_id) if r.status != Status.SKIP]
    info = store.run(run_id)
    devices = sorted({r.device for r in results})
    print(f"run {run_id} of {info.matrix}: {len(results)} cases ran on {', '.join(devices)}\n")

    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in results:
        counts[r.provider or r.axes.get("backend", "?")][r.status.value] += 1
    statuses = sorted({s for c in counts.values() for s in c})
    print("| provider | " + " | ".join(statuses) + " |\n|---|" + "---|" * len(statuses))
    for p, c in sorted(counts.items()):
        print(f"| {p} | " + " | ".join(str(c.get(s, 0)) for s in statuses) + " |")

    cells: dict[tuple[str, str], list] = defaultdict(list)
    capture: dict[str, list[float]] = defaultdict(list)
    for r in results:
        t = r.timings
        if r.status != Status.PASS or r.graph_kind in ("none", "") or "replay_step_s" not in t:
            continue
        cells[(r.axes["batch"], r.provider)].append((t["eager_step_s"], t["replay_step_s"]))
        if t.get("capture_s"):
            capture[r.provider].append(t["capture_s"])
    providers = sorted({p for _, p in cells})
    print("\nMedian eager step / replay step (ms) and speedup, passing graph-mode cases:\n")
    print("| batch | " + " | ".join(providers) + " |\n|---|" + "---|" * len(providers))
    for batch in sorted({b for b, _ in cells}):
        row = []
        for p in providers:
            v = cells.get((batch, p))
            if not v:
                row.append("-")
                continue
            e, g = statistics.median(x for x, _ in v), statistics.median(y for _, y in v)
            row.append(f"{e * 1e3:.2f} / {g * 1e3:.2f} ({e / g:.1f}x)")
        print(f"| {batch} | " + " | ".join(row) + " |")
    print("\n| provider | median capture s (cases that captured) |\n|---|---|")
    for p in providers:
        if capture[p]:
            print(f"| {p} | {statistics.median(capture[p]):.3f} ({len(capture[p])}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
