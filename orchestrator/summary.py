"""Markdown summary for CI annotations ($GITHUB_STEP_SUMMARY, `buildkite-agent annotate`).

Order is by what a reviewer must act on: which run and its state (INTERRUPTED when it did not
finish), the verdict, what ran, regressions, new failures, then what does not gate (old failures,
flaky, fixed and known failures, muted cases, downgrades folded by kind, skips grouped by reason), then a compact
grid per backend that ran. Sections are capped so a broken run of thousands of cases stays under
CI size limits (GitHub: 1 MiB), and every capped list says how many it left out.
"""

from __future__ import annotations

import html
import os
import re
from collections import Counter
from collections.abc import Sequence

from backend.case import CUDAGRAPH_MODES, KV_CACHE_DTYPES
from backend.result import CaseResult
from orchestrator import digest
from orchestrator.gate import CLASSIFICATIONS, C, Classification, GateOutcome
from orchestrator.outputs import downgrades, headline, memory_line, run_state, selection, skips
from orchestrator.store import RunInfo

SYMBOL = {
    C.PASS: "✅", C.REGRESSION: "🔻", C.NEW: "❌", C.FAIL: "❌", C.ERROR: "💥", C.TIMEOUT: "⏱️", C.MISSING: "❔",
    C.OLD_FAILURE: "🟥", C.FLAKY: "🎲", C.UNVERIFIABLE: "❓", C.PASS_UNVERIFIABLE: "❔", C.KNOWN_FAIL: "🟨",
    C.FIXED: "🟢", C.SKIP: "⬜", C.NOT_RUN: "🚧", C.OOM: "🧱", C.MUTED: "🔇",
}  # fmt: skip # a table: one row per line, as it reads
MAX_PER_SECTION = 25
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _text(s: str) -> str:
    """Case text outside code blocks: one line, HTML-escaped (Buildkite annotations render HTML)."""
    return html.escape(" ".join(str(s).split()), quote=False)


def _code(s: str) -> str:
    """Case text inside a fenced block: no colour codes, and it cannot close the fence."""
    return _ANSI.sub("", s).replace(3 * "`", 3 * "'")


def _order(values, preferred: Sequence) -> list:
    rank = {v: i for i, v in enumerate(preferred)}
    return sorted(set(values), key=lambda v: (rank.get(v, len(rank)), str(v)))


def _case_block(r: CaseResult, extra: str = "") -> list[str]:
    head = f"- **`{r.case_id}`** — {_text(r.reason or r.status.value)}" + (f" {_text(extra)}" if extra.strip() else "")
    body = [c.summary() for c in r.failed_checks] or ([f"error kind: {r.error_kind}"] if r.error_kind else [])
    if r.log_tail and not r.failed_checks:
        body += ["...", *r.log_tail.strip().splitlines()[-5:]]
    lines = [head]
    if body:
        lines += ["  ```", *[f"  {_code(b)}" for b in body], "  ```"]
    if r.repro:
        lines += ["  ```sh", f"  {_code(r.repro)}", "  ```"]
    return lines


def _section(
    title: str, ids: Sequence[str], by_id: dict[str, CaseResult], gate: GateOutcome, note: str = ""
) -> list[str]:
    if not ids:
        return []
    out = [f"### {title} ({len(ids)})", ""]
    if note:
        out += [note, ""]
    for cid in ids[:MAX_PER_SECTION]:
        r = by_id.get(cid)
        if r is None:
            out.append(f"- **`{cid}`** — no result")
            continue
        extra = ""
        kf = gate.known_reasons.get(cid)
        if gate.classification.get(cid) == C.MUTED:
            extra = (
                f" (muted, its status {r.status.value}"
                + (f"; {kf.reason}, {kf.link}, until {kf.until}" if kf else "")
                + ")"
            )
        elif kf is not None:
            extra = f" (known: {kf.reason}" + (f", {kf.link}" if kf.link else "") + ")"
        base = gate.baseline_status.get(cid)
        if base and gate.classification.get(cid) == C.REGRESSION:
            extra += f" (baseline: {base})"
        out += _case_block(r, extra)
    if len(ids) > MAX_PER_SECTION:
        out.append(f"- … and {len(ids) - MAX_PER_SECTION} more (see `orch report`)")
    out.append("")
    return out


def _k(r: CaseResult) -> int:
    return int(r.axes.get("spec_tokens", 0) or 0)  # results stored before the axis have no key


def grid(results: Sequence[CaseResult], gate: GateOutcome) -> list[str]:
    """Rows tp × mode (× k when the run has spec-decode cases), columns kv dtype × batch; one
    symbol per cell (worst case in the cell). Backends that ran most come first; one whose every
    case was skipped gets no grid (the Skipped section names it and why)."""
    out: list[str] = []
    worst = {c: i for i, c in enumerate(CLASSIFICATIONS)}

    # One grid per (attention family, backend): gqa's first, then by cases run (most first); a
    # group whose every case was skipped gets none.
    def group(r: CaseResult) -> tuple[str, str]:
        return (r.axes.get("attention") or "gqa", r.axes.get("backend", "?"))

    ran = Counter(group(r) for r in results if r.status.value != "skip")
    for family, backend in sorted(ran, key=lambda g: (g[0] != "gqa", -ran[g], str(g))):
        rs = [r for r in results if group(r) == (family, backend)]
        rows = _order(((r.axes.get("tp"), r.axes.get("cudagraph_mode"), _k(r)) for r in rs), ())
        rows = sorted(
            rows, key=lambda t: (t[0] or 0, CUDAGRAPH_MODES.index(t[1]) if t[1] in CUDAGRAPH_MODES else 99, t[2])
        )
        with_k = any(k for _, _, k in rows)
        kvs = _order((r.axes.get("kv_cache_dtype") for r in rs), KV_CACHE_DTYPES)
        batches = list(dict.fromkeys(r.axes.get("batch") for r in rs))
        cols = [(kv, b) for kv in kvs for b in batches]
        cells: dict[tuple, Classification] = {}
        down: set[tuple] = set()
        for r in rs:
            key = (
                r.axes.get("tp"),
                r.axes.get("cudagraph_mode"),
                _k(r),
                r.axes.get("kv_cache_dtype"),
                r.axes.get("batch"),
            )
            cls = gate.classification.get(r.case_id, Classification(r.status.value))
            if key not in cells or worst[cls] < worst[cells[key]]:
                cells[key] = cls
            if r.downgraded:
                down.add(key)
        out += [f"#### `{backend}`" + ("" if family == "gqa" else f" · {family}"), ""]
        head = "tp × mode × k" if with_k else "tp × mode"
        out.append(f"| {head} | " + " | ".join(f"{kv}<br>{b}" for kv, b in cols) + " |")
        out.append("|---|" + "---|" * len(cols))
        for tp, mode, k in rows:
            row = []
            for kv, b in cols:
                cell = cells.get((tp, mode, k, kv, b))
                sym = SYMBOL.get(cell, "·") if cell else "·"
                row.append(sym + ("↓" if (tp, mode, k, kv, b) in down else ""))
            out.append(f"| tp{tp} {mode}{f' k{k}' if k else ''} | " + " | ".join(row) + " |")
        out.append("")
    legend = ", ".join(f"{SYMBOL[c]} {c}" for c in CLASSIFICATIONS) + ", ↓ mode downgraded, · not in matrix"
    return out + [f"<sub>{legend}</sub>", ""]


def _skipped(results: Sequence[CaseResult]) -> list[str]:
    groups = digest.skip_groups(skips(results))
    if not groups:
        return []
    out = [
        f"### Skipped ({sum(g.count for g in groups)})",
        "",
        "Cannot run here; not gating.",
        "",
        "| cases | reason | backends |",
        "|---:|---|---|",
    ]
    for g in groups[:MAX_PER_SECTION]:
        out.append(f"| {g.count} | {_text(g.what).replace('|', '&#124;')} | {', '.join(g.backends)} |")
    if len(groups) > MAX_PER_SECTION:
        left = groups[MAX_PER_SECTION:]
        out.append(f"| {sum(g.count for g in left)} | … and {len(left)} more reasons (see `orch report`) | |")
    return out + [""]


def _downgraded(results: Sequence[CaseResult], gate: GateOutcome) -> list[str]:
    if not gate.downgraded:
        return []
    out = [
        f"### Downgraded modes ({len(gate.downgraded)})",
        "",
        "Resolved against the backend's declared support, as vLLM does; not gating.",
        "",
    ]
    out += [f"- {_text(line)}" for line in digest.downgrade_lines(downgrades(results))]
    return out + [""]


def render(run: RunInfo, results: Sequence[CaseResult], gate: GateOutcome) -> str:
    by_id = {r.case_id: r for r in results}
    state = run_state(run)
    icon = "⛔" if state else "✅" if gate.passed else "❌"
    out = [f"## {icon} orch run {run.id} — `{run.matrix}`" + (f" — {state}" if state else ""), ""]
    if state:
        out += [
            f"> **{state}**: {run.num_results} of {run.num_cases} planned cases have a result; the rest are "
            f"listed as missing. Finish the run with `orch run --resume {run.id}`.",
            "",
        ]
    out += [f"**{_text(headline(run, gate))}**", ""]
    ran = [r for r in results if r.status.value != "skip"]
    by_status = Counter(r.status.value for r in ran)
    what_ran = f"**{len(ran)} ran**" + (
        f" ({', '.join(f'{n} {k}' for k, n in sorted(by_status.items()))})" if ran else ""
    )
    what_ran += f" · {len(results) - len(ran)} skipped" + (f" · {len(gate.missing)} missing" if gate.missing else "")
    out += [what_ran, ""]
    sel = selection(run)
    if sel:  # a filtered or re-targeted run says so: its green covers only this slice
        out += [f"Selection: {_text(sel)}", ""]
    if run.options.require:
        out += ["Required to run: " + ", ".join(f"`{_code(r)}`" for r in run.options.require), ""]
    counts = [(c, n) for c, n in gate.counts.items() if n]
    if counts:
        out += ["| " + " | ".join(f"{SYMBOL[c]} {c}" for c, _ in counts) + " |", "|" + "---|" * len(counts)]
        out += ["| " + " | ".join(str(n) for _, n in counts) + " |", ""]
    meta = [
        f"devices: {run.devices or '?'}",
        f"git: `{run.git_sha[:12]}`" if run.git_sha else "git: not a checkout",
        f"status: {run.status}",
    ]
    if run.baseline:
        meta.append(f"baseline: `{run.baseline}`")
    out += [" · ".join(meta), ""]
    if memory_line(results):
        out += [memory_line(results), ""]
    plain_failed = tuple(c for c in gate.new_failures if gate.classification[c] != C.NEW)
    out += _section("Regressions", gate.regressions, by_id, gate, "Passed in the baseline, fail now.")
    out += _section(
        "New failures",
        tuple(c for c in gate.new_failures if c not in plain_failed),
        by_id,
        gate,
        "Failing cases the baseline did not run.",
    )
    out += _section("Failures", plain_failed, by_id, gate)
    out += _section(
        "Not run (infrastructure)",
        gate.not_run,
        by_id,
        gate,
        "Required cases that never ran (placement, tp gang): the machines, not the code; exit 3.",
    )
    out += _section(
        "Out of memory (infrastructure)",
        gate.oom,
        by_id,
        gate,
        "Ran out of device memory again when rerun alone on a cleared worker: the harness's memory, "
        "not the backend; exit 3 (docs/EXECUTION.md, GPU memory).",
    )
    out += _section("Missing results", gate.missing, by_id, gate, "Planned but never finished: `orch run --resume`.")
    out += _section("Old failures (not gating)", gate.old_failures, by_id, gate, "Also failing in the baseline.")
    out += _section("Flaky (not gating)", gate.flaky, by_id, gate)
    out += _section(
        "Unverifiable: the replay disagreed on graphs the CPU emulation cannot follow"
        + (" (allowed, not gating)" if gate.allow_unverifiable else ""),
        gate.unverifiable,
        by_id,
        gate,
        "Never a pass: run these on a GPU to decide"
        + (
            " (the run said --allow-unverifiable)."
            if gate.allow_unverifiable
            else " (or gate with --allow-unverifiable)."
        ),
    )
    out += _section(
        "Passed, unverifiable on the CPU emulation (not gating)",
        gate.pass_unverifiable,
        by_id,
        gate,
        "Passed, but the emulation says what it could not follow: run these on a GPU.",
    )
    out += _section(
        "Fixed known failures", gate.fixed, by_id, gate, "These pass now: remove their known-failures entries."
    )
    out += _section("Known failures (xfail)", gate.known_failures, by_id, gate)
    out += _section(
        "Muted (not gating)",
        gate.muted,
        by_id,
        gate,
        "Matched by a known-failures entry with `mute: true`: run and reported with their own status, never gating.",
    )
    out += _downgraded(results, gate)
    out += _skipped(results)
    out += ["### Grid", ""] + grid(results, gate)
    return "\n".join(out)


def write(path: str | None, text: str) -> None:
    """Write to PATH (whole or not at all) and append to $GITHUB_STEP_SUMMARY when CI sets it."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(path + ".tmp", path)
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if step:
        with open(step, "a", encoding="utf-8") as f:
            f.write(text + "\n")
