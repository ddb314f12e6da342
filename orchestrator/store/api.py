"""The results store: one SQLite file (the embedded default) or one PostgreSQL database (shared by
many drivers and clusters), written by drivers, read by everything else.

Every result is committed before it is reported (results that arrive together share one
transaction: group commit), so a killed driver loses nothing it reported, and `orch run --resume
RUN` re-runs every case without a final verdict (a first attempt awaiting its retry is stored with
final = 0). Any number of drivers write one database; each run has one writer (lock.py). Database
errors never escape: a file or database that is not ours, or one written by a newer orch, is an
InputError (the user points us at the wrong place; we never overwrite it); a location we cannot
create, reach or write is an InfraError. Statements are written once, in sqlite's `?` style, and
run on both (the adapters: sqlite_db.py, postgres_db.py).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from backend.case import Case
from backend.result import CaseResult
from orchestrator.errors import InputError
from orchestrator.store import lock
from orchestrator.store.location import Location, mask, mask_argv, parse
from orchestrator.store.options import NewRun, RunOptions
from orchestrator.store.rows import RunInfo as RunInfo  # re-exported
from orchestrator.store.rows import device_model as device_model  # re-exported
from orchestrator.store.rows import file_sha as file_sha  # re-exported
from orchestrator.store.rows import result_from_row, run_from_row
from orchestrator.store.schema import _RESULT_COLS, MIGRATIONS, SCHEMA_VERSION

APP_ID = "orch-results"  # meta.app: tells our databases from any other


def _git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _open(location: Location, readonly: bool):
    if location.is_postgres:
        from orchestrator.store.postgres_db import PostgresDB

        return PostgresDB(location, readonly)
    from orchestrator.store.sqlite_db import SqliteDB

    return SqliteDB(location, readonly)


class ResultStore:
    """One connection to a results store. Not thread-safe: one store per thread.

    `path`: a SQLite file or a postgresql:// URL; `self.path` is what messages may show (a URL
    without its password)."""

    def __init__(self, path: str, *, readonly: bool = False):
        self.location = parse(str(path))
        self.path = self.location.display
        self.readonly = readonly
        self._db = _open(self.location, readonly)
        self._locked: set[int] = set()  # runs whose writer lock this store holds
        try:
            self._check_and_migrate()
        except BaseException:
            self._db.close()
            raise

    @property
    def kind(self) -> str:
        return self._db.kind

    # -- connection and schema ---------------------------------------------------------------

    def _sql(self, sql: str, params: Sequence[Any] = ()) -> Any:
        try:
            return self._db.execute(sql, params)
        except self._db.errors as e:
            raise self._db.domain_error(e) from None

    def _meta_version(self, tables: set[str]) -> int:
        if not tables:
            return 0
        if "meta" not in tables:
            raise InputError("not an orch results database (refusing to touch it)", source=self.path)
        meta = {r["key"]: r["value"] for r in self._sql("SELECT key, value FROM meta")}
        if meta.get("app") != APP_ID:
            raise InputError("not an orch results database (refusing to touch it)", source=self.path)
        try:
            return int(meta.get("schema_version", ""))
        except ValueError:
            raise InputError("bad schema_version in meta table", source=self.path) from None

    def _check_and_migrate(self) -> None:
        try:
            tables = self._db.tables()
        except self._db.errors as e:
            raise self._db.domain_error(e) from None
        if not tables and self.readonly:
            raise InputError("empty results database (no runs yet)", source=self.path)
        version = self._meta_version(tables)
        if version > SCHEMA_VERSION:
            raise InputError(
                f"results database has schema version {version}, this orch reads up to {SCHEMA_VERSION}: "
                "upgrade orch or use another --db",
                source=self.path,
            )
        if self.readonly:
            if version < SCHEMA_VERSION:  # readable, but our queries need the new tables
                raise InputError(
                    f"results database has old schema version {version}: open it once with write access to migrate",
                    source=self.path,
                )
            return
        try:
            self._db.configure_writer()
        except self._db.errors as e:
            raise self._db.domain_error(e) from None
        while version < SCHEMA_VERSION:
            version = self._migrate_one()

    def _migrate_one(self) -> int:
        """One migration step in one transaction, the version re-read under the write lock: two
        drivers opening a fresh (or old) database at once migrate it once."""
        try:
            with self._db.transaction():
                self._db.migration_lock()
                version = self._meta_version(self._db.tables())
                if version >= SCHEMA_VERSION:
                    return version
                self._db.run_statements(MIGRATIONS[version])
                upsert = (
                    "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
                )
                self._db.execute(upsert, ("app", APP_ID))
                self._db.execute(upsert, ("schema_version", str(version + 1)))
            return version + 1
        except self._db.errors as e:
            raise self._db.domain_error(e) from None

    def schema_version(self) -> int:
        return int(self._sql("SELECT value FROM meta WHERE key='schema_version'").fetchone()["value"])

    def _write(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Run statements in one transaction and commit: durable when this returns. Ctrl-C or
        SIGTERM mid-transaction rolls it back (the driver still closes the run)."""
        try:
            with self._db.transaction():
                for sql, params in statements:
                    self._db.execute(sql, params)
        except self._db.errors as e:
            raise self._db.domain_error(e) from None

    # -- writing (the driver) ----------------------------------------------------------------

    def create_run(self, run: NewRun, *, lock_writer: bool = False) -> int:
        """A new run with its planned cases, in one transaction. lock_writer: this store becomes
        the run's writer in the same transaction (`orch run`; release_writer at its end)."""
        matrix, cases, cluster, devices, versions, baseline, label, options = (
            run.matrix,
            run.cases,
            run.cluster,
            run.devices,
            run.versions,
            run.baseline,
            run.label,
            run.options,
        )
        est = self.durations()
        argv = mask_argv(list(run.argv))
        locked_id = None
        try:
            with self._db.transaction():
                row = self._db.execute(
                    "INSERT INTO runs(matrix, matrix_sha, git_sha, started_at, status, cluster, devices, versions, argv,"
                    " baseline, label, options) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    (
                        matrix,
                        file_sha(matrix),
                        _git_sha(),
                        time.time(),
                        cluster,
                        devices,
                        json.dumps(versions or {}, sort_keys=True),
                        json.dumps(argv),
                        mask(baseline) if baseline is not None else None,
                        label or "",
                        (options or RunOptions()).to_json(),
                    ),
                ).fetchone()
                run_id = int(row["id"])
                self._db.executemany(
                    'INSERT INTO cases(run_id, case_id, axes, "case", est_s, pos) VALUES (?, ?, ?, ?, ?, ?)',
                    [
                        (
                            run_id,
                            c.case_id,
                            json.dumps(c.axes, sort_keys=True),
                            json.dumps(c.to_dict()),
                            est.get(c.case_id),
                            i,
                        )
                        for i, c in enumerate(cases, 1)
                    ],
                )
                if lock_writer:
                    if not self._db.lock_run(run_id):  # a fresh id: only a foreign session could hold it
                        raise lock.WriterBusy(f"run {run_id} is locked by another session", source=self.path)
                    locked_id = run_id
                    self._db.execute(*lock.row_statement(run_id, argv))
        except self._db.integrity_errors as e:
            self._unlock_quietly(locked_id)
            raise InputError(f"duplicate case ids in the run: {e}", source=matrix) from None
        except self._db.errors as e:
            self._unlock_quietly(locked_id)
            raise self._db.domain_error(e) from None
        except BaseException:
            self._unlock_quietly(locked_id)
            raise
        if locked_id is not None:
            self._locked.add(locked_id)
        return run_id

    def _unlock_quietly(self, run_id: int | None) -> None:
        if run_id is not None:
            try:
                self._db.unlock_run(run_id)
            except self._db.errors:
                pass

    # -- the per-run writer lock -------------------------------------------------------------

    def acquire_writer(self, run_id: int, argv: Sequence[str] = ()) -> str:
        """Become run_id's writer (lock.py) or raise WriterBusy; returns a note when a dead
        driver's lock was taken over, else ''."""
        if run_id in self._locked:
            return ""
        try:
            note = lock.acquire(self._db, run_id, argv)
        except self._db.errors as e:
            raise self._db.domain_error(e) from None
        self._locked.add(run_id)
        return note

    def release_writer(self, run_id: int) -> None:
        try:
            lock.release(self._db, run_id)
        except self._db.errors as e:
            raise self._db.domain_error(e) from None
        self._locked.discard(run_id)

    def writer_of(self, run_id: int) -> dict[str, Any] | None:
        r = self._sql("SELECT pid, host, since, argv FROM run_writer WHERE run_id = ?", (int(run_id),)).fetchone()
        return dict(r) if r is not None else None

    def record(self, run_id: int, result: CaseResult, final: bool = True) -> None:
        self.record_many(run_id, [(result, final)])

    def record_many(self, run_id: int, items: Sequence[tuple[CaseResult, bool]]) -> None:
        """Commit results in one transaction (group commit): durable when this returns. `final`
        False marks a first attempt whose retry is pending (resume re-runs such a case)."""
        if not items:
            return
        statements = []
        for result, final in items:
            statements += self._record_statements(run_id, result, final)
        self._write(statements)

    _UPSERT = (
        f"INSERT INTO results({', '.join(_RESULT_COLS)}) VALUES ({', '.join('?' * len(_RESULT_COLS))})"
        " ON CONFLICT(run_id, case_id) DO UPDATE SET "
        + ", ".join(f"{c} = excluded.{c}" for c in _RESULT_COLS if c not in ("run_id", "case_id"))
    )

    def _record_statements(self, run_id: int, result: CaseResult, final: bool) -> list[tuple[str, Sequence[Any]]]:
        now = time.time()
        row = (
            run_id, result.case_id, result.status.value, result.reason,
            json.dumps([dataclasses.asdict(c) for c in result.checks]),
            result.requested_mode, result.resolved_mode, int(result.downgraded), result.graph_kind, result.provider,
            json.dumps(list(result.capture_sizes_used)), result.error_kind, json.dumps(result.timings),
            result.device, json.dumps(result.versions, sort_keys=True), result.log_tail, result.repro,
            result.attempts, result.worker, json.dumps(result.axes, sort_keys=True, default=str), now, int(final),
            json.dumps(result.memory, sort_keys=True),
        )  # fmt: skip # the row in the table's column order
        return [
            (self._UPSERT, row),
            (
                "INSERT INTO attempt_log(run_id, case_id, attempt, status, reason, worker, device, finished_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    result.case_id,
                    result.attempts,
                    result.status.value,
                    result.reason,
                    result.worker,
                    result.device,
                    now,
                ),
            ),
        ]

    def finish_run(self, run_id: int, status: str) -> None:
        """Close the run, with the device model most of its cases ran on (the dashboard and
        `--baseline LABEL` split history by it)."""
        rows = self._sql("SELECT device FROM results WHERE run_id = ? AND status != 'skip' AND device != ''", (run_id,))
        models = Counter(device_model(r["device"]) for r in rows)
        model = models.most_common(1)[0][0] if models else ""
        self._write(
            [
                (
                    "UPDATE runs SET status = ?, finished_at = ?, device_model = ? WHERE id = ?",
                    (status, time.time(), model, run_id),
                )
            ]
        )

    # -- reading -----------------------------------------------------------------------------

    _RUN_SELECT = (
        "SELECT runs.*, (SELECT count(*) FROM cases WHERE cases.run_id = runs.id) AS num_cases,"
        " (SELECT count(*) FROM results WHERE results.run_id = runs.id AND final = 1) AS num_results FROM runs"
    )

    def run(self, run_id: int) -> RunInfo:
        r = self._sql(self._RUN_SELECT + " WHERE id = ?", (int(run_id),)).fetchone()
        if r is None:
            raise InputError(f"no run {run_id} in this database", source=self.path)
        return run_from_row(r)

    def latest_run_id(self) -> int | None:
        r = self._sql("SELECT max(id) AS id FROM runs").fetchone()
        return None if r["id"] is None else int(r["id"])

    def runs(self) -> list[RunInfo]:
        return [run_from_row(r) for r in self._sql(self._RUN_SELECT + " ORDER BY id")]

    def labelled_runs(
        self, label: str, *, limit: int = 1, before: float | None = None, exclude: int | None = None
    ) -> list[RunInfo]:
        """Finished runs with this label, the latest finished first; `before`: finished before
        that time (a run's baseline is what was known when it started, so it never changes)."""
        sql = self._RUN_SELECT + " WHERE label = ? AND status = 'finished'"
        params: list[Any] = [label]
        if before is not None:
            sql += " AND finished_at < ?"
            params.append(before)
        if exclude is not None:
            sql += " AND id != ?"
            params.append(int(exclude))
        sql += " ORDER BY finished_at DESC, id DESC LIMIT ?"
        params.append(int(limit))
        return [run_from_row(r) for r in self._sql(sql, params)]

    def labels(self, run_ids: Sequence[int]) -> dict[int, str]:
        """run id -> label, for these runs (a shared store may hold thousands: not all of them)."""
        ids = sorted({int(i) for i in run_ids})
        if not ids:
            return {}
        rows = self._sql(f"SELECT id, label FROM runs WHERE id IN ({', '.join('?' * len(ids))})", ids)
        return {int(r["id"]): r["label"] for r in rows}

    def planned_cases(self, run_id: int) -> list[Case]:
        rows = self._sql('SELECT "case" FROM cases WHERE run_id = ? ORDER BY pos', (run_id,))
        return [Case.from_dict(json.loads(r["case"])) for r in rows]

    def results(self, run_id: int) -> list[CaseResult]:
        rows = self._sql("SELECT * FROM results WHERE run_id = ? ORDER BY case_id", (run_id,))
        return [result_from_row(r) for r in rows]

    def missing_case_ids(self, run_id: int) -> list[str]:
        rows = self._sql(
            "SELECT case_id FROM cases WHERE run_id = ? AND case_id NOT IN"
            " (SELECT case_id FROM results WHERE run_id = ? AND final = 1) ORDER BY pos",
            (run_id, run_id),
        )
        return [r["case_id"] for r in rows]

    def attempt_log(self, run_id: int, case_id: str) -> list[dict[str, Any]]:
        rows = self._sql(
            "SELECT attempt, status, reason, worker, device, finished_at FROM attempt_log"
            " WHERE run_id = ? AND case_id = ? ORDER BY finished_at, attempt",
            (run_id, case_id),
        )
        return [dict(r) for r in rows]

    def history(self, case_id: str, limit: int = 20) -> list[tuple[int, CaseResult]]:
        """Newest first: (run id, last result of the case in that run)."""
        rows = self._sql("SELECT * FROM results WHERE case_id = ? ORDER BY run_id DESC LIMIT ?", (case_id, int(limit)))
        return [(int(r["run_id"]), result_from_row(r)) for r in rows]

    def status_history(
        self, limit_runs: int = 20, run_ids: Sequence[int] | None = None
    ) -> dict[str, list[tuple[int, str, str]]]:
        """case_id -> [(run id, status, device model)], newest first (one query): over the last
        `limit_runs` runs, or over `run_ids`."""
        if run_ids is not None:
            if not run_ids:
                return {}
            ids = [int(i) for i in run_ids]
            where, params = f"run_id IN ({', '.join('?' * len(ids))})", ids
        else:
            where, params = "run_id IN (SELECT id FROM runs ORDER BY id DESC LIMIT ?)", [int(limit_runs)]
        rows = self._sql(
            f"SELECT case_id, run_id, status, device FROM results WHERE {where} ORDER BY run_id DESC", params
        )
        out: dict[str, list[tuple[int, str, str]]] = {}
        for r in rows:
            out.setdefault(r["case_id"], []).append((int(r["run_id"]), r["status"], device_model(r["device"])))
        return out

    def durations(self) -> dict[str, float]:
        """case_id -> total_s of its most recent result that ran (not a skip): the cost model's history.
        Timeouts are included on purpose: a case that hit its deadline will cost that much again."""
        t = self._db.json_number("timings", "total_s")
        rows = self._sql(
            f"SELECT case_id, {t} AS t FROM results WHERE status != 'skip' AND {t} IS NOT NULL ORDER BY finished_at"
        )
        return {r["case_id"]: float(r["t"]) for r in rows}  # later rows overwrite earlier ones

    def memory_needs(self) -> dict[str, int]:
        """case_id -> the device bytes its most recent GPU result needed alone (CaseResult.memory
        "needs"): what `orch plan` and `--workers-per-gpu auto` size a worker by."""
        n = self._db.json_number("memory", "needs")
        rows = self._sql(f"SELECT case_id, {n} AS n FROM results WHERE {n} IS NOT NULL ORDER BY finished_at")
        return {r["case_id"]: int(r["n"]) for r in rows}

    def same_database(self, other: ResultStore) -> bool:
        return self._db.same_database(other._db)

    def close(self) -> None:
        for run_id in list(self._locked):  # a store closed without release: PostgreSQL frees it anyway
            self._unlock_quietly(run_id)
        self._db.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
