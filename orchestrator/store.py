"""The results store: one SQLite file, written by the driver only, read by everything else.

Every result is committed before it is reported (WAL, synchronous=FULL; results that arrive
together share one transaction: group commit), so a killed driver loses nothing it reported, and
`orch run --resume RUN` re-runs every case without a final verdict (a first attempt awaiting its
retry is stored with final = 0). One driver writes a database at a time: the `writer` row is its
lock (pid, host, process start time); a lock whose process is gone is stale and taken over. sqlite errors never escape: a file that is not a
database, a database that is not ours, or one written by a newer orch is an InputError (the user
points us at the wrong file; we never overwrite it); a location we cannot create or write is an
InfraError.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.case import Case
from backend.result import CaseResult, CheckOutcome, Status
from orchestrator import store_lock
from orchestrator.errors import InfraError, InputError
from orchestrator.store_lock import WriterBusy  # noqa: F401  (re-exported: callers catch it from here)
from orchestrator.store_schema import _RESULT_COLS, MIGRATIONS, SCHEMA_VERSION  # noqa: F401

APP_ID = "orch-results"  # meta.app: tells our databases from any other SQLite file


@dataclass(frozen=True)
class RunOptions:
    """How `orch run` was asked for a run (runs.options, schema 5): what its outputs name ("filter
    `tp=1`, backend `x`: 6 of 90 cases"), where `--resume` writes, and the gate's empty-run rule
    (orchestrator/empty_run.py), so `orch gate` and `orch report` judge the run as `orch run` did.
    Runs stored before schema 5 read as the defaults."""

    out: str = ""  # --out, absolute ("" unknown)
    filter: str | None = None  # --filter as given
    backend: str | None = None  # --backend as given
    matrix_cases: int = 0  # cases of the matrix before --filter (runnable and skipped; 0 unknown)
    allow_empty: bool = False  # --allow-empty: a run in which nothing ran may pass
    require: tuple[str, ...] = ()  # --require FILTER...: slices that must have run

    def to_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "require": list(self.require)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> "RunOptions":
        d = json.loads(text or "{}")
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        return cls(**{**d, "require": tuple(d.get("require", ()))})


@dataclass(frozen=True)
class RunInfo:
    id: int
    matrix: str
    matrix_sha: str
    git_sha: str
    started_at: float
    finished_at: float | None
    status: str
    cluster: str
    devices: str
    versions: dict[str, Any] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    baseline: str | None = None
    num_cases: int = 0  # planned
    num_results: int = 0  # final verdicts recorded so far
    options: RunOptions = field(default_factory=RunOptions)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def file_sha(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def _git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _result_from_row(row: sqlite3.Row) -> CaseResult:
    checks = tuple(
        CheckOutcome(**{**c, "first_bad": tuple(c["first_bad"]) if c.get("first_bad") is not None else None})
        for c in json.loads(row["checks"])
    )
    return CaseResult(
        case_id=row["case_id"],
        status=Status(row["status"]),
        reason=row["reason"],
        checks=checks,
        requested_mode=row["requested_mode"],
        resolved_mode=row["resolved_mode"],
        downgraded=bool(row["downgraded"]),
        graph_kind=row["graph_kind"],
        provider=row["provider"],
        capture_sizes_used=tuple(json.loads(row["capture_sizes"])),
        error_kind=row["error_kind"],
        timings=json.loads(row["timings"]),
        device=row["device"],
        versions=json.loads(row["versions"]),
        log_tail=row["log_tail"],
        repro=row["repro"],
        attempts=row["attempts"],
        worker=row["worker"],
        axes=json.loads(row["axes"]),
        memory=json.loads(row["memory"]),
    )


class ResultStore:
    """Thin wrapper over one sqlite3 connection. Not thread-safe: one store per thread."""

    def __init__(self, path: str, *, readonly: bool = False):
        self.path = str(path)
        self.readonly = readonly
        self._con = self._connect()
        try:
            self._check_and_migrate()
        except BaseException:
            self._con.close()
            raise

    # -- connection and schema ---------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        p = Path(self.path)
        if self.readonly:
            if not p.is_file():
                raise InputError("no results database here", source=self.path)
            uri = f"file:{p.resolve().as_posix()}?mode=ro"
            try:
                con = sqlite3.connect(uri, uri=True, isolation_level=None)
            except sqlite3.Error as e:
                raise InputError(f"cannot open results database: {e}", source=self.path) from None
        else:
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
                con = sqlite3.connect(self.path, isolation_level=None)
            except (OSError, sqlite3.OperationalError) as e:
                raise InfraError(f"cannot create results database: {e}", source=self.path) from None
        con.row_factory = sqlite3.Row
        return con

    def _sql(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._con.execute(sql, params)
        except sqlite3.DatabaseError as e:
            raise self._domain_error(e) from None

    def _domain_error(self, e: sqlite3.Error) -> Exception:
        msg = str(e)
        if isinstance(e, sqlite3.OperationalError) and any(
            s in msg for s in ("readonly", "unable to open", "disk I/O", "database or disk is full", "locked")
        ):
            return InfraError(f"results database not writable: {msg}", source=self.path)
        return InputError(f"not a usable orch results database ({msg})", source=self.path)

    def _check_and_migrate(self) -> None:
        # The first read is what detects a non-database file ("file is not a database").
        tables = {r[0] for r in self._sql("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            if self.readonly:
                raise InputError("empty results database (no runs yet)", source=self.path)
            version = 0
        elif "meta" not in tables:
            raise InputError("not an orch results database (refusing to touch it)", source=self.path)
        else:
            meta = dict(self._sql("SELECT key, value FROM meta").fetchall())
            if meta.get("app") != APP_ID:
                raise InputError("not an orch results database (refusing to touch it)", source=self.path)
            try:
                version = int(meta.get("schema_version", ""))
            except ValueError:
                raise InputError("bad schema_version in meta table", source=self.path) from None
        if version > SCHEMA_VERSION:
            raise InputError(
                f"results database has schema version {version}, this orch reads up to {SCHEMA_VERSION}: "
                "upgrade orch or use another --db",
                source=self.path,
            )
        if self.readonly:
            if version < SCHEMA_VERSION:  # readable, but our queries need the new tables
                raise InputError(f"results database has old schema version {version}: open it once with write access to migrate", source=self.path)
            return
        # WAL: readers (orch serve) never block the writer; FULL: a commit survives power loss too.
        self._sql("PRAGMA journal_mode=WAL")
        self._sql("PRAGMA synchronous=FULL")
        self._sql("PRAGMA foreign_keys=ON")
        self._sql("PRAGMA busy_timeout=5000")
        for v in range(version, SCHEMA_VERSION):
            self._migrate_one(v)

    def _migrate_one(self, from_version: int) -> None:
        statements = [s.strip() for s in MIGRATIONS[from_version].split(";") if s.strip()]
        try:
            self._con.execute("BEGIN IMMEDIATE")
            for s in statements:
                self._con.execute(s)
            self._con.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('app', ?)", (APP_ID,))
            self._con.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)", (str(from_version + 1),)
            )
            self._con.execute("COMMIT")
        except sqlite3.Error as e:
            if self._con.in_transaction:
                self._con.execute("ROLLBACK")
            raise self._domain_error(e) from None

    def schema_version(self) -> int:
        return int(self._sql("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])

    def _write(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> sqlite3.Cursor | None:
        """Run statements in one transaction and commit: durable when this returns."""
        cur = None
        try:
            self._con.execute("BEGIN IMMEDIATE")
            for sql, params in statements:
                cur = self._con.execute(sql, params)
            self._con.execute("COMMIT")
        except sqlite3.Error as e:
            if self._con.in_transaction:
                self._con.execute("ROLLBACK")
            raise self._domain_error(e) from None
        except BaseException:  # Ctrl-C/SIGTERM mid-transaction: the driver still closes the run
            if self._con.in_transaction:
                self._con.execute("ROLLBACK")
            raise
        return cur

    # -- writing (the driver) ----------------------------------------------------------------

    def create_run(
        self,
        *,
        matrix: str,
        cases: Sequence[Case],
        argv: list[str] | None = None,
        cluster: str = "",
        devices: str = "",
        versions: dict | None = None,
        baseline: str | None = None,
        options: RunOptions | None = None,
    ) -> int:
        est = self.durations()
        try:
            self._con.execute("BEGIN IMMEDIATE")
            cur = self._con.execute(
                "INSERT INTO runs(matrix, matrix_sha, git_sha, started_at, status, cluster, devices, versions, argv,"
                " baseline, options) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?)",
                (matrix, file_sha(matrix), _git_sha(), time.time(), cluster, devices,
                 json.dumps(versions or {}, sort_keys=True), json.dumps(list(argv or [])), baseline,
                 (options or RunOptions()).to_json()),
            )  # fmt: skip
            run_id = int(cur.lastrowid)
            self._con.executemany(
                'INSERT INTO cases(run_id, case_id, axes, "case", est_s) VALUES (?, ?, ?, ?, ?)',
                [
                    (run_id, c.case_id, json.dumps(c.axes, sort_keys=True), json.dumps(c.to_dict()), est.get(c.case_id))
                    for c in cases
                ],
            )
            self._con.execute("COMMIT")
        except sqlite3.IntegrityError as e:
            self._con.execute("ROLLBACK")
            raise InputError(f"duplicate case ids in the run: {e}", source=matrix) from None
        except sqlite3.Error as e:
            if self._con.in_transaction:
                self._con.execute("ROLLBACK")
            raise self._domain_error(e) from None
        return run_id

    # -- the writer lock ---------------------------------------------------------------------

    def acquire_writer(self, argv: Sequence[str] = ()) -> str:
        """Take the writer lock (orchestrator/store_lock.py) or raise WriterBusy; returns a note
        when a stale lock was taken over, else ''."""
        return store_lock.acquire(self._con, self.path, argv, self._domain_error)

    def release_writer(self) -> None:
        self._write([store_lock.release_statement()])

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
        )  # fmt: skip
        placeholders = ", ".join("?" * len(_RESULT_COLS))
        return [
            (f"INSERT OR REPLACE INTO results({', '.join(_RESULT_COLS)}) VALUES ({placeholders})", row),
            ("INSERT INTO attempt_log(run_id, case_id, attempt, status, reason, worker, device, finished_at)"
             " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
             (run_id, result.case_id, result.attempts, result.status.value, result.reason, result.worker,
              result.device, now)),
        ]  # fmt: skip

    def finish_run(self, run_id: int, status: str) -> None:
        self._write([("UPDATE runs SET status = ?, finished_at = ? WHERE id = ?", (status, time.time(), run_id))])

    # -- reading -----------------------------------------------------------------------------

    def _run_from_row(self, r: sqlite3.Row) -> RunInfo:
        return RunInfo(
            id=r["id"], matrix=r["matrix"], matrix_sha=r["matrix_sha"], git_sha=r["git_sha"],
            started_at=r["started_at"], finished_at=r["finished_at"], status=r["status"], cluster=r["cluster"],
            devices=r["devices"], versions=json.loads(r["versions"]), argv=json.loads(r["argv"]),
            baseline=r["baseline"], num_cases=r["num_cases"], num_results=r["num_results"],
            options=RunOptions.from_json(r["options"]),
        )  # fmt: skip

    _RUN_SELECT = (
        "SELECT runs.*, (SELECT count(*) FROM cases WHERE cases.run_id = runs.id) AS num_cases,"
        " (SELECT count(*) FROM results WHERE results.run_id = runs.id AND final = 1) AS num_results FROM runs"
    )

    def run(self, run_id: int) -> RunInfo:
        r = self._sql(self._RUN_SELECT + " WHERE id = ?", (int(run_id),)).fetchone()
        if r is None:
            raise InputError(f"no run {run_id} in this database", source=self.path)
        return self._run_from_row(r)

    def latest_run_id(self) -> int | None:
        r = self._sql("SELECT max(id) FROM runs").fetchone()
        return None if r[0] is None else int(r[0])

    def runs(self) -> list[RunInfo]:
        return [self._run_from_row(r) for r in self._sql(self._RUN_SELECT + " ORDER BY id")]

    def planned_cases(self, run_id: int) -> list[Case]:
        rows = self._sql('SELECT "case" FROM cases WHERE run_id = ? ORDER BY rowid', (run_id,))
        return [Case.from_dict(json.loads(r[0])) for r in rows]

    def results(self, run_id: int) -> list[CaseResult]:
        rows = self._sql("SELECT * FROM results WHERE run_id = ? ORDER BY case_id", (run_id,))
        return [_result_from_row(r) for r in rows]

    def missing_case_ids(self, run_id: int) -> list[str]:
        rows = self._sql(
            "SELECT case_id FROM cases WHERE run_id = ? AND case_id NOT IN"
            " (SELECT case_id FROM results WHERE run_id = ? AND final = 1) ORDER BY rowid",
            (run_id, run_id),
        )
        return [r[0] for r in rows]

    def attempt_log(self, run_id: int, case_id: str) -> list[dict[str, Any]]:
        rows = self._sql(
            "SELECT attempt, status, reason, worker, device, finished_at FROM attempt_log"
            " WHERE run_id = ? AND case_id = ? ORDER BY rowid",
            (run_id, case_id),
        )
        return [dict(r) for r in rows]

    def history(self, case_id: str, limit: int = 20) -> list[tuple[int, CaseResult]]:
        """Newest first: (run id, last result of the case in that run)."""
        rows = self._sql(
            "SELECT * FROM results WHERE case_id = ? ORDER BY run_id DESC LIMIT ?", (case_id, int(limit))
        )
        return [(int(r["run_id"]), _result_from_row(r)) for r in rows]

    def status_history(self, limit_runs: int = 20) -> dict[str, list[tuple[int, str]]]:
        """case_id -> [(run id, status)] over the last `limit_runs` runs, newest first (one query)."""
        rows = self._sql(
            "SELECT case_id, run_id, status FROM results WHERE run_id IN"
            " (SELECT id FROM runs ORDER BY id DESC LIMIT ?) ORDER BY run_id DESC",
            (int(limit_runs),),
        )
        out: dict[str, list[tuple[int, str]]] = {}
        for r in rows:
            out.setdefault(r["case_id"], []).append((int(r["run_id"]), r["status"]))
        return out

    def durations(self) -> dict[str, float]:
        """case_id -> total_s of its most recent result that ran (not a skip): the cost model's history.
        Timeouts are included on purpose: a case that hit its deadline will cost that much again."""
        rows = self._sql(
            "SELECT case_id, json_extract(timings, '$.total_s') AS t FROM results"
            " WHERE status != 'skip' AND json_extract(timings, '$.total_s') IS NOT NULL"
            " ORDER BY finished_at"
        )
        return {r["case_id"]: float(r["t"]) for r in rows}  # later rows overwrite earlier ones

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resolve_baseline(spec: str | None, store: ResultStore, current_run: int) -> list[CaseResult] | None:
    """`--baseline`: a run id in this store, or the path of another results DB (its latest run)."""
    if spec is None or str(spec).strip() == "":
        return None
    spec = str(spec).strip()
    if spec.isdigit():
        run_id = int(spec)
        if run_id == current_run:
            raise InputError(f"--baseline {run_id} is the run being gated; give an earlier run")
        store.run(run_id)  # raises InputError if absent
        return store.results(run_id)
    if not os.path.isfile(spec):
        raise InputError("--baseline is neither a run id in --db nor an existing results database", source=spec)
    if os.path.abspath(spec) == os.path.abspath(store.path):
        raise InputError("--baseline is the same database as --db; give a run id instead", source=spec)
    with ResultStore(spec, readonly=True) as other:
        latest = other.latest_run_id()
        if latest is None:
            raise InputError("baseline database has no runs", source=spec)
        return other.results(latest)
