"""The end-of-run artifacts of `orch run`: JUnit XML, the markdown summary, the static dashboard,
all from one `outputs.gather` (so they agree with `orch report` and `orch gate`).

Each names its run (summary heading, JUnit `run_id`/`run_status` properties, dashboard header) and
says INTERRUPTED when the run did not finish. Before any case runs, a run checks that every
folder it will write takes a file (`check_writable`: a read-only --out fails then, not after the
work) and clears the artifacts it will write (`clear`): whatever stops it later (Ctrl-C, SIGTERM,
SIGKILL), an earlier run's green summary is never left in OUT looking current. `held_run` reads
back which run a folder's outputs name, so commands writing there default to that run.
"""

from __future__ import annotations

import html
import os
import re
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from orchestrator import gate_notes, junit, summary
from orchestrator.dashboard.build import write_dashboard
from orchestrator.errors import InfraError, OrchError
from orchestrator.gate import GateOutcome
from orchestrator.judging import Judging
from orchestrator.outputs import RunView, gather
from orchestrator.store import ResultStore


@dataclass(frozen=True)
class OutputPaths:
    out_dir: str
    junit: str
    summary: str
    dashboard_dir: str

    @property
    def files(self) -> tuple[str, ...]:
        return (self.junit, self.summary, os.path.join(self.dashboard_dir, "index.html"))


def output_paths(out_dir: str, junit_path: str | None = None, summary_path: str | None = None) -> OutputPaths:
    return OutputPaths(
        out_dir,
        junit_path or os.path.join(out_dir, "junit.xml"),
        summary_path or os.path.join(out_dir, "summary.md"),
        os.path.join(out_dir, "dashboard"),
    )


def check_writable(paths: OutputPaths) -> None:
    """Every folder the outputs go to exists (created if need be) and takes a new file; else
    InfraError (exit 3) naming it. Called before the first case runs."""
    folders = [paths.out_dir, paths.dashboard_dir] + [
        os.path.dirname(os.path.abspath(p)) for p in (paths.junit, paths.summary)
    ]
    for folder in dict.fromkeys(os.path.abspath(f) for f in folders):
        try:
            os.makedirs(folder, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".orch-probe-", dir=folder)
            os.close(fd)
            os.remove(probe)
        except OSError as e:
            raise InfraError(f"cannot write outputs: {e.strerror}", source=folder) from None


def clear(paths: OutputPaths) -> list[str]:
    """Remove the artifacts an earlier run left where this run will write; returns what went."""
    gone = []
    for path in paths.files:
        for p in (path, path + ".tmp"):
            try:
                os.remove(p)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise InfraError(f"cannot remove an earlier run's output: {e.strerror}", source=p) from None
            gone.append(p)
    return gone


def write_view(store: ResultStore, view: RunView, paths: OutputPaths, extra: str = "") -> None:
    """JUnit XML, markdown summary (+ $GITHUB_STEP_SUMMARY), dashboard for a gathered run.
    `extra`: markdown the summary ends with (`orch run`: the GPUs' busy share)."""
    try:
        os.makedirs(paths.out_dir, exist_ok=True)
        for p in (paths.junit, paths.summary):
            os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
        junit.write(
            paths.junit,
            view.results,
            view.gate,
            suite_name=view.run.matrix,
            run_id=view.run.id,
            run_status=view.run.status,
            planned=view.planned,
        )
        summary.write(
            paths.summary, summary.render(view.run, view.results, view.gate) + gate_notes.markdown(view) + extra
        )
        write_dashboard(store, view, paths.dashboard_dir)
    except OSError as e:
        raise InfraError(f"cannot write outputs: {e.strerror}", source=e.filename or paths.out_dir) from None


# The dashboard's header names its run: <span id="run-id">N</span> <small id="run-matrix">M</small>.
_DASHBOARD_RUN = re.compile(r'<span id="run-id">(\d+)</span>\s*<small id="run-matrix">([^<]*)</small>')


def named_run(folder: str) -> tuple[int, str] | None:
    """(run id, matrix) that the outputs in `folder` name: its junit.xml's `run_id` property and
    suite name, else its dashboard's header (folder/index.html, folder/dashboard/index.html)."""
    junit_path = os.path.join(folder, "junit.xml")
    try:
        for suite in ET.parse(junit_path).getroot().iter("testsuite"):
            for prop in suite.iter("property"):
                if prop.get("name") == "run_id" and (prop.get("value") or "").isdigit():
                    return int(prop.get("value") or 0), suite.get("name") or ""
    except (OSError, ET.ParseError):
        pass
    for page in (os.path.join(folder, "index.html"), os.path.join(folder, "dashboard", "index.html")):
        try:
            with open(page, encoding="utf-8") as f:
                m = _DASHBOARD_RUN.search(f.read(200_000))
        except (OSError, UnicodeDecodeError):
            continue
        if m:
            return int(m.group(1)), html.unescape(m.group(2))
    return None


def held_run(store: ResultStore, folder: str) -> int | None:
    """The run of `store` whose outputs `folder` holds (None: none, or outputs of a run this store
    does not have: another store's run of the same id has another matrix)."""
    named = named_run(folder)
    if named is None:
        return None
    run_id, matrix = named
    try:
        run = store.run(run_id)
    except OrchError:
        return None
    return run.id if os.path.normpath(run.matrix) == os.path.normpath(matrix) else None


def write_outputs(
    store: ResultStore,
    run_id: int,
    *,
    out_dir: str,
    junit_path: str | None = None,
    summary_path: str | None = None,
    baseline: str | None = None,
    known_failures: str | None = None,
) -> GateOutcome:
    """End of `orch run`: gate, JUnit XML, markdown summary (+ $GITHUB_STEP_SUMMARY), dashboard."""
    view = gather(store, run_id, Judging(baseline=baseline, known_failures=known_failures))
    write_view(store, view, output_paths(out_dir, junit_path, summary_path))
    return view.gate
