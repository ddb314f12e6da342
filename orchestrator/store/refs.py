"""Naming a run: `--baseline` and `orch diff` take the same references.

    7                    run 7 of --db
    main                 a label: the latest finished run labelled main (of --db)
    other.db             another SQLite store: its latest run
    other.db#7           run 7 there (also other.db#main, other.db#latest)
    postgresql://u@h/db#7  the same for a PostgreSQL store (no '#': its latest run)

A baseline given by label is the latest run with that label that finished before the gated run
started, of the same matrix, on the same device model when the gated run's is known: what was known
of main when this run began, so `orch gate` later gives the verdict `orch run` gave. None found is
not an error (the first run of a label has no history): the gate runs without a baseline and says so.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from backend.result import CaseResult
from orchestrator.errors import InputError
from orchestrator.store.api import ResultStore, RunInfo
from orchestrator.store.location import is_postgres_url, mask

# A reference ending so names a store even when the file is missing (an error, not a label).
STORE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


@dataclass(frozen=True)
class RunRef:
    store: str | None  # another store (path or URL), None: the default one
    selector: str  # a run id, "latest" or a label

    @property
    def run_id(self) -> int | None:
        return int(self.selector) if self.selector.isdigit() else None


def parse_ref(spec: str) -> RunRef:
    spec = str(spec).strip()
    if not spec:
        raise InputError("empty run reference (give a run id, a label, a store, or STORE#RUN)")
    if "#" in spec:
        store, _, sel = spec.rpartition("#")
        return RunRef(store or None, sel.strip() or "latest")
    if spec.isdigit():
        return RunRef(None, spec)
    if is_postgres_url(spec) or os.path.isfile(spec) or spec.endswith(STORE_SUFFIXES):
        return RunRef(spec, "latest")
    return RunRef(None, spec)  # a label: branch names such as release/1.2 are labels too


def same_matrix(a: RunInfo, b: RunInfo) -> bool:
    return os.path.normpath(a.matrix) == os.path.normpath(b.matrix) or (
        bool(a.matrix_sha) and a.matrix_sha == b.matrix_sha
    )


@contextlib.contextmanager
def open_store(ref: RunRef, default: ResultStore | None) -> Iterator[ResultStore]:
    """The store a reference names: `default` (left open) or another one (opened read-only)."""
    if ref.store is None:
        if default is None:
            raise InputError(f"run {ref.selector!r} names no store: give STORE#{ref.selector}")
        yield default
        return
    if not is_postgres_url(ref.store) and not os.path.isfile(ref.store):
        raise InputError("no results database here", source=mask(ref.store))
    with ResultStore(ref.store, readonly=True) as other:
        yield other


def select_run(store: ResultStore, selector: str) -> RunInfo:
    """A run of `store` by id, `latest`, or label (its latest finished run)."""
    if selector.isdigit():
        return store.run(int(selector))
    if selector == "latest":
        latest = store.latest_run_id()
        if latest is None:
            raise InputError("no runs in this database yet", source=store.path)
        return store.run(latest)
    found = store.labelled_runs(selector)
    if not found:
        raise InputError(f"no finished run labelled {selector!r} in this database", source=store.path)
    return found[0]


@dataclass(frozen=True)
class Baseline:
    results: tuple[CaseResult, ...] | None  # None: no baseline (none asked, or none found by label)
    run: RunInfo | None = None
    where: str = ""  # "run 3", "run 3 of other.db"
    note: str = ""  # why a label found nothing: the outputs say the gate ran without a baseline


def find_baseline(spec: str | None, store: ResultStore, current_run: int) -> Baseline:
    """`--baseline` for run `current_run` of `store` (-1: the run does not exist yet; a label is
    then only parsed, as it cannot be looked up before the run has a matrix and a start time)."""
    if spec is None or str(spec).strip() == "":
        return Baseline(None)
    ref = parse_ref(spec)
    if ref.store is None and ref.run_id is not None:
        if ref.run_id == current_run:
            raise InputError(f"--baseline {ref.run_id} is the run being gated; give an earlier run")
        run = store.run(ref.run_id)  # raises InputError if absent
        return Baseline(tuple(store.results(run.id)), run, f"run {run.id}")
    with open_store(ref, store) as other:
        if other is not store and other.same_database(store) and ref.selector == "latest":
            raise InputError(
                "--baseline is the same database as --db; give a run id or a label instead", source=mask(str(ref.store))
            )
        where = "" if other is store else f" of {other.path}"
        if ref.run_id is not None or ref.selector == "latest":
            run = select_run(other, ref.selector)
            if other is store and run.id == current_run:
                raise InputError(f"--baseline {spec} is the run being gated; give an earlier run")
            return Baseline(tuple(other.results(run.id)), run, f"run {run.id}{where}")
        if current_run < 0:
            return Baseline(None)
        current = store.run(current_run)
        label = ref.selector
        found = history_runs(other, current, label, 1, same_store=other is store)
        if not found:
            on = f" on {current.device_model}" if current.device_model else ""
            return Baseline(
                None,
                note=f"no baseline: no run labelled {label!r}{where} of {current.matrix}{on} "
                f"finished before run {current.id} started; gated without one",
            )
        run = found[0]
        return Baseline(tuple(other.results(run.id)), run, f"run {run.id}{where} (latest labelled {label!r})")


def history_runs(
    store: ResultStore, current: RunInfo, label: str, limit: int, *, same_store: bool = True
) -> list[RunInfo]:
    """The runs of `label` a run is judged against, latest first: finished before `current`
    started, of its matrix, on its device model when known (an H100 run is not gated by MI300X
    history). The baseline is the first; the flakiness window (flakiness.py) is all of them."""
    candidates = store.labelled_runs(
        label, limit=max(100, 5 * limit), before=current.started_at, exclude=current.id if same_store else None
    )
    found = [
        r
        for r in candidates
        if same_matrix(r, current) and (not current.device_model or r.device_model in ("", current.device_model))
    ]
    return found[:limit]


def label_of(spec: str | None) -> str | None:
    """The label a `--baseline` names in --db (None: it names a run id or another store)."""
    if spec is None or not str(spec).strip():
        return None
    ref = parse_ref(spec)
    return ref.selector if ref.store is None and ref.run_id is None and ref.selector != "latest" else None


def resolve_baseline(spec: str | None, store: ResultStore, current_run: int) -> list[CaseResult] | None:
    """`--baseline` as results (None: no baseline). See find_baseline."""
    found = find_baseline(spec, store, current_run)
    return list(found.results) if found.results is not None else None
