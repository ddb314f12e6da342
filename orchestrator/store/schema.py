"""The results store's schema: ordered migrations (the store applies and checks them) and the
column order of a result row. Nothing here opens a database.

One description for both databases: the migrations are written in SQLite's dialect and
`for_postgres` derives PostgreSQL's from them by a few substitutions (identity keys, 8-byte
floats: PostgreSQL's REAL is 4 bytes, which would round a unix time to minutes). A statement that
only makes sense on an existing SQLite file (a backfill from `rowid`) carries SQLITE_ONLY and is
left out on PostgreSQL, whose databases are created at schema 5 or later (tests/results/
test_store_postgres.py compares the two schemas column by column).
"""

from __future__ import annotations

import re

SQLITE_ONLY = "/* sqlite only */"

# Ordered migrations; SCHEMA_VERSION == len(MIGRATIONS). Never edit a released entry, append one.
# Each runs in one transaction together with the meta.schema_version bump.
MIGRATIONS: list[str] = [
    # --- version 1: runs, their planned cases, one result per (run, case) ---
    """
    CREATE TABLE IF NOT EXISTS meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    -- One invocation of `orch run`. status: running | finished | interrupted | failed.
    CREATE TABLE runs (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        matrix      TEXT NOT NULL,          -- matrix file as given on the command line
        matrix_sha  TEXT NOT NULL,          -- sha256 of its bytes ('' if unreadable)
        git_sha     TEXT NOT NULL,          -- HEAD of the working directory ('' outside git)
        started_at  REAL NOT NULL,          -- unix seconds
        finished_at REAL,
        status      TEXT NOT NULL,
        cluster     TEXT NOT NULL,          -- Ray address / description
        devices     TEXT NOT NULL,          -- e.g. "8x NVIDIA H200" or "cpu"
        versions    TEXT NOT NULL,          -- json {torch, ray, orch, ...}
        argv        TEXT NOT NULL,          -- json list
        baseline    TEXT                    -- --baseline as given
    );
    -- The expanded matrix of a run: what --resume compares results against.
    CREATE TABLE cases (
        run_id  INTEGER NOT NULL REFERENCES runs(id),
        case_id TEXT NOT NULL,
        axes    TEXT NOT NULL,              -- json Case.axes
        "case"  TEXT NOT NULL,              -- json Case.to_dict()
        est_s   REAL,                       -- duration estimate at planning time (last known)
        PRIMARY KEY (run_id, case_id)
    );
    -- The last attempt of each case of a run (an upsert: a retry replaces the row).
    CREATE TABLE results (
        run_id         INTEGER NOT NULL REFERENCES runs(id),
        case_id        TEXT NOT NULL,
        status         TEXT NOT NULL,       -- backend.result.Status value
        reason         TEXT NOT NULL,
        checks         TEXT NOT NULL,       -- json list of CheckOutcome
        requested_mode TEXT NOT NULL,
        resolved_mode  TEXT NOT NULL,
        downgraded     INTEGER NOT NULL,
        graph_kind     TEXT NOT NULL,
        provider       TEXT NOT NULL,
        capture_sizes  TEXT NOT NULL,       -- json list, per step (0 = ran eager)
        error_kind     TEXT NOT NULL,
        timings        TEXT NOT NULL,       -- json {capture_s, eager_step_s, replay_step_s, total_s}
        device         TEXT NOT NULL,
        versions       TEXT NOT NULL,       -- json
        log_tail       TEXT NOT NULL,
        repro          TEXT NOT NULL,
        attempts       INTEGER NOT NULL,
        worker         TEXT NOT NULL,
        axes           TEXT NOT NULL,       -- json Case.axes (reports that only have results)
        finished_at    REAL NOT NULL,
        PRIMARY KEY (run_id, case_id)
    );
    CREATE INDEX results_case ON results(case_id, finished_at);
    """,
    # --- version 2: every attempt, not only the last (flaky/timeout retries stay visible) ---
    """
    CREATE TABLE attempt_log (
        run_id      INTEGER NOT NULL REFERENCES runs(id),
        case_id     TEXT NOT NULL,
        attempt     INTEGER NOT NULL,
        status      TEXT NOT NULL,
        reason      TEXT NOT NULL,
        worker      TEXT NOT NULL,
        device      TEXT NOT NULL,
        finished_at REAL NOT NULL
    );
    CREATE INDEX attempt_log_case ON attempt_log(run_id, case_id);
    """,
    # --- version 3: final verdicts apart from first attempts (resume), the writer lock ---
    """
    ALTER TABLE results ADD COLUMN final INTEGER NOT NULL DEFAULT 1;
    CREATE TABLE writer (
        id         INTEGER PRIMARY KEY CHECK (id = 1),
        pid        INTEGER NOT NULL,
        host       TEXT NOT NULL,
        pid_start  TEXT NOT NULL,          -- /proc/PID/stat start time: a reused pid is not ours
        since      REAL NOT NULL,
        argv       TEXT NOT NULL
    );
    """,
    # --- version 4: a case's device memory (CaseResult.memory, bytes; '{}' where not measured) ---
    """
    ALTER TABLE results ADD COLUMN memory TEXT NOT NULL DEFAULT '{}';
    """,
    # --- version 5: a shared store. Runs carry a label (the branch: `--baseline main`) and the
    # device model they ran on; the planned order is a column (PostgreSQL has no rowid); the writer
    # lock is per run (many drivers write one database, one driver writes a run) ---
    """
    ALTER TABLE runs ADD COLUMN label TEXT NOT NULL DEFAULT '';
    ALTER TABLE runs ADD COLUMN device_model TEXT NOT NULL DEFAULT '';
    CREATE INDEX runs_label ON runs(label, status);
    ALTER TABLE cases ADD COLUMN pos INTEGER NOT NULL DEFAULT 0;
    /* sqlite only */ UPDATE cases SET pos = rowid;
    DROP TABLE writer;
    CREATE TABLE run_writer (
        run_id     INTEGER PRIMARY KEY REFERENCES runs(id),
        pid        INTEGER NOT NULL,
        host       TEXT NOT NULL,
        pid_start  TEXT NOT NULL,          -- /proc/PID/stat start time: a reused pid is not ours
        since      REAL NOT NULL,
        argv       TEXT NOT NULL           -- json, passwords masked
    );
    """,
    # --- version 6: how a run was asked for, what every output of it names and `--resume` reuses:
    # json {out, filter, backend, matrix_cases, allow_empty, require} (RunOptions; '{}' before) ---
    """
    ALTER TABLE runs ADD COLUMN options TEXT NOT NULL DEFAULT '{}';
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)

_RESULT_COLS = (
    "run_id", "case_id", "status", "reason", "checks", "requested_mode", "resolved_mode", "downgraded",
    "graph_kind", "provider", "capture_sizes", "error_kind", "timings", "device", "versions", "log_tail",
    "repro", "attempts", "worker", "axes", "finished_at", "final", "memory",
)  # fmt: skip # the columns in the table's order, packed


_PG_SUBSTITUTIONS = (
    (re.compile(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b"), "INTEGER GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
)


def statements(migration: str) -> list[str]:
    """The statements of one migration (no statement holds a ';' inside a literal)."""
    return [s.strip() for s in migration.split(";") if s.strip()]


def for_postgres(statement: str) -> str | None:
    """PostgreSQL's form of one SQLite statement, None for a SQLite-only one."""
    if SQLITE_ONLY in statement:
        return None
    for pattern, repl in _PG_SUBSTITUTIONS:
        statement = pattern.sub(repl, statement)
    return statement
