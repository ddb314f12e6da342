"""What the checks measure for correct providers and for the near-threshold mutants.

    PYTHONPATH=/tmp/site:$PWD OUT=/tmp/out python benchmarks/gpu_tolerances.py [--matrix M] [--seeds 0,1]
        [--backends torch,aiter-triton] [--batches a,b] [--steps N]

Runs the tp 1 NONE cases of the matrix (default matrices/full.yaml; GPU shape on a GPU, CPU shape
otherwise) for the correct providers and for tests/mutants/near_threshold.py, both kv dtypes, with
the matrix's tolerances, and records per (provider, kv dtype, batch) the status and each check's
max abs / rel error (attn_reference: the worst (row, head) RMS error of the attention output and
its ratio to the head's RMS). Writes $OUT/tolerances.json and $OUT/tolerances.md (a table for
docs/CHECKER.md) and prints a summary: per (provider kind, kv dtype) the worst reference error of
the correct providers, the smallest of the mutants, and whether every mutant cell is red.
NONE is enough: the reference check does not depend on the mode (the eager side is shared).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

CORRECT = ("torch", "aiter-triton")
MUTANTS = tuple(
    f"tests.mutants.near_threshold:{n}" for n in ("VWithKScale", "VScale125", "HeadZeroed", "NoSelf", "HeadScaled")
)
# Where each mutant is reachable (kv dtypes): the others must pass.
REACHABLE = {
    "VWithKScale": ("fp8",),
    "VScale125": ("fp8",),
    "HeadZeroed": ("auto", "fp8"),
    "NoSelf": ("auto", "fp8"),
    "HeadScaled": ("auto", "fp8"),
}
# The checks whose numbers the summary reports: the residual stream and the per-head attention output.
REPORTED = ("reference", "attn_reference")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--matrix", default="matrices/full.yaml")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--backends", default=",".join(CORRECT))
    ap.add_argument("--batches", default="")
    ap.add_argument("--steps", type=int, default=0, help="override the matrix's steps (0: keep)")
    ap.add_argument("--no-mutants", action="store_true")
    args = ap.parse_args(argv)
    out_dir = os.environ.get("OUT", "/tmp/gpu_tolerances")
    os.makedirs(out_dir, exist_ok=True)

    from backend.harness.checker import SessionCache, run_case
    from orchestrator.matrix import load_matrix

    matrix = load_matrix(args.matrix)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    wanted = set(filter(None, args.batches.split(",")))
    base = [
        c
        for c in matrix.cases
        if c.tp == 1
        and c.mode == "NONE"
        and c.backend == "torch"
        and c.seed == 0
        and (not wanted or c.batch.name in wanted)
    ]
    backends = [b for b in args.backends.split(",") if b] + ([] if args.no_mutants else list(MUTANTS))
    sessions = SessionCache(capacity=4)
    rows, t0 = [], time.perf_counter()
    for backend in backends:
        for case in base:
            for seed in seeds:
                c = dataclasses.replace(
                    case, backend=backend, seed=seed, **({"steps": args.steps} if args.steps else {})
                )
                r = run_case(c, sessions=sessions)
                checks = {
                    ch.name: {"passed": ch.passed, "max_abs": ch.max_abs_err, "max_rel": ch.max_rel_err}
                    for ch in r.checks
                }
                rows.append(
                    {
                        "backend": backend.rsplit(":", 1)[-1],
                        "kv": c.kv_cache_dtype,
                        "batch": c.batch.name,
                        "seed": seed,
                        "status": r.status.value,
                        "reason": r.reason[:200],
                        "tolerance": dataclasses.asdict(c.tolerance),
                        "checks": checks,
                        "total_s": r.timings.get("total_s"),
                    }
                )
                print(
                    f"{rows[-1]['backend']:14s} {c.kv_cache_dtype:4s} {c.batch.name:20s} s{seed} "
                    f"{r.status.value:5s} ref {_fmt(checks.get('reference', {}).get('max_abs'))} "
                    f"attn {_fmt(checks.get('attn_reference', {}).get('max_abs'))}",
                    flush=True,
                )
    device = next((r for r in [matrix.device_class]), "")
    summary = _summary(rows)
    with open(os.path.join(out_dir, "tolerances.json"), "w") as f:
        json.dump(
            {
                "matrix": args.matrix,
                "device_class": device,
                "seeds": seeds,
                "rows": rows,
                "summary": summary,
                "wall_s": time.perf_counter() - t0,
            },
            f,
            indent=1,
        )
    with open(os.path.join(out_dir, "tolerances.md"), "w") as f:
        f.write(_markdown(rows, summary, device))
    print("\n".join(summary["lines"]))
    return 0 if summary["ok"] else 1


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def _err(row: dict, check: str) -> float:
    return row["checks"].get(check, {}).get("max_abs") or 0.0


def _summary(rows: list[dict]) -> dict:
    lines, ok = [], True
    for kv in ("auto", "fp8"):
        correct = [
            r
            for r in rows
            if (r["kv"] == kv and r["backend"] in CORRECT) or (r["kv"] == kv and r["backend"] not in REACHABLE)
        ]
        ran = [r for r in correct if r["status"] != "skip"]
        green = all(r["status"] == "pass" for r in ran)
        ok &= green
        worst = ", ".join(f"{name} {_fmt(max((_err(r, name) for r in ran), default=None))}" for name in REPORTED)
        lines.append(f"{kv}: correct providers worst max_abs: {worst} ({'all green' if green else 'NOT all green'})")
        for name, kvs in REACHABLE.items():
            mine = [r for r in rows if r["backend"] == name and r["kv"] == kv]
            if not mine:
                continue
            red = sum(r["status"] == "fail" for r in mine)
            want_red = kv in kvs
            cell_ok = red == len(mine) if want_red else red == 0
            ok &= cell_ok
            smallest = ", ".join(f"{check} {_fmt(min(_err(r, check) for r in mine))}" for check in REPORTED)
            lines.append(
                f"  {name:12s} {red}/{len(mine)} red (expected {'all' if want_red else 'none'}), "
                f"max_abs min: {smallest} {'ok' if cell_ok else 'UNEXPECTED'}"
            )
    return {"ok": ok, "lines": lines}


def _markdown(rows: list[dict], summary: dict, device: str) -> str:
    out = [
        f"# Check errors per provider ({device} shape)",
        "",
        "| provider | kv | batch | seed | status | "
        "reference max_abs | reference max_rel | attn_reference max_abs | attn_reference max_rel | replay max_abs | "
        "tolerance |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["checks"]
        out.append(
            f"| {r['backend']} | {r['kv']} | {r['batch']} | {r['seed']} | {r['status']} | "
            f"{_fmt(c.get('reference', {}).get('max_abs'))} | {_fmt(c.get('reference', {}).get('max_rel'))} | "
            f"{_fmt(c.get('attn_reference', {}).get('max_abs'))} | "
            f"{_fmt(c.get('attn_reference', {}).get('max_rel'))} | "
            f"{_fmt(c.get('replay', {}).get('max_abs'))} | {r['tolerance']['atol']}/{r['tolerance']['rtol']} |"
        )
    return "\n".join(out + ["", *summary["lines"], ""])


if __name__ == "__main__":
    sys.exit(main())
