"""Writability is known before the work: a read-only --out stops `orch run` before its first case
(exit 3, one line, no run recorded); commands that only read a store read a read-only one.
Run without write access: as root, with every capability dropped (setpriv), so file modes apply."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time

import pytest

from orchestrator.store import ResultStore
from tests.results import samples

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _orch(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m orchestrator.cli ARGV` without the power to write where file modes forbid it."""
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv: file modes cannot be made to apply")
        prefix = ["setpriv", "--bounding-set", "-all", "--inh-caps", "-all", "--"]
    return subprocess.run(
        [*prefix, sys.executable, "-m", "orchestrator.cli", *argv],
        check=False,
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _read_only(path) -> None:
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def test_a_read_only_out_stops_the_run_before_any_case(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    _read_only(out)
    db = tmp_path / "r.db"
    t0 = time.monotonic()
    got = _orch(
        "run",
        "matrices/smoke.yaml",
        "--filter",
        "attention=gqa tp=1 cudagraph_mode=NONE kv_cache_dtype=auto",
        "--devices",
        "cpu",
        "--db",
        str(db),
        "--out",
        str(out),
        "--no-progress",
    )
    assert got.returncode == 3 and got.stderr.strip() == f"orch: {out}: cannot write outputs: Permission denied", got
    assert got.stdout == "" and not db.exists() and time.monotonic() - t0 < 60  # no store, no cluster, no case


def test_readers_read_a_read_only_store(tmp_path):
    folder = tmp_path / "store"
    folder.mkdir()
    db, _ = samples.write_sample_db(folder)
    with ResultStore(db) as s:  # a WAL database, as every writer leaves it
        assert s._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    _read_only(folder)
    for argv, verdict in (
        (["report"], "gate FAILED"),
        (["gate", "--run", "1"], "gate FAILED"),
        (["diff", "1", "2"], "diff FAILED"),
    ):
        got = _orch(*argv, "--db", db)
        assert got.returncode == 1 and verdict in got.stdout and got.stderr == "", got
    got = _orch("dashboard", "--db", db, "--out", str(tmp_path / "site"))
    assert got.returncode == 0 and "(run 2)" in got.stdout, got
    # A writer is refused at once, before any case.
    got = _orch("run", "matrices/smoke.yaml", "--devices", "cpu", "--db", db, "--out", str(tmp_path / "o"))
    assert got.returncode == 3 and "results database not writable" in got.stderr and got.stdout == "", got
