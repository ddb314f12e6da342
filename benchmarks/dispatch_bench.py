"""Dispatch overhead of the Ray executor: a no-op runner through real Ray actors.

    python benchmarks/dispatch_bench.py --cases 5000 --workers 2

Every case returns PASS at once in the actor, so what is measured is the driver loop, the
dispatcher, batching, serialisation and Ray's actor calls. Reported: cases/s from the first
submission to the last result (actor start-up excluded: a warm-up run starts Ray first), then the
same with every result committed to a real SQLite store (WAL, synchronous=FULL) before it counts as
reported: `sqlite_per_result` (one transaction per result: the old driver) and
`sqlite_group_commit` (one transaction per executor loop turn: what `orch run` does now).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from backend.case import BatchSpec, Case  # noqa: E402
from backend.result import CaseResult, Status  # noqa: E402

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
        run_id = store.create_run(matrix="bench", cases=cases)
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
    out = {"cases": len(cases), "total_s": round(t1 - t0, 3), "cases_per_s_total": round(len(cases) / (t1 - t0), 1),
           "cases_per_s_after_first": round((len(cases) - 1) / max(1e-9, t1 - first[0]), 1)}  # fmt: skip
    if store is not None:
        # Every result durable: the store holds exactly one final row per case.
        assert len(store.missing_case_ids(run_id)) == 0 and store.run(run_id).num_results == len(cases)
        store.close()
        out["transactions"] = txns[0]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=5000)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    from orchestrator.executor.cluster import connect, disconnect

    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # actors import benchmarks.*
    cluster = connect("local", devices="cpu", workers=args.workers)
    cases = make_cases(args.cases)
    history = {c.case_id: 0.001 for c in cases}  # what a previous run of no-op cases would have stored
    try:
        measure(cluster, cases[:200], history, store_path=None)  # warm-up: Ray workers, imports
        out = {"workers": args.workers, "cpus": os.cpu_count(),
               "no_store": measure(cluster, cases, history, store_path=None)}  # fmt: skip
        with tempfile.TemporaryDirectory() as d:
            out["sqlite_per_result"] = measure(cluster, cases, history, store_path=os.path.join(d, "a.db"), group=False)
            out["sqlite_group_commit"] = measure(cluster, cases, history, store_path=os.path.join(d, "b.db"))
    finally:
        disconnect(cluster)
    print(json.dumps(out, indent=2))
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "dispatch_bench.json"), "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
