"""Run a matrix's vLLM-backend cases in this process (no Ray), then a broken vLLM backend through
the same path: for the lent GPU machine, where the Python-only vllm wheel, its extras and orch's
own dependencies (.whl-vllm/, benchmarks/build_vllm_wheel.py) fill the 64 MiB carry without Ray.
Same matrix, checker, modes, reference and gate as `orch run`.

    python benchmarks/gpu_vllm.py                        # matrices/vllm.yaml tp=1, vllm:TRITON_ATTN, $OUT
    python benchmarks/gpu_vllm.py --backend vllm:FLEX_ATTENTION --devices cpu --filter 'batch=decode_7'

Writes to --out-dir (default $OUT, else ./gpu_vllm-out): gpu_vllm.json (every CaseResult, the
mutant's, versions, what was emulated, timings) and gpu_vllm.md (the verdict tables). One line
per case on stdout. The mutant (default: the backend's PrefillDropped from
tests/mutants/vllm_backends.py) must be red exactly on the cells with a prefill row.
--budget-s: no case starts after that many seconds (the rest are listed as not run), so the
files always come back within the device call.
Exit: 0 the run has no fail/error and the mutant is red where expected; 1 otherwise; 2 bad input.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: repo root importable

MUTANTS = {
    "vllm:TRITON_ATTN": "tests.mutants.vllm_backends:TritonPrefillDropped",
    "vllm:FLEX_ATTENTION": "tests.mutants.vllm_backends:FlexPrefillDropped",
}
MUTANT_FILTER = "tp=1 mode=PIECEWISE,FULL kv=auto k=0 batch=decode_7,mixed_small"
DECODE_GRAPH_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def mutant_expected(case) -> str:
    """Where the broken backend must be red. PrefillDropped zeroes the rows of prefill requests:
    red wherever the batch has one. vllm_gdn's Unstaged (vLLM's GDN builder without its
    persistent buffers): red where a k > 0 decode batch replays a FULL decode graph."""
    if case.backend.startswith("tests.mutants.vllm_gdn:"):
        hit = case.spec_tokens > 0 and case.batch.kind == "decode" and case.mode in DECODE_GRAPH_MODES
        return "fail" if hit else "pass"
    return "pass" if case.batch.kind == "decode" else "fail"


def _row(case, r) -> dict:
    t = r.timings
    return {
        "case_id": case.case_id,
        "mode": case.mode,
        "resolved": r.resolved_mode or "",
        "downgraded": r.downgraded,
        "kv": case.kv_cache_dtype,
        "batch": case.batch.name,
        "kind": case.batch.kind,
        "k": case.spec_tokens,
        "status": r.status.value,
        "graph": r.graph_kind or "",
        "capture_s": t.get("capture_s", 0.0),
        "eager_ms": t.get("eager_step_s", 0.0) * 1e3,
        "replay_ms": t.get("replay_step_s", 0.0) * 1e3,
        "total_s": t.get("total_s", 0.0),
        "reason": r.reason,
    }


def _run(label: str, cases, device, sessions, deadline: float, clock=time.perf_counter):
    from backend.harness.checker import run_case

    results, rows, not_run = [], [], []
    for case in cases:
        if clock() > deadline:
            not_run.append(case.case_id)
            continue
        r = run_case(case, device=device, sessions=sessions)
        row = _row(case, r)
        mode = row["resolved"] + (" (downgraded)" if r.downgraded else "")
        print(
            f"{label} {row['status'].upper():5} {case.case_id}  {case.mode} -> {mode}  graph {row['graph']}  "
            f"capture {row['capture_s']:.2f}s eager {row['eager_ms']:.1f}ms replay {row['replay_ms']:.1f}ms  "
            f"{r.reason[:200]}",
            flush=True,
        )
        results.append(r)
        rows.append(row)
    return results, rows, not_run


def markdown(meta: dict, rows: list[dict], mutant_rows: list[dict]) -> str:
    out = [
        f"# gpu_vllm: {meta['backend']} over {meta['matrix']} ({meta['filter']})",
        "",
        f"device {meta['device']}; versions {json.dumps(meta['versions'])}; emulated: {meta['emulated'] or 'none'}",
        "",
        f"**{meta['verdict']}** in {meta['wall_s']:.1f} s: "
        + (", ".join(f"{k} {v}" for k, v in sorted(meta["counts"].items())) or "-")
        + f"; {len(meta['skipped'])} skipped by the matrix; {len(meta['not_run'])} not run (budget)",
        "",
        "| case | mode -> resolved | kv | batch | k | status | graph | capture s | eager ms | replay ms | reason |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['case_id']} | {r['mode']} -> {r['resolved']}{' (downgraded)' if r['downgraded'] else ''} | "
            f"{r['kv']} | {r['batch']} | {r['k']} | {r['status']} | {r['graph']} | {r['capture_s']:.2f} | "
            f"{r['eager_ms']:.2f} | {r['replay_ms']:.2f} | {r['reason'][:120].replace('|', '/')} |"
        )
    if mutant_rows or meta.get("mutant"):
        m = meta["mutant"]
        out += [
            "",
            f"## broken backend {m['backend']} ({m['filter']}): {m['verdict']}",
            "",
            "| case | status | expected | reason |",
            "|---|---|---|---|",
        ]
        for r in mutant_rows:
            out.append(f"| {r['case_id']} | {r['status']} | {r['expected']} | {r['reason'][:120].replace('|', '/')} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default="matrices/vllm.yaml")
    ap.add_argument("--backend", default="vllm:TRITON_ATTN", help="backend override ('' keeps the matrix's)")
    ap.add_argument("--filter", default="tp=1")
    ap.add_argument("--devices", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--out-dir", default=os.environ.get("OUT") or "gpu_vllm-out")
    ap.add_argument(
        "--mutant",
        default=None,
        help="a broken backend to run after (default: the backend's "
        "PrefillDropped in tests/mutants/vllm_backends.py; '' = none)",
    )
    ap.add_argument("--mutant-filter", default=MUTANT_FILTER)
    ap.add_argument("--budget-s", type=float, default=400.0, help="no case starts after this (default 400)")
    a = ap.parse_args(argv)
    mutant = MUTANTS.get(a.backend, "") if a.mutant is None else a.mutant
    t0 = time.perf_counter()

    from orchestrator.errors import OrchError
    from orchestrator.filters import select
    from orchestrator.matrix import load_matrix

    try:
        matrix = load_matrix(a.matrix, devices=a.devices, backend_override=a.backend or None)
        cases = select(list(matrix.cases), a.filter or None)
        skipped = select(list(matrix.skipped), a.filter or None)
        m_cases, m_skipped = [], []
        if mutant:
            m_matrix = load_matrix(a.matrix, devices=a.devices, backend_override=mutant)
            m_cases = select(list(m_matrix.cases), a.mutant_filter)
            m_skipped = select(list(m_matrix.skipped), a.mutant_filter)
        out_dir = Path(a.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
    except OrchError as e:
        print(f"gpu_vllm: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"gpu_vllm: --out-dir {a.out_dir}: {e.strerror or e}", file=sys.stderr)
        return 2

    import torch

    from backend.harness.checker import SessionCache, default_device, versions
    from orchestrator.errors import ExitCode
    from orchestrator.gate import evaluate

    device = default_device() if matrix.device_class == "gpu" else torch.device("cpu")
    sessions = SessionCache(capacity=8)
    deadline = t0 + a.budget_s
    print(f"gpu_vllm: {len(cases)} cases ({len(skipped)} skipped by the matrix) on {device}, torch {torch.__version__}")
    for s in skipped[:8]:
        print(f"  skip {s.case.case_id}: {s.reason}")
    results, rows, not_run = _run("run", cases, device, sessions, deadline)
    counts = collections.Counter(r.status.value for r in results)
    gate = evaluate(results)
    verdict = ("gate PASSED" if gate.exit_code == ExitCode.OK else "gate FAILED") if results else "no runnable cases"

    m_results, m_rows, m_not_run = _run("mutant", m_cases, device, sessions, deadline)
    for case, row in zip(m_cases, m_rows):
        row["expected"] = mutant_expected(case)
    red_where_expected = bool(m_rows) and all(r["status"] == r["expected"] for r in m_rows)
    m_verdict = (
        ("red exactly where expected" if red_where_expected else "NOT as expected")
        if m_rows
        else ("no runnable cases: " + (m_skipped[0].reason if m_skipped else "none selected"))
    )
    wall = time.perf_counter() - t0

    emulated = ()
    try:
        from backend.attention.registry import get_backend

        emulated = get_backend(a.backend).emulated() if a.backend.startswith("vllm:") else ()
    except Exception:  # reporting only
        pass
    meta = {
        "matrix": a.matrix,
        "backend": a.backend,
        "filter": a.filter,
        "device": str(device),
        "versions": versions(),
        "emulated": ", ".join(emulated),
        "wall_s": wall,
        "budget_s": a.budget_s,
        "counts": dict(counts),
        "verdict": verdict,
        "not_run": not_run,
        "skipped": [{"case_id": s.case.case_id, "reason": s.reason} for s in skipped],
        "mutant": {"backend": mutant, "filter": a.mutant_filter, "verdict": m_verdict, "not_run": m_not_run},
    }
    (out_dir / "gpu_vllm.json").write_text(
        json.dumps(
            {
                **meta,
                "rows": rows,
                "mutant_rows": m_rows,
                "results": [r.to_dict() for r in results],
                "mutant_results": [r.to_dict() for r in m_results],
            },
            indent=1,
        )
    )
    (out_dir / "gpu_vllm.md").write_text(markdown(meta, rows, m_rows))
    print(
        f"gpu_vllm: {verdict}: "
        + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-")
        + f"; {len(skipped)} skipped, {len(not_run)} not run (budget); {wall:.1f} s"
    )
    if mutant:
        print(f"gpu_vllm: mutant {mutant}: {m_verdict}")
    print(f"gpu_vllm: wrote {out_dir / 'gpu_vllm.json'} and {out_dir / 'gpu_vllm.md'}")
    bad = counts.get("fail") or counts.get("error") or counts.get("timeout") or not_run
    return 1 if bad or (m_rows and not red_where_expected) else 0


if __name__ == "__main__":
    sys.exit(main())
