"""The results store's writer lock: one driver writes a database at a time.

The `writer` row (schema version 3) holds the driver's pid, host and process start time; a lock
whose process is gone (or whose pid now belongs to another process) is stale and taken over. A
live holder makes `acquire` raise WriterBusy (an InfraError: `orch run` exits 3 in one line).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from collections.abc import Callable, Sequence

from orchestrator.errors import InfraError


class WriterBusy(InfraError):
    """Another live driver holds this database's writer lock."""


def _pid_start(pid: int) -> str:
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


def _pid_alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = _pid_start(pid)
    if now == "dead":
        return False
    return not (start and now and now != start)  # same pid, another process: the writer is gone


def acquire(con: sqlite3.Connection, path: str, argv: Sequence[str],
            domain_error: Callable[[sqlite3.Error], Exception]) -> str:
    """Take the writer lock or raise WriterBusy (one line: who holds it). Returns a note when a
    stale lock (its driver was killed) was taken over, else ''."""
    me = (os.getpid(), socket.gethostname())
    note = ""
    try:
        con.execute("BEGIN IMMEDIATE")
        row = con.execute("SELECT pid, host, pid_start, since FROM writer WHERE id = 1").fetchone()
        if row is not None and (row["pid"], row["host"]) != me:
            if row["host"] != me[1] or _pid_alive(row["pid"], row["pid_start"]):
                con.execute("ROLLBACK")
                since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["since"]))
                where = "" if row["host"] == me[1] else " (another host: cannot check it is alive; if it is gone, delete the writer row)"
                raise WriterBusy(f"another orch driver (pid {row['pid']} on {row['host']}, since {since}) "
                                 f"is writing this database{where}", source=path)  # fmt: skip
            note = f"took over the writer lock of pid {row['pid']} on {row['host']} (no longer running)"
        con.execute(
            "INSERT OR REPLACE INTO writer(id, pid, host, pid_start, since, argv) VALUES (1, ?, ?, ?, ?, ?)",
            (me[0], me[1], _pid_start(me[0]), time.time(), json.dumps(list(argv))),
        )
        con.execute("COMMIT")
    except sqlite3.Error as e:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise domain_error(e) from None
    return note


def release_statement() -> tuple[str, tuple]:
    """The statement that drops this process's lock (run through the store's own write path)."""
    return "DELETE FROM writer WHERE pid = ? AND host = ?", (os.getpid(), socket.gethostname())
