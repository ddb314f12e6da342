"""`orch plan MATRIX`: what a run would do, without running anything.

Text, sized for a CI log: how many cases run and how many are skipped, the skips grouped by
reason, the mode downgrades folded by kind, counts per axis value, and the expected wall time on
the workers `orch run` would start here (the sum of the case estimates shown apart, per tp). -v
adds every case id with k, resolved mode and estimate, and every skipped case with its reason.
`--json`: one document
  {matrix, device_class, cases: [{id, <axes>, resolved_mode, mode_note, capture_sizes, est_s}],
   skipped: [{id, reason}], skipped_by_reason: [{reason, count, backends}], downgrades: [line],
   counts: {axis: {value: n}}, total_est_s, est_s_by_tp,
   wall: {est_s, workers, parallel, device_kind, history},
   memory: {needs_bytes, largest_case, recorded, per_worker_bytes, describe, auto_workers_per_gpu, auto_why}}
(counts are over the runnable, selected cases; est_s is each case's expected seconds in a run:
the cost model calibrated by the past durations in --db when it exists, a gang's start-up counted
once per tp (scheduling/wall.py); wall.est_s is null when no worker would run here, e.g.
--devices gpu on a machine without one).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence

from backend.case import Case
from orchestrator import defaults, digest
from orchestrator.console import echo
from orchestrator.errors import ExitCode
from orchestrator.filters import select
from orchestrator.matrix import SkippedCase, load_matrix

AXIS_NAMES = (
    "attention",
    "tp",
    "cudagraph_mode",
    "kv_cache_dtype",
    "batch",
    "backend",
    "seed",
    "spec_tokens",
    "cg_padding",
)


def resolved_mode(case: Case) -> tuple[str, str, list[int]]:
    """(resolved mode, note, capture sizes) as the worker will settle them: backend/harness/modes.py against
    the backend's declared support, with the case's k (resolve_mode, then resolve_capture_sizes).
    The note is the downgrade warning and/or the spec-decode rounding of the sizes; "" when the
    request stands as written."""
    from backend.attention.registry import get_capabilities
    from backend.harness.modes import UnsupportedModeError, resolve_capture_sizes, resolve_mode

    cls = get_capabilities(case.backend, case.attention)
    try:
        res = resolve_mode(
            case.mode, cls.cudagraph_support, backend_name=case.backend_label, spec_tokens=case.spec_tokens
        )
        sizes = resolve_capture_sizes(case.capture_sizes, res.resolved, case.spec_tokens, case.model.capture_style)
    except UnsupportedModeError as e:
        return "ERROR", str(e), list(case.capture_sizes)
    return res.resolved.name, "; ".join(n for n in (res.message, sizes.note) if n), list(sizes.sizes)


def counts_per_axis(cases: Sequence[Case]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter] = {axis: Counter() for axis in AXIS_NAMES}
    for case in cases:
        for axis, value in case.axes.items():
            counts[axis][str(value)] += 1
    return {axis: dict(c) for axis, c in counts.items()}


def _history(db: str | None) -> tuple[dict[str, float], dict[str, int]]:
    """Past durations and device-memory needs from --db (read only), as `orch run` uses them."""
    from orchestrator.store import ResultStore
    from orchestrator.store.location import is_postgres_url

    if not db or not (is_postgres_url(db) or os.path.isfile(db)):
        return {}, {}

    with ResultStore(db, readonly=True) as store:
        return store.durations(), store.memory_needs()


def _memory(cases: Sequence[Case], needs: dict[str, int]) -> dict:
    """What one worker needs for these cases, from their recorded device memory, and
    how many workers `--workers-per-gpu auto` would put on each of this machine's GPUs."""
    from backend.attention.capabilities import driver_gpu_memory, local_gpu_count
    from orchestrator.executor.packing import DEFAULT_UTILIZATION, auto_per_gpu, worker_need

    need = worker_need((c.case_id for c in cases), needs)
    gpus = local_gpu_count()
    device = driver_gpu_memory() if gpus else None
    packing = auto_per_gpu(need, device, DEFAULT_UTILIZATION, os.cpu_count() or 1, gpus) if gpus else None
    return {
        "needs_bytes": need.bytes,
        "largest_case": need.case_id,
        "recorded": need.recorded,
        "per_worker_bytes": need.per_worker(),
        "describe": need.describe(),
        "auto_workers_per_gpu": packing.per_gpu if packing else None,
        "auto_why": packing.why if packing else "",
    }


def _wall(cases: Sequence[Case], est: dict[str, float], device_class: str, workers: int | None, history: int) -> dict:
    from backend.attention.capabilities import local_gpu_count
    from orchestrator.executor.cluster import local_layout
    from orchestrator.scheduling.wall import expected_wall

    gpus = local_gpu_count() if device_class == "gpu" else 0
    layout = local_layout(
        device_class, workers, max((c.tp for c in cases), default=1), cpus=os.cpu_count() or 1, gpus=gpus
    )
    wall = expected_wall(cases, est, layout.parallel, layout.workers)
    return {
        "est_s": None if wall is None else round(wall, 3),
        "workers": layout.workers,
        "parallel": layout.parallel,
        "device_kind": layout.device_kind,
        "describe": layout.describe(),
        "history": history,
    }


def build_plan(
    matrix: str,
    filter_expr: str | None,
    devices: str,
    backend: str | None = None,
    workers: int | None = None,
    db: str | None = None,
) -> dict:
    from orchestrator.scheduling.wall import case_durations

    if workers is not None and workers < 1:
        from orchestrator.errors import InputError

        raise InputError(f"--workers must be >= 1, got {workers}")
    m = load_matrix(matrix, devices=devices, backend_override=backend)
    cases = select(m.cases, filter_expr)
    skipped: list[SkippedCase] = select(m.skipped, filter_expr)
    history, needs = _history(db)
    est = {cid: round(float(v), 3) for cid, v in case_durations(cases, history).items()}
    modes = {c.case_id: resolved_mode(c) for c in cases}
    by_tp: dict[str, float] = defaultdict(float)
    for c in cases:
        by_tp[str(c.tp)] += est[c.case_id]
    downgrades = [
        (c.mode, modes[c.case_id][0], c.backend, c.axes.get("attention") or "gqa")
        for c in cases
        if modes[c.case_id][0] not in (c.mode, "ERROR")
    ]
    return {
        "matrix": m.path,
        "name": m.name,
        "device_class": m.device_class,
        "cases": [
            {
                "id": c.case_id,
                **c.axes,
                "resolved_mode": modes[c.case_id][0],
                "mode_note": modes[c.case_id][1],
                "capture_sizes": modes[c.case_id][2],
                "est_s": est[c.case_id],
            }
            for c in cases
        ],
        "skipped": [{"id": s.case.case_id, "reason": s.reason} for s in skipped],
        "skipped_by_reason": [
            {"reason": g.what, "count": g.count, "backends": list(g.backends)}
            for g in digest.skip_groups((s.reason, s.case.backend) for s in skipped)
        ],
        "downgrades": digest.downgrade_lines(downgrades),
        "counts": counts_per_axis(cases),
        "total_est_s": round(sum(by_tp.values()), 3),
        "est_s_by_tp": {tp: round(v, 3) for tp, v in sorted(by_tp.items(), key=lambda kv: int(kv[0]))},
        "wall": _wall(cases, est, m.device_class, workers, len(history)),
        "memory": _memory(cases, needs),
    }


def _write(lines: list[str]) -> None:
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def _case_lines(plan: dict) -> list[str]:
    # Plain aligned lines: a rich Table renders ~2 ms a row, seconds for full.yaml's 1,700 rows.
    lines: list[str] = []
    if plan["cases"]:
        width = max(len(c["id"]) for c in plan["cases"])
        mw = max(13, max(len(c["resolved_mode"]) + bool(c["mode_note"]) for c in plan["cases"]))
        lines.append(f"{'case id':<{width}}  {'k':>2}  {'resolved mode':<{mw}}  est s")
        for c in plan["cases"]:
            mode = c["resolved_mode"] + ("*" if c["mode_note"] else "")
            est = "-" if c["est_s"] is None else f"{c['est_s']:.2f}"
            lines.append(f"{c['id']:<{width}}  {c['spec_tokens']:>2}  {mode:<{mw}}  {est:>5}")
        if any(c["mode_note"] for c in plan["cases"]):
            lines.append(
                "* downgraded, unresolved, or capture sizes rounded for spec decode: "
                "`orch plan --json` gives each case's mode_note and capture_sizes"
            )
    if plan["skipped"]:
        width = max(len(s["id"]) for s in plan["skipped"])
        lines += [f"skipped: {len(plan['skipped'])}", f"{'case id':<{width}}  reason"]
        lines += [f"{s['id']:<{width}}  {s['reason']}" for s in plan["skipped"]]
    return lines


def _print_text(plan: dict, verbose: bool = False) -> None:
    from rich.table import Table

    lines = [
        f"{plan['matrix']} ({plan['name']}, {plan['device_class']}): "
        f"{len(plan['cases'])} runnable cases, {len(plan['skipped'])} skipped"
    ]
    if verbose:
        lines += _case_lines(plan)
    if plan["skipped_by_reason"]:
        lines.append(f"skipped {len(plan['skipped'])} by reason:")
        lines += [f"  {g['count']} {g['reason']} ({', '.join(g['backends'])})" for g in plan["skipped_by_reason"]]
    lines += [f"warning: {line}" for line in plan["downgrades"]]
    _write(lines)
    if plan["cases"]:
        # markup off: values come from the matrix file and may contain [brackets].
        counts = Table(title="runnable cases per axis value", title_justify="left")
        counts.add_column("axis")
        counts.add_column("value = cases")
        for axis, values in plan["counts"].items():
            counts.add_row(axis, "  ".join(f"{v}={n}" for v, n in values.items()))
        echo(counts, markup=False)
    wall = plan["wall"]
    calibrated = (
        f"estimates calibrated by {wall['history']} past durations in --db"
        if wall["history"]
        else "estimates from the cost model alone (no past durations in --db yet)"
    )
    if wall["est_s"] is None:
        lines = [
            f"expected wall time: unknown here (no {wall['device_kind']} worker on this machine; "
            f"a cluster run is as long as its workers make it)"
        ]
    else:
        lines = [
            f"expected wall time: {wall['est_s']:.1f} s for the cases on {wall['describe']}; {calibrated}; "
            f"worker start-up not included"
        ]
    lines.append(f"sum of case estimates: {plan['total_est_s']:.1f} s of worker time (per tp below)")
    memory = plan["memory"]
    lines.append(
        f"device memory per worker: {memory['describe']}"
        + (f"; --workers-per-gpu auto: {memory['auto_why']}" if memory["auto_why"] else "")
    )
    _write(lines)
    if plan["cases"]:
        cost = Table()
        cost.add_column("tp", justify="right")
        cost.add_column("est s", justify="right")
        for tp, sec in plan["est_s_by_tp"].items():
            cost.add_row(tp, f"{sec:.1f}")
        echo(cost, markup=False)
    if not verbose and (plan["cases"] or plan["skipped"]):
        _write(["-v lists every case (id, k, resolved mode, estimate) and every skipped case with its reason"])


def main(
    matrix: str,
    filter_expr: str | None = None,
    as_json: bool = False,
    devices: str = "auto",
    backend: str | None = None,
    workers: int | None = None,
    db: str | None = None,
    verbose: bool = False,
) -> int:
    plan = build_plan(matrix, filter_expr, devices, backend, workers=workers, db=db or defaults.db())
    if as_json:
        print(json.dumps(plan, indent=1))
    else:
        _print_text(plan, verbose)
    return ExitCode.OK
