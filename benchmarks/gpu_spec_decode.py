"""Spec decode (k > 0) cases of matrices/full.yaml on real graphs, and the spec mutants.

    OUT=/tmp/out PYTHONPATH=/tmp/site:$PWD python benchmarks/gpu_spec_decode.py [--quick]
        [--compare CPU_OUT/spec_decode.json]

Runs tp 1 cases for the torch and aiter-triton providers with spec_tokens k in {1, 3} over every
cudagraph mode, kv auto/fp8, batches decode_7 (uniform verify rows, padded), decode_64 and
mixed_small (verify + prefill rows); then the spec mutants (tests/mutants) at k in {0, 2}.

The cases come from the matrix loader itself: a matrix written to $OUT that `extends:` full.yaml
and only narrows its axes, so the capture sizes are the ones `orch run` gives a case with that k
(backend/modes.vllm_capture_sizes when full.yaml says `default`, as on the GPU), and the worker
then settles them with the mode (modes.resolve_capture_sizes), as in every run. One SessionCache
for the run, as a worker has.

Writes $OUT/spec_decode.json (one row per case), $OUT/spec_decode.md (per provider a grid of
k x mode rows and kv x batch columns, a verdict per cell, ready for docs/BENCHMARKS.md), prints
one line per case and a verdict count. --compare prints every case whose verdict differs from
another run's JSON (e.g. the CPU run's): case ids do not depend on the device class. On a CPU-only
machine it runs the CPU model with emulated graphs (the same code path, to test this script);
--quick keeps one batch and one kv dtype. Exit 1 when a correct provider does not pass, 2 on bad
input.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere: repo root importable

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
PROVIDERS = ("torch", "aiter-triton")
BATCHES = ("decode_7", "decode_64", "mixed_small")
KS = (1, 3)
MUTANT_KS = (0, 2)
MUTANTS = (
    "tests.mutants.seed_aiter_fa:Backend",
    "tests.mutants.seed_aiter_fa:FixedBackend",
    "tests.mutants.one_query_token:Backend",
    "tests.mutants.partition_frozen:Backend",
    "tests.mutants.partition_frozen:HonestBackend",
    "tests.mutants.decode_branch_spec:Backend",
    "tests.mutants.overstated_support:Backend",
    "tests.mutants.overstated_support:HonestBackend",
)
VERDICT = {
    "pass": "pass",
    "fail": "**FAIL**",
    "error": "**ERROR**",
    "timeout": "**TIMEOUT**",
    "skip": "skip",
    "flaky": "flaky",
}


def slice_matrix(full: Path, out_dir: Path, batches, kvs, ks) -> Path:
    """A matrix over full.yaml narrowed to this benchmark's slice (its exclude list replaced)."""

    def flow(values) -> str:
        return "[" + ", ".join(str(v) for v in values) + "]"

    text = (
        f"extends: {json.dumps(str(full.resolve()))}\nname: spec-decode-bench\n"
        f"axes:\n  attention: [gqa]\n  tp: [1]\n  cudagraph_mode: {flow(MODES)}\n  kv_cache_dtype: {flow(kvs)}\n"
        f"  batch: {flow(batches)}\n  backend: {flow(PROVIDERS)}\n  seed: [0]\n  spec_tokens: {flow(ks)}\n"
        "exclude: []\ninclude: []\nconstraints: []\n"
    )
    path = out_dir / "spec_decode_matrix.yaml"
    path.write_text(text)
    return path


def markdown(rows: list[dict], device: str) -> str:
    """Per backend: rows (k, requested mode), columns (kv, batch); a cell is the verdict, with
    `-> MODE` when the mode was resolved to another one."""
    out = [
        f"Device: {device}. Cell: verdict (-> resolved mode where vLLM's rules change it); "
        "sizes: padded token count per step (0 = eager).",
        "",
    ]
    for backend in dict.fromkeys(r["backend"] for r in rows):
        mine = [r for r in rows if r["backend"] == backend]
        cols = list(dict.fromkeys((r["kv"], r["batch"]) for r in mine))
        keys = list(dict.fromkeys((r["k"], r["mode"]) for r in mine))
        cell = {(r["k"], r["mode"], r["kv"], r["batch"]): r for r in mine}
        out += [
            f"**{backend.replace('tests.mutants.', 'mutant ')}**",
            "",
            "| k | mode | " + " | ".join(f"{kv} {b}" for kv, b in cols) + " |",
            "|---|---|" + "---|" * len(cols),
        ]
        for k, mode in keys:
            cells = []
            for kv, b in cols:
                r = cell.get((k, mode, kv, b))
                if r is None:
                    cells.append("")
                    continue
                text = VERDICT.get(r["status"], r["status"])
                if r["resolved"] and r["resolved"] != mode:
                    text += f" -> {r['resolved']}"
                text += f" `{r['sizes_used']}`" if any(r["sizes_used"]) else ""
                cells.append(text)
            out.append(f"| {k} | {mode} | " + " | ".join(cells) + " |")
        ran = [r for r in mine if r["status"] != "skip"]
        verdicts = collections.Counter(r["status"] for r in mine)
        out += [
            "",
            f"{len(mine)} cases ({', '.join(f'{v} {n}' for v, n in sorted(verdicts.items()))}); "
            f"wall {sum(r['wall_s'] for r in ran):.1f} s, of it capture {sum(r['capture_s'] for r in ran):.1f} s.",
            "",
        ]
    return "\n".join(out)


def compare(rows: list[dict], other_path: str) -> list[str]:
    # Keyed by (backend, case id): every mutant class is called Backend, so ids alone collide.
    other = {(r["backend"], r["case"]): r["status"] for r in json.loads(Path(other_path).read_text())}
    # A cell skipped on either side (aiter-triton on CPU) has no verdict to compare.
    return [
        f"{r['backend']} {r['case']}: {other[(r['backend'], r['case'])]} there, {r['status']} here"
        for r in rows
        if other.get((r["backend"], r["case"]), r["status"]) not in (r["status"], "skip") and r["status"] != "skip"
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--matrix", default=str(ROOT / "matrices" / "full.yaml"))
    ap.add_argument("--quick", action="store_true", help="one batch (decode_7), kv auto")
    ap.add_argument("--no-mutants", action="store_true")
    ap.add_argument("--compare", help="another run's spec_decode.json: print the verdicts that differ")
    args = ap.parse_args(argv)
    full = Path(args.matrix)
    if not full.is_file():
        print(f"gpu_spec_decode: no such matrix file {full}", file=sys.stderr)
        return 2
    if args.compare and not Path(args.compare).is_file():
        print(f"gpu_spec_decode: --compare: no such file {args.compare}", file=sys.stderr)
        return 2
    out_dir = Path(os.environ.get("OUT", "spec-decode-out"))
    out_dir.mkdir(parents=True, exist_ok=True)

    from backend.harness.checker import SessionCache, run_case
    from orchestrator.errors import InputError
    from orchestrator.matrix import load_matrix

    batches = BATCHES[:1] if args.quick else BATCHES
    kvs = ("auto",) if args.quick else ("auto", "fp8")
    try:
        m = load_matrix(str(slice_matrix(full, out_dir, batches, kvs, sorted({*KS, *MUTANT_KS}))), devices="auto")
    except InputError as e:
        print(f"gpu_spec_decode: {e}", file=sys.stderr)
        return 2
    cases = {(c.backend, c.spec_tokens, c.mode, c.kv_cache_dtype, c.batch.name): c for c in m.cases}
    skipped = {
        (s.case.backend, s.case.spec_tokens, s.case.mode, s.case.kv_cache_dtype, s.case.batch.name): s
        for s in m.skipped
    }
    sessions = SessionCache(capacity=16)
    rows = []

    def run(backend: str, k: int, mode: str, kv: str, batch: str, base_backend: str | None = None) -> None:
        key = (base_backend or backend, k, mode, kv, batch)
        if key in skipped:  # e.g. aiter-triton on a machine without a GPU
            s = skipped[key].case
            rows.append(
                {
                    "case": s.case_id,
                    "backend": backend,
                    "mode": mode,
                    "kv": kv,
                    "batch": batch,
                    "k": k,
                    "status": "skip",
                    "resolved": "",
                    "graph": "",
                    "sizes_used": [],
                    "configured_sizes": list(s.capture_sizes),
                    "reason": skipped[key].reason,
                    "device": "",
                    "wall_s": 0.0,
                    "capture_s": 0.0,
                }
            )
            print(f"skip  {s.case_id}: {skipped[key].reason[:100]}", flush=True)
            return
        case = cases[key]
        if base_backend:
            case = dataclasses.replace(case, backend=backend)
        t0 = time.perf_counter()
        r = run_case(case, sessions=sessions)
        row = {
            "case": case.case_id,
            "backend": backend,
            "mode": mode,
            "kv": kv,
            "batch": batch,
            "k": k,
            "status": r.status.value,
            "resolved": r.resolved_mode,
            "graph": r.graph_kind,
            "sizes_used": list(r.capture_sizes_used),
            "configured_sizes": list(case.capture_sizes),
            "reason": r.reason,
            "device": r.device,
            "wall_s": round(time.perf_counter() - t0, 3),
            "capture_s": round(r.timings.get("capture_s", 0.0), 3),
        }
        rows.append(row)
        print(
            f"{row['status']:5} {row['case']} -> {row['resolved']} {row['sizes_used']} {row['wall_s']}s "
            f"{row['reason'][:100]}",
            flush=True,
        )

    for backend in PROVIDERS:
        for k in KS:
            for kv in kvs:
                for batch in batches:
                    for mode in MODES:
                        run(backend, k, mode, kv, batch)
    if not args.no_mutants:
        for backend in MUTANTS:
            for k in MUTANT_KS:
                for batch in (batches[0], "mixed_small") if not args.quick else batches:
                    for mode in MODES:
                        run(backend, k, mode, "auto", batch, base_backend="torch")

    device = next((r["device"] for r in rows if r["device"]), "unknown")
    (out_dir / "spec_decode.json").write_text(json.dumps(rows, indent=1))
    (out_dir / "spec_decode.md").write_text(markdown(rows, device))
    counts = collections.Counter((r["backend"], r["status"]) for r in rows)
    print("summary:", {f"{b.replace('tests.mutants.', '')}/{s}": n for (b, s), n in sorted(counts.items())})
    if args.compare:
        diff = compare(rows, args.compare)
        print(f"compare with {args.compare}: {len(diff)} verdicts differ")
        for line in diff:
            print("  " + line)
    bad = [r for r in rows if r["backend"] in PROVIDERS and r["status"] not in ("pass", "skip")]
    skipped_rows = [r for r in rows if r["backend"] in PROVIDERS and r["status"] == "skip"]
    print(
        f"correct providers: {len(bad)} not passing, {len(skipped_rows)} skipped "
        f"(e.g. {skipped_rows[0]['reason'][:80] if skipped_rows else '-'}) of "
        f"{sum(r['backend'] in PROVIDERS for r in rows)}; tables in {out_dir / 'spec_decode.md'}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
