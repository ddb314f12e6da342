"""The PostgreSQL side of the store (psycopg 3): one connection per driver or reader.

Autocommit, with an explicit transaction per write (a group of results, a run's creation, one
migration step), committed with `synchronous_commit = on` whatever the server's default, so what
the driver reports is on the server's disk. Many drivers write one database: each its own runs
(READ COMMITTED is enough, no two touch one run). The per-run writer lock is a session advisory
lock, (LOCK_NS, run id): it dies with its driver's connection, on whatever host that ran, so a
killed driver's run is resumable from anywhere without a stale lock. Migrations are serialised
by a transaction advisory lock, (LOCK_NS, 0): three drivers opening a fresh database at once
migrate it once.

Every message goes through `location.mask` and names the URL without its password.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

from orchestrator.errors import InfraError, InputError, OrchError
from orchestrator.store.location import Location, mask
from orchestrator.store.schema import for_postgres, statements

LOCK_NS = 0x6F726368  # "orch": advisory-lock namespace (int4); the object id is the run id
MIGRATION_LOCK = 0  # run ids start at 1
CONNECT_TIMEOUT_S = 10


def _psycopg():
    try:
        import psycopg
    except ImportError:
        raise InputError("a postgresql:// store needs psycopg 3: pip install 'orch[postgres]'") from None
    return psycopg


@functools.lru_cache(maxsize=256)
def _paramstyle(sql: str) -> str:
    """Our statements use sqlite's `?`; psycopg wants `%s` (and a literal % doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class PostgresDB:
    kind = "postgresql"

    def __init__(self, location: Location, readonly: bool):
        psycopg = _psycopg()
        from psycopg.conninfo import conninfo_to_dict
        from psycopg.rows import dict_row

        self.errors = (psycopg.Error,)
        self.integrity_errors = (psycopg.IntegrityError,)
        self._operational = psycopg.OperationalError
        self.display = location.display
        self.readonly = readonly
        self._secret = ""
        try:
            params = conninfo_to_dict(location.target)
        except psycopg.ProgrammingError as e:
            raise InputError(f"not a valid PostgreSQL URL: {self._clean(e)}", source=self.display) from None
        self._secret = str(params.get("password") or "")
        if not all(p.strip().isdigit() for p in str(params.get("port") or "5432").split(",")):
            raise InputError(f"not a valid PostgreSQL URL: port {params.get('port')!r}", source=self.display)
        self.identity = (str(params.get("host") or ""), str(params.get("port") or ""), str(params.get("dbname") or ""))
        kw: dict[str, Any] = {"autocommit": True, "row_factory": dict_row, "application_name": "orch"}
        if "connect_timeout" not in params:
            kw["connect_timeout"] = CONNECT_TIMEOUT_S
        if readonly:
            kw["options"] = "-c default_transaction_read_only=on"
        try:
            self.con = psycopg.connect(location.target, **kw)
        except psycopg.OperationalError as e:
            text = self._clean(e)
            if "does not exist" in text and "database" in text:
                raise InputError(
                    f"no such PostgreSQL database ({text}); create it first (createdb)", source=self.display
                ) from None
            raise InfraError(f"results database unreachable: {text}", source=self.display) from None
        if not readonly:
            self.con.execute("SET synchronous_commit = on")

    def _clean(self, e: BaseException) -> str:
        text = " ".join(str(e).split())
        if self._secret:
            text = text.replace(self._secret, "***")
        return mask(text)

    def domain_error(self, e: BaseException) -> OrchError:
        text = self._clean(e)
        sqlstate = getattr(e, "sqlstate", None) or ""
        # 25xxx: a read-only transaction; 42501: insufficient privilege.
        if sqlstate.startswith("25") or sqlstate == "42501":
            return InfraError(f"results database not writable: {text}", source=self.display)
        if isinstance(e, self._operational):  # the connection dropped, the server went away
            return InfraError(f"results database unreachable: {text}", source=self.display)
        return InputError(f"not a usable orch results database ({text})", source=self.display)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.con.execute(_paramstyle(sql), tuple(params) if params else None)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self.con.cursor() as cur:
            cur.executemany(_paramstyle(sql), [tuple(r) for r in rows])

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        with self.con.transaction():
            yield

    def tables(self) -> set[str]:
        rows = self.con.execute(
            "SELECT table_name AS name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
        return {r["name"] for r in rows}

    def configure_writer(self) -> None:
        pass  # durability is per connection (synchronous_commit above); nothing per file

    def migration_lock(self) -> None:
        self.con.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_NS, MIGRATION_LOCK))

    def run_statements(self, migration: str) -> None:
        for s in statements(migration):
            pg = for_postgres(s)
            if pg is not None:
                self.con.execute(pg)

    @staticmethod
    def json_number(column: str, key: str) -> str:
        return f"CAST(CAST({column} AS json) ->> '{key}' AS DOUBLE PRECISION)"

    # -- the per-run writer lock: a session advisory lock ---------------------------------------

    def lock_run(self, run_id: int) -> bool:
        row = self.con.execute("SELECT pg_try_advisory_lock(%s, %s) AS ok", (LOCK_NS, int(run_id))).fetchone()
        return bool(row["ok"])

    def unlock_run(self, run_id: int) -> None:
        self.con.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_NS, int(run_id)))

    def holder_alive(self, row: Any) -> bool | None:
        return False  # asked only once lock_run succeeded: the recorded holder's session is gone

    def same_database(self, other: Any) -> bool:
        return isinstance(other, PostgresDB) and other.identity == self.identity

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.con.close()
