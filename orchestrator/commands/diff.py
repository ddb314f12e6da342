"""`orch diff RUN_A RUN_B`: the verdicts that changed, by transition and by axis, and both runs'
versions side by side (a new torch/vLLM/aiter against the pinned ones on the same commit).

The runs may live in two stores (a SQLite file and a PostgreSQL database, two files): each
reference is resolved on its own (orchestrator/store/refs.py). Exit 1 when a case regressed (it
passed, or was flaky, in RUN_A and fails in RUN_B), else 0; a bad reference is exit 2.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter

import click

from orchestrator import defaults, digest
from orchestrator import diff as d
from orchestrator.errors import ExitCode
from orchestrator.store import ResultStore, RunInfo
from orchestrator.store.refs import open_store, parse_ref, select_run

SHOWN = 25  # changed cases listed per transition with -v
GLOBS = 6  # globs shown per transition before "and N more" (-v: every glob)


def _worker_versions(results) -> dict[str, str]:
    """The versions the cases ran with (the workers'), the most common per package."""
    seen: dict[str, Counter] = {}
    for r in results:
        for k, v in r.versions.items():
            seen.setdefault(k, Counter())[str(v)] += 1
    return {k: c.most_common(1)[0][0] for k, c in seen.items()}


def _head(tag: str, run: RunInfo, where: str) -> str:
    label = f"  [{run.label}]" if run.label else ""
    return (
        f"{tag}: run {run.id} of {where}{label}  {run.matrix}  {run.status}  git {run.git_sha[:12] or 'not a checkout'}  "
        f"{run.device_model or run.devices or '?'}"
    )


def main(
    run_a: str, run_b: str, db: str | None = None, checks: bool = False, as_json: bool = False, verbose: bool = False
) -> int:
    db = db or defaults.db()
    refs = [parse_ref(run_a), parse_ref(run_b)]
    with contextlib.ExitStack() as stack:
        default = None
        if any(r.store is None for r in refs):
            default = stack.enter_context(ResultStore(db, readonly=True))
        sides = []
        for ref in refs:
            store = stack.enter_context(open_store(ref, default))
            run = select_run(store, ref.selector)
            sides.append((store.path, run, store.results(run.id)))
    (where_a, a, res_a), (where_b, b, res_b) = sides
    diff = d.compare(res_a, res_b, checks=checks)
    versions = d.versions_side_by_side(
        {**a.versions, **_worker_versions(res_a)}, {**b.versions, **_worker_versions(res_b)}
    )
    groups = diff.transitions()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "a": {**a.to_dict(), "store": where_a},
                    "b": {**b.to_dict(), "store": where_b},
                    "versions": {k: {"a": va, "b": vb} for k, va, vb, _ in versions},
                    "cases_a": diff.cases_before,
                    "cases_b": diff.cases_after,
                    "same": diff.same,
                    "regressions": list(diff.regressions),
                    "transitions": {t: [c.case_id for c in cs] for t, cs in groups.items()},
                },
                indent=1,
                sort_keys=True,
                default=str,
            )
        )
        return ExitCode.GATE_FAILED if diff.regressions else ExitCode.OK
    out = [_head("A", a, where_a), _head("B", b, where_b), "versions (A | B, * differs):"]
    width = max((len(k) for k, *_ in versions), default=0)
    out += [f"  {k:<{width}}  {va or '-'} | {vb or '-'}{'  *' if differs else ''}" for k, va, vb, differs in versions]
    out.append(
        f"{len(diff.regressions)} regressed, {len(diff.changes)} changed, {diff.same} the same "
        f"({diff.cases_before} cases in A, {diff.cases_after} in B)"
    )
    for t, changes in groups.items():
        globs = d.describe(changes, res_b, res_a)
        out.append(f"{t}  {len(changes)}: {', '.join(globs) if verbose else digest.sample(globs, GLOBS)}")
        counts = d.axis_counts(changes, res_b if changes[0].after else res_a)
        if counts:
            out.append(
                "    by axis: "
                + "; ".join(
                    f"{axis} " + ", ".join(f"{v} {n}" for v, n in sorted(c.items())) for axis, c in counts.items()
                )
            )
        if verbose:
            ids = [c.case_id for c in changes]
            out += [f"    {cid}" for cid in ids[:SHOWN]] + (
                [f"    ... and {len(ids) - SHOWN} more"] if len(ids) > SHOWN else []
            )
    if diff.regressions:  # the verdict, worded as the gate words its own
        out.append(
            f"diff FAILED: {len(diff.regressions)} case(s) regressed from run {a.id} to run {b.id}: "
            f"{digest.sample(diff.regressions)}"
        )
    else:
        out.append(f"diff PASSED: no case regressed from run {a.id} to run {b.id}")
    click.echo("\n".join(out))
    return ExitCode.GATE_FAILED if diff.regressions else ExitCode.OK
