"""Results store on real SQLite: round trips, resume, history, durability, and refusing bad files."""

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
from orchestrator.store import MIGRATIONS, SCHEMA_VERSION, NewRun, ResultStore, resolve_baseline
from tests.results import samples

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def cases():
    return samples.make_cases()


def test_results_round_trip_exactly(tmp_path, cases):
    results = samples.make_results(cases)
    with ResultStore(str(tmp_path / "r.db")) as store:
        rid = store.create_run(
            NewRun(matrix="m.yaml", cases=cases, argv=["orch", "run"], devices="cpu", versions={"torch": "2.13"})
        )
        for r in results:
            store.record(rid, r)
        store.finish_run(rid, "finished")
        assert store.results(rid) == sorted(results, key=lambda r: r.case_id)
        assert store.planned_cases(rid) == cases
        info = store.run(rid)
        assert (info.status, info.num_cases, info.num_results, info.argv) == ("finished", 32, 32, ["orch", "run"])
        assert info.finished_at is not None and info.versions == {"torch": "2.13"}


def test_record_upserts_latest_attempt_and_keeps_the_attempt_log(tmp_path, cases):
    c = cases[0]
    with ResultStore(str(tmp_path / "r.db")) as store:
        rid = store.create_run(NewRun(matrix="m.yaml", cases=cases))
        store.record(rid, samples.result_for(c, Status.TIMEOUT, attempts=1))
        store.record(rid, samples.result_for(c, Status.PASS, attempts=2))
        [only] = store.results(rid)
        assert (only.status, only.attempts) == (Status.PASS, 2)
        assert [a["status"] for a in store.attempt_log(rid, c.case_id)] == ["timeout", "pass"]


def test_missing_case_ids_drive_resume(tmp_path, cases):
    with ResultStore(str(tmp_path / "r.db")) as store:
        rid = store.create_run(NewRun(matrix="m.yaml", cases=cases))
        for r in samples.make_results(cases)[:10]:
            store.record(rid, r)
        assert store.missing_case_ids(rid) == [c.case_id for c in cases[10:]]


def test_history_and_durations_across_runs(tmp_path, cases):
    c = cases[3]
    with ResultStore(str(tmp_path / "r.db")) as store:
        statuses = [Status.PASS, Status.FAIL, Status.FAIL]
        for i, st in enumerate(statuses):
            rid = store.create_run(NewRun(matrix="m.yaml", cases=cases))
            store.record(rid, samples.result_for(c, st, timings={"total_s": 10.0 + i}))
        hist = store.history(c.case_id)
        assert [(run, r.status) for run, r in hist] == [(3, Status.FAIL), (2, Status.FAIL), (1, Status.PASS)]
        assert store.history(c.case_id, limit=1)[0][0] == 3
        assert store.durations() == {c.case_id: 12.0}
        # A skip has no meaningful duration and must not replace the last real one.
        rid = store.create_run(NewRun(matrix="m.yaml", cases=cases))
        store.record(rid, samples.result_for(c, Status.SKIP, timings={"total_s": 0.0}))
        assert store.durations() == {c.case_id: 12.0}


def test_resolve_baseline_by_run_id_and_by_other_db(tmp_path, cases):
    other = tmp_path / "main.db"
    with ResultStore(str(other)) as s:
        rid = s.create_run(NewRun(matrix="m.yaml", cases=cases))
        s.record(rid, samples.result_for(cases[0], Status.FAIL))
    with ResultStore(str(tmp_path / "r.db")) as store:
        r1 = store.create_run(NewRun(matrix="m.yaml", cases=cases))
        store.record(r1, samples.result_for(cases[1]))
        r2 = store.create_run(NewRun(matrix="m.yaml", cases=cases))
        assert [r.case_id for r in resolve_baseline("1", store, r2)] == [cases[1].case_id]
        assert [r.status for r in resolve_baseline(str(other), store, r2)] == [Status.FAIL]
        assert resolve_baseline(None, store, r2) is None
        for bad in ("7", str(r2), str(tmp_path / "nope.db")):
            with pytest.raises(InputError):
                resolve_baseline(bad, store, r2)


WRITER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {repo!r})
    from orchestrator.store import NewRun, ResultStore
    from tests.results import samples
    cases = samples.make_cases()
    store = ResultStore({db!r})
    rid = store.create_run(NewRun(matrix="m.yaml", cases=cases))
    for i, r in enumerate(samples.make_results(cases)):
        if i == 13:
            os._exit(9)  # the driver dies mid-run: no close, no finish_run, no atexit
        store.record(rid, r)
    """
)


def test_every_recorded_result_survives_a_killed_writer(tmp_path, cases):
    db = str(tmp_path / "r.db")
    proc = subprocess.run(
        [sys.executable, "-c", WRITER.format(repo=REPO, db=db)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 9, proc.stderr
    with ResultStore(db) as store:
        rid = store.latest_run_id()
        assert store.run(rid).status == "running"
        assert len(store.results(rid)) == 13
        assert store.missing_case_ids(rid) == [c.case_id for c in cases[13:]]


def test_store_uses_wal_and_never_synchronous_off(tmp_path):
    with ResultStore(str(tmp_path / "r.db")) as store:
        assert store._sql("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store._sql("PRAGMA synchronous").fetchone()[0] >= 1  # 1 NORMAL, 2 FULL; 0 OFF forbidden


def _cli(capsys, *argv):
    code = cli_main(list(argv))
    err = capsys.readouterr().err.strip()
    return code, err


def test_corrupt_file_is_exit_2_one_line_and_untouched(tmp_path, capsys):
    db = tmp_path / "r.db"
    junk = b"this is not sqlite at all\n" * 200
    db.write_bytes(junk)
    code, err = _cli(capsys, "report", "--db", str(db))
    assert code == 2 and len(err.splitlines()) == 1 and str(db) in err
    with pytest.raises(InputError):
        ResultStore(str(db))  # writer mode must refuse too, not recreate
    assert db.read_bytes() == junk


def test_foreign_sqlite_database_is_refused(tmp_path, capsys):
    db = tmp_path / "app.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE users (id INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(InputError, match="not an orch results database"):
        ResultStore(str(db))
    code, err = _cli(capsys, "gate", "--db", str(db))
    assert code == 2 and "not an orch results database" in err


def test_newer_schema_is_exit_2(tmp_path, capsys):
    db = str(tmp_path / "r.db")
    ResultStore(db).close()
    con = sqlite3.connect(db)
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    con.commit()
    con.close()
    with pytest.raises(InputError, match="schema version"):
        ResultStore(db)
    code, err = _cli(capsys, "report", "--db", db)
    assert code == 2 and f"schema version {SCHEMA_VERSION + 1}" in err and len(err.splitlines()) == 1


def test_migrates_a_version_1_database_keeping_its_data(tmp_path, cases):
    db = str(tmp_path / "v1.db")
    con = sqlite3.connect(db)
    con.executescript(MIGRATIONS[0])
    con.execute("INSERT INTO meta VALUES ('app', 'orch-results'), ('schema_version', '1')")
    con.execute(
        "INSERT INTO runs(matrix, matrix_sha, git_sha, started_at, status, cluster, devices, versions, argv)"
        " VALUES ('old.yaml', '', '', 1.0, 'finished', '', 'cpu', '{}', '[]')"
    )
    con.commit()
    con.close()
    with pytest.raises(InputError, match="old schema"):
        ResultStore(db, readonly=True)  # a reader cannot migrate; says how to fix
    with ResultStore(db) as store:
        assert store.schema_version() == SCHEMA_VERSION
        assert store.run(1).matrix == "old.yaml"
        rid = store.create_run(NewRun(matrix="m.yaml", cases=cases))
        store.record(rid, samples.result_for(cases[0]))
        assert store.attempt_log(rid, cases[0].case_id)[0]["status"] == "pass"


def test_unwritable_location_is_infra_error(tmp_path, capsys):
    with pytest.raises(InfraError):
        ResultStore(str(tmp_path))  # a folder: no database can be created there


def test_a_missing_folder_of_the_store_is_never_created(tmp_path, capsys):
    # A typo in --db must not start a new, empty history (no baseline, no flakiness) elsewhere.
    code, err = _cli(capsys, "report", "--db", str(tmp_path / "nope" / "r.db"))
    assert code == 2 and "no results database here" in err
    with pytest.raises(InputError, match=r"no folder .*nope for the results database: create it first"):
        ResultStore(str(tmp_path / "nope" / "r.db"))
    assert not (tmp_path / "nope").exists()


def test_missing_db_for_readers_is_input_error(tmp_path, capsys):
    code, err = _cli(capsys, "gate", "--db", str(tmp_path / "nope.db"))
    assert code == 2 and "no results database" in err


def test_a_first_attempt_awaiting_its_retry_is_not_a_final_verdict(tmp_path, cases):
    # Before: a failed first attempt counted as done, so --resume after a driver kill skipped it.
    with ResultStore(str(tmp_path / "r.db")) as store:
        rid = store.create_run(NewRun(matrix="m.yaml", cases=cases[:3]))
        store.record(rid, samples.result_for(cases[0], Status.FAIL), final=False)
        store.record(rid, samples.result_for(cases[1]))
        assert store.missing_case_ids(rid) == [cases[0].case_id, cases[2].case_id]
        assert store.run(rid).num_results == 1
        store.record(rid, samples.result_for(cases[0], Status.FAIL, attempts=2))
        assert store.missing_case_ids(rid) == [cases[2].case_id]


def test_group_commit_is_one_transaction_visible_to_a_reader_when_it_returns(tmp_path, cases):
    db = str(tmp_path / "r.db")
    with ResultStore(db) as store:
        rid = store.create_run(NewRun(matrix="m.yaml", cases=cases))
        before = os.stat(db + "-wal").st_size
        store.record_many(rid, [(samples.result_for(c), True) for c in cases])
        with ResultStore(db, readonly=True) as reader:  # another connection: committed, not cached
            assert reader.run(rid).num_results == len(cases) and reader.missing_case_ids(rid) == []
        assert len(store.attempt_log(rid, cases[5].case_id)) == 1
        assert os.stat(db + "-wal").st_size > before
        # A failing statement rolls the whole group back: nothing half-written.
        bad = samples.result_for(cases[0]).replace(case_id=None)  # NOT NULL fails mid-transaction
        with pytest.raises(InputError):
            store.record_many(rid, [(samples.result_for(cases[1], Status.FAIL), True), (bad, True)])
        assert store.results(rid)[1].status == Status.PASS


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


def _holder(db: str) -> tuple[subprocess.Popen, int]:
    """A driver in another process writing (holding the lock of) a new run of `db`."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER.format(repo=REPO, db=db)], stdout=subprocess.PIPE, text=True)
    word, rid = p.stdout.readline().split()
    assert word == "locked"
    return p, int(rid)


def test_the_writer_lock_is_per_run_and_a_killed_drivers_is_taken_over(tmp_path, cases):
    db = str(tmp_path / "r.db")
    holder, rid = _holder(db)
    try:
        with ResultStore(db) as store:
            # Another driver of the same database writes a run of its own beside the holder...
            mine = store.create_run(NewRun(matrix="m.yaml", cases=cases[:2]), lock_writer=True)
            assert mine != rid and store.writer_of(mine)["pid"] == os.getpid()
            # ...but the holder's run has one writer: a second one (a --resume beside it) is refused.
            with pytest.raises(
                InfraError, match=f"another orch driver \\(pid {holder.pid} on .* is writing run {rid} "
            ):
                store.acquire_writer(rid)
    finally:
        holder.kill()
        holder.wait()
    with ResultStore(db) as store:  # the holder was SIGKILLed: its lock is stale
        note = store.acquire_writer(rid)
        assert f"took over run {rid}'s writer lock of pid {holder.pid}" in note
        assert store.acquire_writer(rid) == ""  # re-entrant for the same driver
        store.release_writer(rid)
        assert store.writer_of(rid) is None and store.writer_of(mine) is not None  # only run rid's lock went


def test_a_reused_pid_does_not_keep_a_stale_lock(tmp_path, cases):
    db = str(tmp_path / "r.db")
    with ResultStore(db) as store:
        rid = store.create_run(NewRun(matrix="m.yaml", cases=cases[:1]), lock_writer=True)
        # The recorded writer: a live process (pid 1) whose start time is not the recorded one.
        store._sql("UPDATE run_writer SET pid = 1, pid_start = 'not-its-start'")
    with ResultStore(db) as store:
        assert f"took over run {rid}'s writer lock of pid 1" in store.acquire_writer(rid)


def test_resume_beside_a_live_driver_is_exit_3_in_one_line(tmp_path, capsys):
    db = str(tmp_path / "r.db")
    holder, rid = _holder(db)
    try:
        code, err = _cli(
            capsys,
            "run",
            "matrices/smoke.yaml",
            "--db",
            db,
            "--out",
            str(tmp_path / "o"),
            "--devices",
            "cpu",
            "--resume",
            str(rid),
        )
    finally:
        holder.kill()
        holder.wait()
    assert code == 3 and len(err.splitlines()) == 1, err
    assert f"pid {holder.pid}" in err and f"is writing run {rid} of this database" in err and db in err
