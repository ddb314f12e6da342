"""Dispatch overhead of the Ray executor: a no-op runner through real Ray actors.

    python benchmarks/dispatch_bench.py --cases 5000 --workers 2 [--repeat 3] [--shared-cluster]

Every case returns PASS at once in the actor, so what is measured is the driver loop, the
dispatcher, batching, serialisation and Ray's actor calls. Reported per mode: cases/s over the
whole run (Executor.run: placing the gangs, starting their actors, every batch, shutdown) and
after the first result, and the time to the first result. Modes: no store; every result committed
to a real SQLite store (WAL, synchronous=FULL) before it counts as reported, one transaction per
result (`sqlite_per_result`, the old driver) or per executor loop turn (`sqlite_group_commit`,
what `orch run` does).

By default each measurement starts its own local Ray cluster first (not timed; reported as
cluster_s), as `orch run` does, so its gangs start on Ray's prestarted workers. --shared-cluster
runs every mode on one cluster after a warm-up instead: later gangs then wait for new worker
processes (the old figures). --repeat N keeps the best whole-run figure of N (the shared machine's
load varies from second to second) and lists all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from backend.case import BatchSpec, Case
from backend.result import CaseResult, Status
from orchestrator.store import NewRun

RUNNER = "benchmarks.dispatch_bench:noop_runner"


def noop_runner(case: Case, **_: object) -> CaseResult:
    return CaseResult(case.case_id, Status.PASS, timings={"total_s": 0.0})


def make_cases(n: int) -> list[Case]:
    return [Case("torch", 1, "FULL", "auto", BatchSpec(f"b{i % 7}", (1,), (8,)), seed=i) for i in range(n)]


def measure(cluster, cases, history, *, store_path: str | None, group: bool = True) -> dict:
    from orchestrator.executor.executor import ExecConfig, Executor
    from orchestrator.store import ResultStore

    store = run_id = None
    if store_path:
        store = ResultStore(store_path)
        run_id = store.create_run(NewRun(matrix="bench", cases=cases))
    first: list[float] = []
    txns = [0]

    def on_result(r: CaseResult, final: bool) -> None:
        if not first:
            first.append(time.perf_counter())
        if store is not None:
            store.record(run_id, r, final)
            txns[0] += 1

    def on_results(items: list[tuple[CaseResult, bool]]) -> None:
        if not first:
            first.append(time.perf_counter())
        if store is not None:
            store.record_many(run_id, items)
            txns[0] += 1

    t0 = time.perf_counter()
    hooks = {"on_results": on_results} if group else {"on_result": on_result}
    final = Executor(cluster, ExecConfig(runner=RUNNER), history=history, **hooks).run(cases)
    t1 = time.perf_counter()
    assert len(final) == len(cases) and all(r.status == Status.PASS for r in final.values())
    out = {
        "cases": len(cases),
        "total_s": round(t1 - t0, 3),
        "cases_per_s_total": round(len(cases) / (t1 - t0), 1),
        "cases_per_s_after_first": round((len(cases) - 1) / max(1e-9, t1 - first[0]), 1),
        "first_result_s": round(first[0] - t0, 3),
    }
    if store is not None:
        # Every result durable: the store holds exactly one final row per case.
        assert len(store.missing_case_ids(run_id)) == 0 and store.run(run_id).num_results == len(cases)
        store.close()
        out["transactions"] = txns[0]
    return out


MODES = {
    "no_store": {"store": False},
    "sqlite_per_result": {"store": True, "group": False},
    "sqlite_group_commit": {"store": True, "group": True},
}


def _one(cluster, mode: str, cases, history, d: str, i: int) -> dict:
    opts = MODES[mode]
    path = os.path.join(d, f"{mode}-{i}.db") if opts["store"] else None
    return measure(cluster, cases, history, store_path=path, group=opts.get("group", True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=5000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--shared-cluster", action="store_true", help="one cluster for every mode (after a warm-up)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or args.cases < 1 or args.repeat < 1 or args.workers < 1:
        print(
            f"dispatch_bench: bad arguments ({', '.join(bad) or 'cases, repeat and workers must be >= 1'})",
            file=sys.stderr,
        )
        return 2
    from orchestrator.executor.cluster import connect, disconnect

    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # actors import benchmarks.*
    cases = make_cases(args.cases)
    history = {c.case_id: 0.001 for c in cases}  # what a previous run of no-op cases would have stored
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with tempfile.TemporaryDirectory() as d:
        if args.shared_cluster:
            cluster = connect("local", devices="cpu", workers=args.workers)
            try:
                measure(cluster, cases[:200], history, store_path=None)  # warm-up: Ray workers, imports
                for i in range(args.repeat):
                    for mode in modes:
                        runs[mode].append(_one(cluster, mode, cases, history, d, i))
            finally:
                disconnect(cluster)
        else:
            for i in range(args.repeat):
                for mode in modes:
                    t = time.perf_counter()
                    cluster = connect("local", devices="cpu", workers=args.workers)
                    up = time.perf_counter() - t
                    try:
                        runs[mode].append({**_one(cluster, mode, cases, history, d, i), "cluster_s": round(up, 3)})
                    finally:
                        disconnect(cluster)
    out: dict = {
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "load_avg_1m_at_start": load,
        "cluster": "shared" if args.shared_cluster else "fresh per measurement",
        "repeat": args.repeat,
    }
    for mode in modes:
        best = max(runs[mode], key=lambda r: r["cases_per_s_total"])
        out[mode] = {
            **best,
            "all_cases_per_s_total": [r["cases_per_s_total"] for r in runs[mode]],
            "all_cases_per_s_after_first": [r["cases_per_s_after_first"] for r in runs[mode]],
        }
    print(json.dumps(out, indent=2))
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "dispatch_bench.json"), "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
