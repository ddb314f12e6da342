"""The per-run writer lock: any number of drivers write one database, one driver writes a run.

The `run_writer` row of a run (schema 5) names its driver (pid, host, process start time, argv
with passwords masked). Liveness is the database's: on SQLite the recorded process (same host
only: a pid elsewhere cannot be checked), on PostgreSQL a session advisory lock that dies with the
driver's connection (sqlite_db / postgres_db `lock_run`, `holder_alive`). A live holder makes
`acquire` raise WriterBusy (an InfraError: `orch run --resume N` exits 3 in one line); a dead one's
row is taken over with a note.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from orchestrator.errors import InfraError
from orchestrator.store.location import mask_argv


class WriterBusy(InfraError):
    """Another live driver holds this run's writer lock."""


def pid_start(pid: int) -> str:
    """Start time of a process in clock ticks since boot (Linux); '' where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return ""
    fields = stat[stat.rfind(")") + 2 :].split()  # the command name may hold spaces and ')'
    if fields and fields[0] in ("Z", "X"):  # a zombie: killed, not yet reaped
        return "dead"
    return fields[19] if len(fields) > 19 else ""


def pid_alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = pid_start(pid)
    if now == "dead":
        return False
    return not (start and now and now != start)  # same pid, another process: the writer is gone


def _me() -> tuple[int, str]:
    return os.getpid(), socket.gethostname()


def row_statement(run_id: int, argv: Sequence[str]) -> tuple[str, tuple]:
    """Insert-or-replace this process as run_id's writer (part of create_run's transaction too)."""
    pid, host = _me()
    return (
        "INSERT INTO run_writer(run_id, pid, host, pid_start, since, argv) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(run_id) DO UPDATE SET pid = excluded.pid, host = excluded.host,"
        " pid_start = excluded.pid_start, since = excluded.since, argv = excluded.argv",
        (int(run_id), pid, host, pid_start(pid), time.time(), json.dumps(mask_argv(argv))),
    )


def acquire(db: Any, run_id: int, argv: Sequence[str]) -> str:
    """Take run_id's writer lock or raise WriterBusy (one line: who holds it). Returns a note when
    a dead driver's lock was taken over, else ''. `db`: a SqliteDB or PostgresDB."""
    note = ""
    locked = db.lock_run(run_id)
    try:
        with db.transaction():
            row = db.execute(
                "SELECT pid, host, pid_start, since FROM run_writer WHERE run_id = ?", (int(run_id),)
            ).fetchone()
            if not locked or (row is not None and (row["pid"], row["host"]) != _me()):
                alive = True if not locked else db.holder_alive(row)
                if alive is not False:
                    raise WriterBusy(_busy(db, run_id, row, unknown=alive is None), source=db.display)
                note = f"took over run {run_id}'s writer lock of pid {row['pid']} on {row['host']} (no longer running)"
            sql, params = row_statement(run_id, argv)
            db.execute(sql, params)
    except BaseException:
        if locked:
            db.unlock_run(run_id)
        raise
    return note


def _busy(db: Any, run_id: int, row: Any, unknown: bool) -> str:
    if row is None:  # PostgreSQL: the advisory lock is held, its row not yet written
        return f"another orch driver is writing run {run_id} of this database"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["since"]))
    where = " (another host: cannot check it is alive; if it is gone, delete its run_writer row)" if unknown else ""
    return f"another orch driver (pid {row['pid']} on {row['host']}, since {since}) is writing run {run_id} of this database{where}"


def release(db: Any, run_id: int) -> None:
    pid, host = _me()
    with db.transaction():
        db.execute("DELETE FROM run_writer WHERE run_id = ? AND pid = ? AND host = ?", (int(run_id), pid, host))
    db.unlock_run(run_id)
