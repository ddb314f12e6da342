"""`orch repro CASE_ID`: re-run one case in this process (tp > 1: a local gang) and print its verdict.

The case comes from --matrix (expanded on this device class, with --backend overriding the
backend axis) or, without --matrix, from the plan of the latest run in --db that has it (--run: of
that run, an id or a label).
Output: the verdict line `orch run` prints for a case (`STATUS case_id: reason`), the mode line
and one line per check; --json prints CaseResult.to_dict() instead.

Exit codes: 0 pass or skip, 1 fail, error, timeout or flaky (a repro exists to show a problem:
anything that is not a clean pass or an honest skip is one), 2 unknown case id / bad input.
"""

from __future__ import annotations

import difflib
import json
import os

import click

from backend.case import Case
from backend.result import CaseResult, Status
from orchestrator import defaults
from orchestrator.errors import ExitCode, InputError


def verdict_line(result: CaseResult) -> str:
    """The per-case line, as `orch run` prints it."""
    line = f"{result.status.value.upper()} {result.case_id}"
    return f"{line}: {result.reason}" if result.reason else line


def _suggest(case_id: str, known: list[str]) -> str:
    close = difflib.get_close_matches(case_id, known, n=3, cutoff=0.5)
    return f" (did you mean: {', '.join(close)}?)" if close else ""


def _from_matrix(case_id: str, matrix: str, devices: str, backend: str | None) -> Case | CaseResult:
    from orchestrator.matrix import SkippedCase, load_matrix

    m = load_matrix(matrix, devices=devices, backend_override=backend)
    found = m.find(case_id)
    if found is None:
        known = [c.case_id for c in m.cases] + [s.case.case_id for s in m.skipped]
        raise InputError(f"no case {case_id!r} in {matrix}{_suggest(case_id, known)}")
    if isinstance(found, SkippedCase):
        c = found.case
        return CaseResult(
            case_id=c.case_id,
            status=Status.SKIP,
            reason=found.reason,
            requested_mode=c.mode,
            repro=c.repro_command(),
            axes=c.axes,
        )
    return found


def _from_store(case_id: str, db: str, run_ref: str | None = None) -> Case:
    """The case as the latest run that planned it planned it (`run_ref`: that run, an id or a label)."""
    from orchestrator.outputs import pick_run
    from orchestrator.store import ResultStore
    from orchestrator.store.location import is_postgres_url

    if not is_postgres_url(db) and not os.path.exists(db):
        raise InputError(f"give --matrix (no results database at {db} to look the case up in)")
    with ResultStore(db, readonly=True) as store:
        where = store.path  # a URL without its password
        known: list[str] = []
        runs = [store.run(pick_run(store, run_ref))] if run_ref is not None else list(reversed(store.runs()))
        if run_ref is not None:
            where = f"run {runs[0].id} of {where}"
        for run in runs:
            planned = store.planned_cases(run.id)
            for c in planned:
                if c.case_id == case_id:
                    return c
            known += [c.case_id for c in planned]
    raise InputError(f"no case {case_id!r} in {where}{_suggest(case_id, sorted(set(known)))}; give --matrix")


def main(
    case_id: str,
    matrix: str | None = None,
    backend: str | None = None,
    db: str | None = None,
    devices: str = "auto",
    as_json: bool = False,
    run_id: str | None = None,
) -> int:
    import torch

    from backend.harness.checker import run_case_local

    if matrix and run_id is not None:
        raise InputError("give --matrix or --run, not both (--run looks the case up in that run's plan)")
    found = (
        _from_matrix(case_id, matrix, devices, backend) if matrix else _from_store(case_id, db or defaults.db(), run_id)
    )
    if isinstance(found, CaseResult):
        result = found
    else:
        case = found
        if backend and not matrix:
            import dataclasses

            case = dataclasses.replace(case, backend=backend)
        if devices == "gpu" and not torch.cuda.is_available():
            raise InputError("--devices gpu: no CUDA/HIP device here")
        device = torch.device("cpu") if devices == "cpu" or not torch.cuda.is_available() else torch.device("cuda", 0)
        result = run_case_local(case, device=device)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str))
    else:
        click.echo(verdict_line(result))
        if result.resolved_mode:
            mode = f"mode {result.requested_mode}"
            if result.downgraded:
                mode += f" -> {result.resolved_mode} (downgraded)"
            sizes = ", ".join(str(s) for s in result.capture_sizes_used)  # none when the case failed to capture
            click.echo(
                f"  {mode}, graph {result.graph_kind}, provider {result.provider}, device {result.device}"
                + (f", capture sizes per step {sizes} (0 = eager)" if sizes else "")
            )
        for check in result.checks:
            click.echo(f"  {check.summary()}")
        if result.status == Status.ERROR and result.log_tail:
            click.echo("  log tail:\n" + "\n".join("    " + ln for ln in result.log_tail.strip().splitlines()[-15:]))
        if result.repro:
            click.echo(f"  repro: {result.repro}")
    return int(ExitCode.OK if result.status in (Status.PASS, Status.SKIP) else ExitCode.GATE_FAILED)
