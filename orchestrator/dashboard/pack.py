"""The page's data, packed for the wire: full.yaml's 2,185 cases as plain view-model dicts made a
3.9 MB page; packed, a page under 1 MB. dashboard.js `unpack` restores the same dicts, so
the view model (build.py `case_entry`) stays the one place a field is added: a new field travels
as it is, and only these known ones are packed.

Per case:
- values the page can rebuild are left out: empty ones ("", None, [], {}, False), `cls` equal to
  `state`, `requested_mode` equal to the mode axis, the default repro command, the replay
  speedup, one attempt, a history of the current run alone;
- axes become one list in `axis_names` order; checks, lists in `check_fields` order (their summary
  line left out: the page shows the numbers); timings, one list in `timing_keys` order (0 and
  absent alike: null); floats to 4 significant digits;
- versions only where they differ from the run's most common value of that key (`versions`; 0:
  none differ);
- repeated strings (axis values, check names, reasons, workers, providers, log tails...) an index
  into `strings`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

AXIS_NAMES = ("attention", "tp", "cudagraph_mode", "kv_cache_dtype", "batch", "backend", "seed", "spec_tokens")
STRING_AXES = ("attention", "cudagraph_mode", "kv_cache_dtype", "batch", "backend")  # interned; the rest ints
# Fields most checks leave empty last: a row ends at its last value.
CHECK_FIELDS = ("name", "passed", "max_abs", "max_rel", "mismatch", "bitwise", "step", "first_bad", "detail")
INTERNED = (
    "reason",
    "worker",
    "provider",
    "graph_kind",
    "device",
    "resolved_mode",
    "error_kind",
    "log_tail",
    "baseline",
    "change",
    "state",
    "cls",
)


def _empty(v: Any) -> bool:
    return v is None or v is False or (isinstance(v, (str, list, dict)) and not v)


def _round(x: Any) -> Any:
    """4 significant digits; an integral float as an int ("0", not "0.0")."""
    if not isinstance(x, float) or x != x or x in (float("inf"), float("-inf")):
        return x
    r = float(f"{x:.4g}")
    return int(r) if r.is_integer() and abs(r) < 1e15 else r


def default_repro(case_id: str, matrix: str) -> str:
    """`orch repro` as Case.repro_command writes it for a case named without an import path."""
    return f"orch repro {case_id} --matrix {matrix}"


def _check(c: dict, intern) -> list:
    row = [_round(c.get(f)) for f in CHECK_FIELDS]
    row[0], row[1] = intern(c["name"]), int(bool(c.get("passed")))
    if isinstance(row[5], bool):  # bitwise
        row[5] = int(row[5])
    while row and row[-1] in (None, ""):
        row.pop()
    return row


def pack(data: dict[str, Any]) -> dict[str, Any]:
    """page_data's dict, packed (the module docstring says how); `unpack` in dashboard.js undoes it."""
    cases = data["cases"]
    matrix = data["run"]["matrix"]
    per_key: dict[str, Counter] = {}
    for c in cases:
        for k, v in (c.get("versions") or {}).items():
            per_key.setdefault(k, Counter())[v] += 1
    common = {k: n.most_common(1)[0][0] for k, n in per_key.items()}
    strings: dict[str, int] = {}

    def intern(s: str) -> int:
        return strings.setdefault(s, len(strings))

    timing_keys = list(dict.fromkeys(k for c in cases for k in (c.get("timings") or {})))

    packed = []
    for c in cases:
        e = dict(c)
        axes = e.pop("axes")
        e["a"] = [intern(str(axes.get(k))) if k in STRING_AXES else axes.get(k) for k in AXIS_NAMES]
        if e.get("cls") == e.get("state"):
            e.pop("cls", None)
        if e.get("requested_mode") == axes.get("cudagraph_mode"):
            e.pop("requested_mode")
        if e.get("repro") == default_repro(c["id"], matrix):
            e.pop("repro")
        e.pop("speedup", None)
        if e.get("checks"):
            e["checks"] = [_check(k, intern) for k in e["checks"]]
        if e.get("timings"):
            row = [_round(e["timings"].get(k)) or None for k in timing_keys]
            while row and row[-1] is None:
                row.pop()
            e["timings"] = row
        if e.get("versions"):  # 0: the run's common versions as they are
            e["versions"] = {k: v for k, v in e["versions"].items() if common.get(k) != v} or 0
        runs = (e.get("history") or {}).get("runs", [])
        if not runs or (len(runs) == 1 and runs[0][0] == data["run"]["id"]):  # this run alone: nothing earlier
            e.pop("history", None)
        if e.get("attempts") == 1:
            e.pop("attempts")
        for f in INTERNED:
            if isinstance(e.get(f), str) and e[f]:
                e[f] = intern(e[f])
        packed.append({k: v for k, v in e.items() if not _empty(v)})
    return {
        **data,
        "cases": packed,
        "packed": {
            "axis_names": list(AXIS_NAMES),
            "check_fields": list(CHECK_FIELDS),
            "string_axes": list(STRING_AXES),
            "timing_keys": timing_keys,
            "interned": list(INTERNED),
            "strings": list(strings),
            "versions": common,
        },
    }
