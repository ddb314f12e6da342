"""Spec decode (k > 0) cases of matrices/full.yaml on real graphs (issue #12), and the seed mutants
under the corrected capture (issue #18).

    OUT=/tmp/out PYTHONPATH=/tmp/site:$PWD python benchmarks/gpu_spec_decode.py [--quick]

Runs tp 1 cases of full.yaml's device model for the torch and aiter-triton providers with
spec_tokens k in {1, 3} over every cudagraph mode, kv auto/fp8, batches decode_7 (uniform verify,
padded), decode_64 and mixed_small (verify + prefill rows); plus the #18/#12 mutants on the same
shape. Capture sizes when the matrix says `default`: vLLM's for that k (multiples of 1 + k). One
SessionCache for the run, as a worker has. Writes $OUT/spec_decode.json and $OUT/spec_decode.md,
prints one line per case and a verdict count. On a CPU-only machine it runs the CPU model with
emulated graphs (the same code path, to test this script); --quick keeps one batch and one kv.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: repo root importable

from backend.checker import SessionCache, run_case  # noqa: E402
from backend.modes import vllm_capture_sizes  # noqa: E402
from orchestrator.matrix import load_matrix  # noqa: E402

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
PROVIDERS = ("torch", "aiter-triton")
BATCHES = ("decode_7", "decode_64", "mixed_small")
# (backend, expected where red) for the mutants: reported, the verdicts are for the lead to compare
# with docs/CHECKER.md's table.
MUTANTS = ("tests.mutants.seed_aiter_fa:Backend", "tests.mutants.seed_aiter_fa:FixedBackend",
           "tests.mutants.one_query_token:Backend", "tests.mutants.partition_frozen:Backend",
           "tests.mutants.decode_branch_spec:Backend")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--matrix", default="matrices/full.yaml")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-mutants", action="store_true")
    args = ap.parse_args(argv)
    out_dir = Path(os.environ.get("OUT", "spec-decode-out"))
    out_dir.mkdir(parents=True, exist_ok=True)

    m = load_matrix(args.matrix, devices="auto")
    by_batch = {(c.batch.name, c.kv_cache_dtype): c for c in m.cases if c.tp == 1}
    batches = BATCHES[:1] if args.quick else BATCHES
    kvs = ("auto",) if args.quick else ("auto", "fp8")
    sessions = SessionCache(capacity=16)
    rows = []

    def run(backend: str, mode: str, kv: str, batch: str, k: int) -> None:
        base = by_batch[(batch, kv)]  # carries the matrix's tolerance for this kv dtype
        shape = base.model
        default = tuple(base.capture_sizes) == vllm_capture_sizes(shape.max_num_seqs, shape.batched_tokens_limit)
        sizes = vllm_capture_sizes(shape.max_num_seqs, shape.batched_tokens_limit, k) if default else base.capture_sizes
        case = dataclasses.replace(base, backend=backend, mode=mode, spec_tokens=k, capture_sizes=sizes)
        t0 = time.perf_counter()
        r = run_case(case, sessions=sessions)
        row = {"case": case.case_id, "backend": backend, "mode": mode, "kv": kv, "batch": batch, "k": k,
               "status": r.status.value, "resolved": r.resolved_mode, "graph": r.graph_kind,
               "sizes_used": list(r.capture_sizes_used), "reason": r.reason, "device": r.device,
               "wall_s": round(time.perf_counter() - t0, 3),
               "capture_s": round(r.timings.get("capture_s", 0.0), 3)}
        rows.append(row)
        print(f"{row['status']:5} {row['case']} -> {row['resolved']} {row['sizes_used']} {row['wall_s']}s "
              f"{row['reason'][:100]}", flush=True)

    for backend in PROVIDERS:
        for k in (1, 3):
            for kv in kvs:
                for batch in batches:
                    for mode in MODES:
                        run(backend, mode, kv, batch, k)
    if not args.no_mutants:
        for backend in MUTANTS:
            for k in (0, 2):
                for batch in ("decode_7", "mixed_small"):
                    for mode in MODES:
                        run(backend, mode, "auto", batch, k)

    (out_dir / "spec_decode.json").write_text(json.dumps(rows, indent=1))
    counts = collections.Counter((r["backend"], r["status"]) for r in rows)
    lines = ["| backend | case | resolved | status | sizes used | reason |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['backend']} | {r['case']} | {r['resolved']} | {r['status']} | {r['sizes_used']} | "
              f"{r['reason'][:120].replace('|', '/')} |" for r in rows]
    (out_dir / "spec_decode.md").write_text("\n".join(lines) + "\n")
    print("summary:", {f"{b.replace('tests.mutants.', '')}/{s}": n for (b, s), n in sorted(counts.items())})
    bad = [r for r in rows if r["backend"] in PROVIDERS and r["status"] not in ("pass", "skip")]
    skipped = [r for r in rows if r["backend"] in PROVIDERS and r["status"] == "skip"]
    print(f"correct providers: {len(bad)} failing, {len(skipped)} skipped "
          f"(e.g. {skipped[0]['reason'][:80] if skipped else '-'}) of {sum(r['backend'] in PROVIDERS for r in rows)}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
