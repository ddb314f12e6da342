"""Run a matrix's vLLM-backend cases in this process (no Ray): for the lent GPU machine, where the
Python-only vllm wheel and its extras (benchmarks/build_vllm_wheel.py, 55 MiB) fill the 64 MiB
carry that Ray's wheel would need too. Same checker, modes, reference and verdicts as `orch run`.

    python benchmarks/gpu_vllm.py                                   # matrices/vllm.yaml, tp=1, TRITON_ATTN
    python benchmarks/gpu_vllm.py --backend vllm:FLEX_ATTENTION --devices cpu --filter 'batch=decode_7'

One line per case (status, requested -> resolved mode, capture/replay timings, reason), a count
per status, and --out JSON with every CaseResult. Exit: 0 no fail/error, 1 some, 2 bad input.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: repo root importable


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default="matrices/vllm.yaml")
    ap.add_argument("--backend", default="vllm:TRITON_ATTN", help="backend override ('' keeps the matrix's)")
    ap.add_argument("--filter", default="tp=1")
    ap.add_argument("--devices", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--out", default="", help="write every result here (JSON)")
    a = ap.parse_args(argv)

    from orchestrator.errors import OrchError
    from orchestrator.filters import select
    from orchestrator.matrix import load_matrix

    try:
        matrix = load_matrix(a.matrix, devices=a.devices, backend_override=a.backend or None)
        cases = select(list(matrix.cases), a.filter or None)
        skipped = select(list(matrix.skipped), a.filter or None)
    except OrchError as e:
        print(f"gpu_vllm: {e}", file=sys.stderr)
        return 2

    import torch

    from backend.checker import SessionCache, default_device, run_case

    device = default_device() if matrix.device_class == "gpu" else torch.device("cpu")
    sessions = SessionCache(capacity=8)
    results, counts = [], collections.Counter()
    t0 = time.perf_counter()
    print(f"gpu_vllm: {len(cases)} cases ({len(skipped)} skipped by the matrix) on {device}, torch {torch.__version__}")
    for s in skipped[:5]:
        print(f"  skip {s.case.case_id}: {s.reason}")
    for case in cases:
        r = run_case(case, device=device, sessions=sessions)
        counts[r.status.value] += 1
        t = r.timings
        mode = r.resolved_mode + (" (downgraded)" if r.downgraded else "")
        print(f"{r.status.value.upper():5} {case.case_id}  {case.mode} -> {mode}  graph {r.graph_kind}  "
              f"capture {t.get('capture_s', 0):.2f}s eager {t.get('eager_step_s', 0) * 1e3:.1f}ms "
              f"replay {t.get('replay_step_s', 0) * 1e3:.1f}ms  {r.reason}", flush=True)
        results.append(r.to_dict())
    wall = time.perf_counter() - t0
    print("gpu_vllm: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no runnable cases") + f"; {wall:.1f} s")
    if a.out:
        Path(a.out).write_text(json.dumps({"matrix": a.matrix, "backend": a.backend, "filter": a.filter,
                                           "device": str(device), "wall_s": wall, "results": results}, indent=1))
    return 1 if counts.get("fail") or counts.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
