"""The speed of `orch run`s side by side, as benchmarks/gpu_speed.sh collects them: a markdown table
of wall time, cases phase, GPU busy share, per-phase medians, and whether each run's verdicts equal
its baseline's.

    python benchmarks/speed_table.py NAME=DB:LOG [NAME=DB:LOG ...] [--same A,B ...] [--out table.md]

DB: the run's results store (its latest run); LOG: its `orch run` output (the `time:` line, the
`wall` line /usr/bin/time appends). --same A,B: compare A's and B's verdicts case by case
(benchmarks/diff_verdicts.py: status, and the name and outcome of every check).
Medians are over the run's passing cases that ran at least one step of their own (not every step
shared with an earlier mode of their config), in milliseconds. "rerun fresh / wider": cases that ran
out of memory on their worker's share of a GPU and ran again on a fresh worker of that share (their
worker could not give its memory back and was recycled) / on a whole GPU; "rerun tail s": how long
the run went on after the last case that was not so rerun.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from backend.harness.timing import NAMED
from backend.result import Status
from orchestrator.diff import compare
from orchestrator.executor.attempts import REFRESHED, WIDENED
from orchestrator.store import ResultStore

MEDIANS = ("total_s", *NAMED, "other_s")
CASES = re.compile(r"first to last result ([0-9.]+)s")
BUSY = re.compile(r"(GPU busy [0-9]+%[^;\n]*(?:; NVML [0-9]+%)?\))")
BUILT_S = 0.01  # a session phase longer than this built the session
WALL = re.compile(r"^wall ([0-9.]+) s", re.MULTILINE)


@functools.cache
def _run(db: str) -> tuple[int, tuple]:
    """The store's latest run id and its results, read once per store (every table below reads them)."""
    with ResultStore(db, readonly=True) as store:
        rid = store.latest_run_id()
        if rid is None:
            raise ValueError(f"{db}: no runs")
        return rid, tuple(store.results(rid))


def _latest(db: str) -> tuple:
    return _run(db)[1]


def _finished(db: str, ran) -> dict[str, float]:
    """When each case of `ran` (the latest run's) finished its last attempt (the driver's clock)."""
    rid = _run(db)[0]
    with ResultStore(db, readonly=True) as store:
        logs = {r.case_id: store.attempt_log(rid, r.case_id) for r in ran}
    return {c: log[-1]["finished_at"] for c, log in logs.items() if log}


def rerun_tail(ran, finished: dict[str, float]) -> float:
    """Seconds the run went on after its last case that was not rerun for memory had finished:
    what the reruns on a fresh or a whole GPU added at the end (a whole GPU waits for the others)."""
    rerun = {r.case_id for r in ran if REFRESHED in r.log_tail or WIDENED in r.log_tail}
    rest = [t for c, t in finished.items() if c not in rerun]
    return max(finished.values()) - max(rest) if rerun and rest else 0.0


def row(name: str, db: str, log: str) -> list[str]:
    text = ""
    if os.path.exists(log):
        with open(log, errors="replace") as f:
            text = f.read()
    results = _latest(db)
    ran = [r for r in results if r.status != Status.SKIP]
    finished = _finished(db, ran)
    passed = [r for r in ran if r.status == Status.PASS]
    cases, busy, wall = CASES.search(text), BUSY.search(text), WALL.search(text)
    # Cases that ran a step of their own: a config's later modes share the steps an earlier mode
    # ran (all of NONE's since the eager path is judged from eager's second run), and a median
    # over cases that ran nothing says little about what a case costs.
    own = [r for r in passed if r.timings.get("graph_shared_steps", 0.0) < len(r.capture_sizes_used)]
    meds = [f"{statistics.median(r.timings.get(k, 0.0) for r in own) * 1e3:.0f}" if own else "-" for k in MEDIANS]
    return [
        name,
        f"{len(ran)}",
        wall.group(1) if wall else "-",
        cases.group(1) if cases else "-",
        busy.group(1) if busy else "n/a",
        f"{len(own)} / {len(passed) - len(own)}",
        f"{sum(REFRESHED in r.log_tail for r in ran)} / {sum(WIDENED in r.log_tail for r in ran)}",
        f"{rerun_tail(ran, finished):.1f}",
        *meds,
    ]


def sums(name: str, db: str) -> list[str]:
    """Seconds summed over every case that ran, by phase: where a run's time goes, not its median;
    and how many sessions the workers built (on a GPU a case that finds its session cached spends
    microseconds in that phase, one that builds it 50 ms or more; a busy CPU blurs the two)."""
    ran = [r for r in _latest(db) if r.status != Status.SKIP]
    built = sum(r.timings.get("session_s", 0.0) > BUILT_S for r in ran)
    return [name, str(built), *(f"{sum(r.timings.get(k, 0.0) for r in ran):.2f}" for k in MEDIANS)]


def heaviest(name: str, db: str, n: int = 6) -> str:
    """The (attention, batch) groups with the most summed case time."""
    by: dict[str, float] = {}
    for r in _latest(db):
        if r.status != Status.SKIP:
            key = f"{r.axes.get('attention', '?')}/{r.axes.get('batch', '?')}"
            by[key] = by.get(key, 0.0) + r.timings.get("total_s", 0.0)
    top = sorted(by.items(), key=lambda kv: -kv[1])[:n]
    return f"- heaviest in {name}: " + ", ".join(f"{k} {v:.2f}s" for k, v in top)


def same(a: str, b: str) -> str:
    diff = compare(_latest(a), _latest(b), checks=True)
    if not diff.changes:
        return f"identical ({diff.same} cases)"
    return f"DIFFER in {len(diff.changes)} cases: " + ", ".join(c.case_id for c in diff.changes[:5])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="NAME=DB:LOG")
    ap.add_argument("--same", action="append", default=[], metavar="A,B")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    runs: dict[str, tuple[str, str]] = {}
    for spec in args.runs:
        name, _, rest = spec.partition("=")
        db, _, log = rest.partition(":")
        runs[name] = (db, log)
    head = [
        "run",
        "cases",
        "wall s",
        "cases phase s",
        "GPU busy",
        "own / shared",
        "rerun fresh / wider",
        "rerun tail s",
        *[f"{k.removesuffix('_s')} ms" for k in MEDIANS],
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, (db, log) in runs.items():
        try:
            lines.append("| " + " | ".join(row(name, db, log)) + " |")
        except Exception as e:
            lines.append(f"| {name} | {type(e).__name__}: {e} |")
    lines.append("")
    sum_head = ["run (s summed over cases)", "sessions built", *[k.removesuffix("_s") for k in MEDIANS]]
    lines += ["| " + " | ".join(sum_head) + " |", "|" + "---|" * len(sum_head)]
    for name, (db, _log) in runs.items():
        try:
            lines.append("| " + " | ".join(sums(name, db)) + " |")
        except Exception as e:
            lines.append(f"| {name} | {type(e).__name__}: {e} |")
    lines.append("")
    for name, (db, _log) in runs.items():
        try:
            lines.append(heaviest(name, db))
        except Exception as e:
            lines.append(f"- heaviest in {name}: {type(e).__name__}: {e}")
    lines.append("")
    for pair in args.same:
        a, _, b = pair.partition(",")
        try:
            lines.append(f"- verdicts {a} vs {b}: {same(runs[a][0], runs[b][0])}")
        except Exception as e:
            lines.append(f"- verdicts {a} vs {b}: not compared ({type(e).__name__}: {e})")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
