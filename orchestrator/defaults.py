"""Where a command reads and writes when not told: the results store and the output folder.

`--db` and `--out` default to ORCH_DB / ORCH_OUT when set, else `orch-results.db` / `orch-out` in
the working directory. The variables let a CI job (or a test session: tests/conftest.py) keep every
command's state in one place without repeating the options; a test never reads the checkout's.
"""

from __future__ import annotations

import os

DB_ENV, OUT_ENV = "ORCH_DB", "ORCH_OUT"
DB, OUT = "orch-results.db", "orch-out"
DB_SHOWN = f"{DB_ENV}, else {DB}"  # as `--help` states the default
OUT_SHOWN = f"{OUT_ENV}, else {OUT}"


def db() -> str:
    return os.environ.get(DB_ENV) or DB


def out() -> str:
    return os.environ.get(OUT_ENV) or OUT


def dashboard_out() -> str:
    return os.path.join(out(), "dashboard")
