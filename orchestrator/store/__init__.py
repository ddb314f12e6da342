"""The results store (SQLite file or PostgreSQL database). Callers import from here:

api.py          ResultStore, RunInfo: the store's reads and writes, on either database
sqlite_db.py    the SQLite connection (WAL, busy timeout), its errors as domain errors
postgres_db.py  the PostgreSQL connection (psycopg 3), advisory locks
schema.py       the migrations, one description for both databases
options.py      RunOptions: how `orch run` was asked for a run
lock.py         the per-run writer lock
location.py     --db as a path or a URL; passwords masked
refs.py         run references (`7`, `main`, `other.db#7`, `postgresql://...#main`), baselines
"""

from orchestrator.store.api import APP_ID, ResultStore, RunInfo, device_model, file_sha
from orchestrator.store.location import mask, mask_argv
from orchestrator.store.lock import WriterBusy
from orchestrator.store.options import NewRun, RunOptions
from orchestrator.store.refs import Baseline, find_baseline, resolve_baseline
from orchestrator.store.schema import MIGRATIONS, SCHEMA_VERSION

__all__ = [
    "APP_ID",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Baseline",
    "NewRun",
    "ResultStore",
    "RunInfo",
    "RunOptions",
    "WriterBusy",
    "device_model",
    "file_sha",
    "find_baseline",
    "mask",
    "mask_argv",
    "resolve_baseline",
]
