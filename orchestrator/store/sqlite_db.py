"""The SQLite side of the store: one sqlite3 connection, its errors turned into domain errors.

Several drivers may write one file at once when they run on one machine (WAL; a writer waits up to
BUSY_TIMEOUT_S for another's short group commit): each writes its own runs. Across machines a
file on a network filesystem is not safe for SQLite's locks: a shared store is PostgreSQL's job.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from orchestrator.errors import InfraError, InputError, OrchError
from orchestrator.store.location import Location
from orchestrator.store.schema import statements

# A concurrent driver's group commit is milliseconds; a migration of a large file may take longer.
BUSY_TIMEOUT_S = 30.0


class SqliteDB:
    kind = "sqlite"
    errors = (sqlite3.Error,)
    integrity_errors = (sqlite3.IntegrityError,)

    def __init__(self, location: Location, readonly: bool):
        self.display = location.display
        self.readonly = readonly
        p = Path(location.target)
        if readonly:
            con = self._open_readonly(p)
        else:
            if not p.parent.is_dir():  # a typo in --db must not start a new, empty history elsewhere
                raise InputError(
                    f"no folder {p.parent} for the results database: create it first (mkdir -p {p.parent})",
                    source=self.display,
                )
            try:
                con = sqlite3.connect(location.target, isolation_level=None, timeout=BUSY_TIMEOUT_S)
            except (OSError, sqlite3.OperationalError) as e:
                raise InfraError(f"cannot create results database: {e}", source=self.display) from None
        con.row_factory = sqlite3.Row
        self.con = con
        self.path = os.path.abspath(location.target)

    def _open_readonly(self, p: Path) -> sqlite3.Connection:
        """A reader's connection. A WAL database read-only needs its -shm file, which a reader
        without write access to the folder cannot create ("attempt to write a readonly
        database"): such a store (read-only media, another user's file) is opened immutable,
        without locks, as a snapshot of what its writers left."""
        if not p.is_file():
            raise InputError("no results database here", source=self.display)
        base = f"file:{quote(p.resolve().as_posix())}?mode=ro"
        for uri in (base, base + "&immutable=1"):
            try:
                con = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_S)
            except sqlite3.Error as e:
                raise InputError(f"cannot open results database: {e}", source=self.display) from None
            try:
                con.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the first read opens the WAL
            except sqlite3.OperationalError as e:
                if "readonly" in str(e) or "unable to open" in str(e):
                    con.close()
                    continue
            except sqlite3.Error:
                pass  # not a database, or not ours: the schema check says so in its words
            return con
        raise InputError("cannot open results database for reading", source=self.display)

    def domain_error(self, e: BaseException) -> OrchError:
        msg = str(e)
        if isinstance(e, sqlite3.OperationalError) and any(
            s in msg for s in ("readonly", "unable to open", "disk I/O", "database or disk is full", "locked")
        ):
            return InfraError(f"results database not writable: {msg}", source=self.display)
        return InputError(f"not a usable orch results database ({msg})", source=self.display)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.con.execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.con.executemany(sql, rows)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """IMMEDIATE: the write lock from the start, so two drivers' commits queue (busy timeout)
        instead of one failing on upgrade. Ctrl-C/SIGTERM mid-transaction rolls back and re-raises."""
        self.con.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if self.con.in_transaction:
                self.con.execute("ROLLBACK")
            raise
        self.con.execute("COMMIT")

    def tables(self) -> set[str]:
        # The first read is what detects a non-database file ("file is not a database").
        return {r[0] for r in self.con.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def configure_writer(self) -> None:
        # WAL: readers (orch serve) never block the writer; FULL: a commit survives power loss too.
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.execute("PRAGMA synchronous=FULL")
        self.con.execute("PRAGMA foreign_keys=ON")

    def migration_lock(self) -> None:
        """Inside the migration's transaction: BEGIN IMMEDIATE already serialises migrators."""

    def run_statements(self, migration: str) -> None:
        for s in statements(migration):
            self.con.execute(s)

    @staticmethod
    def json_number(column: str, key: str) -> str:
        return f"json_extract({column}, '$.{key}')"

    # -- the per-run writer lock: liveness of the recorded process, on this host only ----------

    def lock_run(self, run_id: int) -> bool:
        """SQLite has no session locks: the writer row's pid is the lock (lock.py checks it)."""
        return True

    def unlock_run(self, run_id: int) -> None:
        pass

    def holder_alive(self, row: Any) -> bool | None:
        """Whether the recorded writer still runs: None where it cannot be known (another host)."""
        from orchestrator.store.lock import pid_alive

        if row["host"] != socket.gethostname():
            return None
        return pid_alive(int(row["pid"]), row["pid_start"])

    def same_database(self, other: Any) -> bool:
        return isinstance(other, SqliteDB) and other.path == self.path

    def close(self) -> None:
        self.con.close()
