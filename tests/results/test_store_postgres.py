"""The results store on a real PostgreSQL server (tests/pgserver.py) beside SQLite: the same
guarantees (round trips, resume, durability against a killed writer, a per-run writer lock,
migrations), one schema for both, and bad databases as one line with the right exit code and
never a password."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from backend.result import Status
from orchestrator.cli import main as cli_main
from orchestrator.errors import InfraError, InputError
from orchestrator.store import SCHEMA_VERSION, NewRun, ResultStore
from tests.results import samples

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path):
    """A fresh store location of either kind: the guarantees below hold for both."""
    if request.param == "sqlite":
        return str(tmp_path / "r.db")
    return request.getfixturevalue("pg_url")


def _cli(capsys, *argv):
    code = cli_main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err.strip()


def test_the_store_behaves_the_same_on_both_databases(db):
    cases = samples.make_cases()
    results = samples.make_results(cases)
    with ResultStore(db) as store:
        b = store.create_run(NewRun(matrix="m.yaml", cases=cases, label="main"))
        store.record_many(b, [(samples.result_for(c), True) for c in cases])
        store.finish_run(b, "finished")
        rid = store.create_run(
            NewRun(matrix="m.yaml", cases=cases, argv=["orch", "run", "--db", db], versions={"torch": "2.13"})
        )
        store.record(rid, samples.result_for(cases[0], Status.TIMEOUT, attempts=1), final=False)  # retry pending
        store.record_many(rid, [(r, True) for r in results[1:10]])
        assert store.missing_case_ids(rid) == [c.case_id for c in [cases[0], *cases[10:]]]  # the planned order
        store.record_many(rid, [(r, True) for r in results])
        store.finish_run(rid, "finished")
        assert store.results(rid) == sorted(results, key=lambda r: r.case_id)
        assert store.planned_cases(rid) == cases
        assert [a["status"] for a in store.attempt_log(rid, cases[0].case_id)] == ["timeout", results[0].status.value]
        info = store.run(rid)
        assert (info.status, info.num_cases, info.num_results, info.device_model) == ("finished", 32, 32, "cpu")
        assert [r.id for r in store.labelled_runs("main")] == [b] and store.labelled_runs("other") == []
        assert store.durations()[cases[3].case_id] == results[3].timings["total_s"]
        assert [(run, r.status) for run, r in store.history(samples.REGRESSION)] == [
            (rid, Status.FAIL),
            (b, Status.PASS),
        ]
        hist = store.status_history()[samples.REGRESSION]
        assert hist == [(rid, "fail", "cpu"), (b, "pass", "cpu")]
        assert store.schema_version() == SCHEMA_VERSION
    with ResultStore(db, readonly=True) as reader:
        assert reader.run(rid).num_results == 32
        with pytest.raises(InfraError, match="not writable"):  # a reader cannot write, on either
            reader.finish_run(rid, "failed")


def _columns_sqlite(path: str) -> set[tuple]:
    types = {"TEXT": "text", "INTEGER": "integer", "REAL": "real"}
    con = sqlite3.connect(path)
    tables = [
        r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name != 'sqlite_sequence'")
    ]
    out = {(t, c[1], types[c[2]], bool(c[3] or c[5])) for t in tables for c in con.execute(f"PRAGMA table_info({t})")}
    con.close()
    return out


def _columns_pg(url: str) -> set[tuple]:
    import psycopg

    # float4 ("real" in PostgreSQL) would round a unix time to minutes: it must not appear.
    types = {"text": "text", "integer": "integer", "double precision": "real", "real": "float4", "bigint": "bigint"}
    with psycopg.connect(url) as con:
        rows = con.execute(
            "SELECT c.table_name, c.column_name, c.data_type, c.is_nullable = 'NO',"
            " EXISTS (SELECT 1 FROM information_schema.key_column_usage k"
            "  JOIN information_schema.table_constraints tc ON tc.constraint_name = k.constraint_name"
            "  WHERE tc.constraint_type = 'PRIMARY KEY' AND k.table_name = c.table_name"
            "  AND k.column_name = c.column_name)"
            " FROM information_schema.columns c WHERE c.table_schema = current_schema()"
        ).fetchall()
    return {(t, c, types[d], bool(nn or pk)) for t, c, d, nn, pk in rows}


def test_postgresql_gets_the_same_schema_from_the_one_description(tmp_path, pg_url):
    ResultStore(str(tmp_path / "r.db")).close()
    ResultStore(pg_url).close()
    sqlite_cols, pg_cols = _columns_sqlite(str(tmp_path / "r.db")), _columns_pg(pg_url)
    assert sqlite_cols == pg_cols
    assert ("runs", "started_at", "real", True) in pg_cols and ("run_writer", "run_id", "integer", True) in pg_cols


WRITER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {repo!r})
    from orchestrator.store import NewRun, ResultStore
    from tests.results import samples
    cases = samples.make_cases()
    store = ResultStore({db!r})
    rid = store.create_run(NewRun(matrix="m.yaml", cases=cases), lock_writer=True)
    for i, r in enumerate(samples.make_results(cases)):
        if i == 13:
            os._exit(9)  # the driver dies mid-run: no close, no finish_run, no atexit
        store.record(rid, r)
    """
)


def test_every_recorded_result_survives_a_killed_writer_and_its_run_resumes(db):
    proc = subprocess.run(
        [sys.executable, "-c", WRITER.format(repo=REPO, db=db)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 9, proc.stderr
    with ResultStore(db) as store:
        rid = store.latest_run_id()
        assert store.run(rid).status == "running" and len(store.results(rid)) == 13
        assert store.missing_case_ids(rid) == [c.case_id for c in samples.make_cases()[13:]]
        # Its writer died with it: the resume takes the run over (PostgreSQL: the lock went with
        # the connection; SQLite: the pid is gone).
        assert "took over run" in store.acquire_writer(rid)


HOLDER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {repo!r})
    from orchestrator.store import NewRun, ResultStore
    from tests.results import samples
    s = ResultStore({db!r})
    rid = s.create_run(NewRun(matrix="m.yaml", cases=samples.make_cases()[:2], argv=["holder"]), lock_writer=True)
    print("locked", rid, flush=True)
    time.sleep(600)
    """
)


def test_the_writer_lock_is_per_run_on_postgresql(pg_url):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(repo=REPO, db=pg_url)], stdout=subprocess.PIPE, text=True
    )
    try:
        _word, rid = holder.stdout.readline().split()
        rid = int(rid)
        with ResultStore(pg_url) as store:
            mine = store.create_run(NewRun(matrix="m.yaml", cases=samples.make_cases()[:2]), lock_writer=True)
            assert mine != rid
            with pytest.raises(InfraError, match=f"pid {holder.pid} on .* is writing run {rid} of this database"):
                store.acquire_writer(rid)
    finally:
        holder.kill()
        holder.wait()
    with ResultStore(pg_url) as store:
        assert f"took over run {rid}'s writer lock of pid {holder.pid}" in store.acquire_writer(rid)
        # A second connection (another driver) cannot take it while this one holds it.
        with ResultStore(pg_url) as other, pytest.raises(InfraError, match=f"is writing run {rid}"):
            other.acquire_writer(rid)


def _foreign(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        con.execute("CREATE TABLE users (id integer)")


def _newer(url: str) -> None:
    ResultStore(url).close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        con.execute("UPDATE meta SET value = %s WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))


# scenario -> (how the URL is made from the server and a fresh database, setup, exit code, text)
BAD_DATABASES = {
    "nothing listens there": (
        lambda srv, url: url.replace(f"host={srv.root}", f"host={srv.root}/nowhere"),
        None,
        3,
        "unreachable",
    ),
    "wrong password": (
        lambda srv, url: url.replace(srv.password, "not-the-password"),
        None,
        3,
        "password authentication failed",
    ),
    "no such database": (lambda srv, url: srv.url("absent_db"), None, 2, "does not exist"),
    "a database that is not orch's": (lambda srv, url: url, _foreign, 2, "not an orch results database"),
    "written by a newer orch": (lambda srv, url: url, _newer, 2, f"schema version {SCHEMA_VERSION + 1}"),
    "empty, for a reader": (lambda srv, url: url, None, 2, "empty results database"),
}


@pytest.mark.parametrize("scenario", BAD_DATABASES)
def test_a_bad_database_is_one_line_with_its_exit_code_and_no_password(pg_server, pg_url, capsys, scenario):
    make, setup, code, text = BAD_DATABASES[scenario]
    url = make(pg_server, pg_url)
    if setup is not None:
        setup(url)
    got, _out, err = _cli(capsys, "report", "--db", url)
    assert got == code and len(err.splitlines()) == 1 and text in err, err
    assert pg_server.password not in err and "not-the-password" not in err
    assert err.startswith(f"orch: postgresql://{pg_server.user}@/")  # the URL, shown without the password


def test_orch_db_points_every_command_at_one_store_and_no_output_shows_the_password(
    pg_server, pg_url, tmp_path, monkeypatch, capsys
):
    cases = samples.make_cases()
    with ResultStore(pg_url) as store:
        b = store.create_run(NewRun(matrix="matrices/sample.yaml", cases=cases, label="main"))
        store.record_many(b, [(r, True) for r in samples.make_baseline(cases)])
        store.finish_run(b, "finished")
        rid = store.create_run(
            NewRun(
                matrix="matrices/sample.yaml",
                cases=cases,
                argv=["orch", "run", "--db", pg_url],
                baseline=pg_url + "#main",
            )
        )
        store.record_many(rid, [(r, True) for r in samples.make_results(cases)])
        store.finish_run(rid, "finished")
    monkeypatch.setenv("ORCH_DB", pg_url)
    seen = []
    for argv in (
        ["report", "--format", "json"],
        ["report", "--format", "md", "--baseline", "main"],
        ["gate", "-v"],
        ["diff", "main", str(rid)],
        ["dashboard", "--out", str(tmp_path / "dash")],
    ):
        code, out, err = _cli(capsys, *argv)
        assert code in (0, 1), (argv, err)
        seen.append(out + err)
    seen.append((tmp_path / "dash" / "index.html").read_text())
    assert all(pg_server.password not in text for text in seen)
    assert f'"id": {rid}' in seen[0] and "regressions" in seen[0]  # the run came from PostgreSQL
    assert "baseline: run 1 (latest labelled 'main')" in seen[1]
    assert "orch:***@" in seen[0]  # the recorded argv, masked


def test_drivers_opening_a_fresh_database_at_once_migrate_it_once(pg_server):
    """Four drivers (threads here: they meet at a barrier and open within a millisecond) on each
    of several fresh databases: every one opens, each database ends at the current schema."""
    import threading

    for round_ in range(6):
        url = pg_server.create_database(f"race{os.getpid()}_{round_}")
        barrier, errors = threading.Barrier(4), []

        def open_it(barrier=barrier, url=url, errors=errors):  # bound now: the loop moves on
            barrier.wait()
            try:
                ResultStore(url).close()
            except Exception as e:  # noqa: BLE001 - collected and asserted below
                errors.append(e)

        threads = [threading.Thread(target=open_it) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == [], errors
        with ResultStore(url) as store:
            assert store.schema_version() == SCHEMA_VERSION


def test_a_bad_url_is_exit_2_without_a_traceback(capsys):
    code, _, err = _cli(capsys, "report", "--db", "postgresql://u:secret@host:notaport/db")
    assert code == 2 and len(err.splitlines()) == 1 and "secret" not in err


def test_sqlite_takes_concurrent_drivers_on_one_machine(tmp_path):
    """Three writer processes, each its own run of one file, committing at once: WAL and the busy
    timeout serialise their transactions; every result of every run is there."""
    db = str(tmp_path / "r.db")
    ResultStore(db).close()
    go = str(tmp_path / "go")
    script = textwrap.dedent(
        """
        import os, sys, time
        sys.path.insert(0, {repo!r})
        from orchestrator.store import NewRun, ResultStore
        from tests.results import samples
        cases = samples.make_cases()
        s = ResultStore({db!r})
        rid = s.create_run(NewRun(matrix="m.yaml", cases=cases), lock_writer=True)
        while not os.path.exists({go!r}):
            time.sleep(0.005)
        for r in samples.make_results(cases):
            s.record(rid, r)
        s.finish_run(rid, "finished")
        """
    ).format(repo=REPO, db=db, go=go)
    procs = [subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    import time

    time.sleep(3)
    open(go, "w").close()
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errs
    with ResultStore(db, readonly=True) as store:
        runs = store.runs()
        assert len(runs) == 3 and all(r.status == "finished" and r.num_results == 32 for r in runs)


def test_a_missing_driver_is_a_clear_input_error(monkeypatch):
    """Without psycopg a postgresql:// --db says how to get it (exit 2), not an ImportError."""
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what an install without the extra sees
    with pytest.raises(InputError, match=r"needs psycopg 3: pip install 'orch\[postgres\]'"):
        ResultStore("postgresql://u:p@localhost/db")
