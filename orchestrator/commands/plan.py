"""`orch plan MATRIX`: what a run would do, without running anything.

Text: runnable case ids with k and the resolved mode, skipped ones with reasons, counts per axis
value and the estimated cost (total and per tp). `--json`: one document
  {matrix, device_class, cases: [{id, <axes>, resolved_mode, mode_note, capture_sizes, est_s}],
   skipped: [{id, reason}],
   counts: {axis: {value: n}}, total_est_s, est_s_by_tp}
(counts are over the runnable, selected cases; est_s is null when no cost model is installed).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence

from backend.case import Case
from orchestrator.errors import ExitCode
from orchestrator.filters import select
from orchestrator.matrix import SkippedCase, load_matrix

AXIS_NAMES = ("tp", "cudagraph_mode", "kv_cache_dtype", "batch", "backend", "seed", "spec_tokens")


def resolved_mode(case: Case) -> tuple[str, str, list[int]]:
    """(resolved mode, note, capture sizes) as the worker will settle them: backend/harness/modes.py against
    the backend's declared support, with the case's k (resolve_mode, then resolve_capture_sizes).
    The note is the downgrade warning and/or the spec-decode rounding of the sizes; "" when the
    request stands as written."""
    from backend.attention.registry import get_capabilities
    from backend.harness.modes import UnsupportedModeError, resolve_capture_sizes, resolve_mode

    cls = get_capabilities(case.backend)
    try:
        res = resolve_mode(case.mode, cls.cudagraph_support, backend_name=case.backend_label,
                           spec_tokens=case.spec_tokens)
        sizes = resolve_capture_sizes(case.capture_sizes, res.resolved, case.spec_tokens, case.model.capture_style)
    except UnsupportedModeError as e:
        return "ERROR", str(e), list(case.capture_sizes)
    return res.resolved.name, "; ".join(n for n in (res.message, sizes.note) if n), list(sizes.sizes)


def _cost_model() -> Callable[[Case], float] | None:
    try:
        from orchestrator.scheduling.cost import estimate_seconds
    except ImportError:
        return None
    return estimate_seconds


def counts_per_axis(cases: Sequence[Case]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter] = {axis: Counter() for axis in AXIS_NAMES}
    for case in cases:
        for axis, value in case.axes.items():
            counts[axis][str(value)] += 1
    return {axis: dict(c) for axis, c in counts.items()}


def build_plan(matrix: str, filter_expr: str | None, devices: str, backend: str | None = None) -> dict:
    m = load_matrix(matrix, devices=devices, backend_override=backend)
    cases = select(m.cases, filter_expr)
    skipped: list[SkippedCase] = select(m.skipped, filter_expr)
    estimate = _cost_model()
    est = {c.case_id: (round(float(estimate(c)), 3) if estimate else None) for c in cases}
    modes = {c.case_id: resolved_mode(c) for c in cases}
    by_tp: Counter = Counter()
    for c in cases:
        by_tp[str(c.tp)] += est[c.case_id] or 0.0
    return {
        "matrix": m.path,
        "name": m.name,
        "device_class": m.device_class,
        "cases": [{"id": c.case_id, **c.axes, "resolved_mode": modes[c.case_id][0], "mode_note": modes[c.case_id][1],
                   "capture_sizes": modes[c.case_id][2], "est_s": est[c.case_id]} for c in cases],
        "skipped": [{"id": s.case.case_id, "reason": s.reason} for s in skipped],
        "counts": counts_per_axis(cases),
        "total_est_s": round(sum(by_tp.values()), 3) if estimate else None,
        "est_s_by_tp": {tp: round(v, 3) for tp, v in sorted(by_tp.items(), key=lambda kv: int(kv[0]))} if estimate else None,
    }


def _write(lines: list[str]) -> None:
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def _print_text(plan: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    # markup off: reasons and ids come from the matrix file and may contain [brackets].
    console = Console(width=max(100, Console().width), highlight=False, markup=False)
    console.print(f"{plan['matrix']} ({plan['name']}, {plan['device_class']}): "
                  f"{len(plan['cases'])} runnable cases, {len(plan['skipped'])} skipped")
    # The case lists are plain aligned lines: a rich Table renders ~2 ms a row, seconds for
    # full.yaml's 1,700 rows, longer than loading the matrix.
    if plan["cases"]:
        width = max(len(c["id"]) for c in plan["cases"])
        mw = max(len(c["resolved_mode"]) + bool(c["mode_note"]) for c in plan["cases"])
        lines = [f"{'case id':<{width}}  {'k':>2}  {'resolved mode':<{max(mw, 13)}}  est s"]
        for c in plan["cases"]:
            mode = c["resolved_mode"] + ("*" if c["mode_note"] else "")
            est = "-" if c["est_s"] is None else f"{c['est_s']:.2f}"
            lines.append(f"{c['id']:<{width}}  {c['spec_tokens']:>2}  {mode:<{max(mw, 13)}}  {est:>5}")
        _write(lines)
        if any(c["mode_note"] for c in plan["cases"]):
            console.print("* downgraded, unresolved, or capture sizes rounded for spec decode: "
                          "`orch plan --json` gives each case's mode_note and capture_sizes")

    if plan["skipped"]:
        console.print(f"skipped: {len(plan['skipped'])}")
        width = max(len(s["id"]) for s in plan["skipped"])
        _write([f"{'case id':<{width}}  reason"] + [f"{s['id']:<{width}}  {s['reason']}" for s in plan["skipped"]])

    if plan["cases"]:
        console.print("runnable cases per axis value")
        counts = Table()
        counts.add_column("axis")
        counts.add_column("value = cases")
        for axis, values in plan["counts"].items():
            counts.add_row(axis, "  ".join(f"{v}={n}" for v, n in values.items()))
        console.print(counts)

    if plan["total_est_s"] is None:
        console.print("estimated cost: unknown (no cost model: orchestrator.scheduling.cost missing)")
        return
    console.print(f"estimated cost: {plan['total_est_s']:.1f} s (sum of case estimates; per tp below)")
    if plan["cases"]:
        cost = Table()
        cost.add_column("tp", justify="right")
        cost.add_column("est s", justify="right")
        for tp, sec in plan["est_s_by_tp"].items():
            cost.add_row(tp, f"{sec:.1f}")
        console.print(cost)


def main(matrix: str, filter_expr: str | None = None, as_json: bool = False, devices: str = "auto",
         backend: str | None = None) -> int:
    plan = build_plan(matrix, filter_expr, devices, backend)
    if as_json:
        print(json.dumps(plan, indent=1))
    else:
        _print_text(plan)
    return ExitCode.OK
