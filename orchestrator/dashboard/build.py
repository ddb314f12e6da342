"""Dashboard view model and rendering.

The page is one HTML file: Jinja2 (autoescape on) lays out the skeleton and inlines our CSS/JS;
every value that came from a case travels as JSON in a <script type="application/json"> block and
is put on the page by the JS with textContent only. Hazard: JSON inside a script element ends at
the first "</script", whatever the quoting, so "<", ">" and "&" are escaped as \\u003c etc.

`page_data` is the view model: one plain dict per case (`case_entry`; a new field is one more key
there) and the run's. The page carries it packed (pack.py: under 1 MB for full.yaml's 2,185
cases, against 3.9 MB plain); dashboard.js unpacks it into the same dicts.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from backend.result import CaseResult, Status
from orchestrator.dashboard.pack import pack
from orchestrator.gate import CLASSIFICATIONS, FAILING, C, Classification
from orchestrator.outputs import RunView, selection
from orchestrator.store import ResultStore

_HERE = Path(__file__).parent
_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(_HERE / "templates")),
    autoescape=True,  # every template, whatever its extension
    undefined=jinja2.StrictUndefined,
)

# Display state of a cell: the status, or the gate's class where it is not the status (known-fail,
# pass-unverifiable, muted: a muted error is no gating error), or "pending"/"missing" without a result.
STATES = (
    "pass",
    "pass-unverifiable",
    "fail",
    "error",
    "timeout",
    "unverifiable",
    "flaky",
    "known-fail",
    "muted",
    "not-run",
    "skip",
    "pending",
    "missing",
)


def json_for_script(data: Any) -> str:
    """JSON that is safe inside <script type="application/json">; JSON.parse undoes the escapes."""
    text = json.dumps(data, sort_keys=True, default=str, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _num(x: float | None) -> float | None:
    # JSON has no NaN/Inf; a non-finite error (the finite check failing) becomes a string.
    if x is None:
        return None
    return x if x == x and abs(x) != float("inf") else None


def _streak(runs: list) -> dict[str, Any]:
    """Streak and last pass of (run id, status, ...) rows, newest first."""
    streak_status, streak = (runs[0][1], 0) if runs else ("", 0)
    for row in runs:
        if row[1] != streak_status:
            break
        streak += 1
    last_pass = next((row[0] for row in runs if row[1] == Status.PASS.value), None)
    return {"streak": streak, "streak_status": streak_status, "last_pass": last_pass}


def _history(case_id: str, current: int, hist: dict, labels: dict[int, str] | None = None) -> dict[str, Any]:
    """The case's results in earlier runs of the store (any driver, any label: each row names its
    label), newest first, with streaks overall and per device model (an H100's history is not an
    MI300X's)."""
    labels = labels or {}
    runs = [(rid, st, model) for rid, st, model in hist.get(case_id, []) if rid <= current]  # newest first
    by_device: dict[str, list] = {}
    for rid, st, model in runs:
        by_device.setdefault(model or "?", []).append((rid, st))
    return {
        "runs": [[rid, st, model, labels.get(rid, "")] for rid, st, model in runs],
        **_streak(runs),
        "by_device": [{"device": m, "runs": [list(x) for x in rows], **_streak(rows)} for m, rows in by_device.items()],
    }


def with_k(axes: dict) -> dict[str, Any]:
    """Axes with spec_tokens and attention (0 and gqa for results stored before those axes), so
    the page groups them."""
    return {**axes, "spec_tokens": axes.get("spec_tokens", 0) or 0, "attention": axes.get("attention") or "gqa"}


def case_entry(r: CaseResult, view: RunView, hist: dict, labels: dict[int, str] | None = None) -> dict[str, Any]:
    gate = view.gate
    cls = gate.classification.get(r.case_id, Classification(r.status.value))
    state = cls.value if cls in (C.KNOWN_FAIL, C.PASS_UNVERIFIABLE, C.MUTED) else r.status.value
    base = gate.baseline_status.get(r.case_id)
    change = ""
    if cls == C.REGRESSION:
        change = "regression"
    elif cls == C.NEW:
        change = "new"
    elif base in {s.value for s in FAILING} and r.status == Status.PASS:
        change = "fixed"
    kf = gate.known_reasons.get(r.case_id)
    t = r.timings
    eager, replay = t.get("eager_step_s"), t.get("replay_step_s")
    return {
        "id": r.case_id,
        "axes": with_k(r.axes),
        "state": state,
        "cls": cls.value,
        "status": r.status.value if cls == C.MUTED else "",  # a muted case's own verdict, beside its class
        "change": change,
        "baseline": base or "",
        "reason": r.reason,
        "downgraded": r.downgraded,
        "requested_mode": r.requested_mode,
        "resolved_mode": r.resolved_mode,
        "graph_kind": r.graph_kind,
        "provider": r.provider,
        "capture_sizes": list(r.capture_sizes_used),
        "error_kind": r.error_kind,
        "checks": [
            {
                "name": c.name,
                "passed": c.passed,
                "summary": c.summary(),
                "step": c.step,
                "max_abs": _num(c.max_abs_err),
                "max_rel": _num(c.max_rel_err),
                "mismatch": _num(c.mismatch_frac),
                "first_bad": list(c.first_bad) if c.first_bad else None,
                "bitwise": c.bitwise,
                "detail": c.detail,
            }
            for c in r.checks
        ],
        "timings": {k: _num(v) for k, v in t.items()},
        "speedup": round(eager / replay, 2) if eager and replay else None,
        "memory": {k: int(v) for k, v in r.memory.items()},
        "device": r.device,
        "versions": dict(r.versions),
        "log_tail": r.log_tail,
        "repro": r.repro,
        "attempts": r.attempts,
        "worker": r.worker,
        "known": {"reason": kf.reason, "link": kf.link, "mute": kf.mute, "until": str(kf.until or "")} if kf else None,
        "history": _history(r.case_id, view.run.id, hist, labels),
        "flakiness": _flakiness(r.case_id, view),
    }


def _flakiness(case_id: str, view: RunView) -> dict[str, Any] | None:
    """Its score over the window of runs the gate reads (outputs.gather), None with no window."""
    f = view.flakiness.get(case_id)
    if f is None or not view.window:
        return None
    return {**f.to_dict(), "window": len(view.window), "label": view.window_label}


def page_data(
    view: RunView,
    hist: dict[str, list[tuple[int, str, str]]],
    runs: list[dict] | None = None,
    labels: dict[int, str] | None = None,
) -> dict[str, Any]:
    """Everything the page shows, JSON-able. `hist`: store.status_history(); `labels`: run id ->
    label of the runs in it."""
    pending_state = "pending" if view.run.status == "running" else "missing"
    cases = [case_entry(r, view, hist, labels) for r in view.results]
    for p in view.planned:
        axes = with_k({k: v for k, v in p.items() if k != "case_id"})
        cases.append(
            {
                "id": p["case_id"],
                "axes": axes,
                "state": pending_state,
                "cls": pending_state,
                "change": "",
                "reason": "no result yet" if pending_state == "pending" else "planned, never finished",
                "downgraded": False,
                "checks": [],
                "history": _history(p["case_id"], view.run.id, hist, labels),
            }
        )
    run = view.run
    return {
        "run": {
            "id": run.id,
            "matrix": run.matrix,
            "status": run.status,
            "git_sha": run.git_sha,
            "devices": run.devices,
            "cluster": run.cluster,
            "started_at": run.started_at,
            "finished_at": run.finished_at,
            "versions": run.versions,
            "num_cases": run.num_cases,
            "num_results": run.num_results,
            "label": run.label,
            "device_model": run.device_model,
            "selection": selection(run),
        },
        "gate": {**view.gate.to_dict(), "baseline": view.baseline_given},
        "baseline_where": view.baseline.where,  # "run 3 (latest labelled 'main')"
        "baseline_note": view.baseline.note,  # why a label found no baseline
        # Which run and, unless it finished, its state (INTERRUPTED...): the page's first line.
        "headline": view.headline(),
        "state": view.state,
        "cases": cases,
        "states": list(STATES),
        "classifications": [c.value for c in CLASSIFICATIONS],  # json.dumps sorts keys: this keeps worst-first order
        "runs": runs or [],
        "generated_at": time.time(),
    }


def data_version(store: ResultStore, run_id: int) -> str:
    """Cheap token that changes whenever the page would: polled by the live page."""
    run = store.run(run_id)
    return f"{run.id}:{run.num_results}:{run.status}:{store.latest_run_id()}"


def render_html(data: dict[str, Any], *, live: bool = False) -> str:
    """The page for page_data's dict (packed here: the page's script unpacks it)."""
    css = (_HERE / "static" / "dashboard.css").read_text(encoding="utf-8")
    js = (_HERE / "static" / "dashboard.js").read_text(encoding="utf-8")
    return _ENV.get_template("index.html.j2").render(
        title=f"orch run {data['run']['id']}"
        + (f" {data['state']}" if data["state"] else "")
        + f" — {data['run']['matrix']}",
        run=data["run"],
        verdict=data["headline"],
        verdict_class="state" if data["state"] else "ok" if data["gate"]["passed"] else "bad",
        data_json=Markup(json_for_script(pack(data))),
        css=Markup(css),
        js=Markup(js),
        live=live,
    )


def store_history(store: ResultStore) -> tuple[dict, dict[int, str]]:
    """(status_history, run id -> label of the runs in it): what page_data's history needs."""
    hist = store.status_history()
    return hist, store.labels([rid for rows in hist.values() for rid, *_ in rows])


def build_page(store: ResultStore, view: RunView, *, live: bool = False) -> str:
    hist, labels = store_history(store)
    data = page_data(view, hist, live_extras(store, view.run.id) if live else None, labels)
    if live:
        data["version"] = data_version(store, view.run.id)
    return render_html(data, live=live)


def live_extras(store: ResultStore, run_id: int) -> list[dict]:
    return [{"id": r.id, "status": r.status, "matrix": r.matrix} for r in store.runs()]


def write_dashboard(store: ResultStore, view: RunView, out_dir: str) -> str:
    """Write OUT/index.html; returns its path. Opens from disk: no network, nothing external."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "index.html")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(build_page(store, view))
    os.replace(tmp, path)  # a CI artifact is never half written
    return path
