"""benchmarks/diff_verdicts.py: two runs with the same verdicts are equal (exit 0); one changed
status, one changed check, or a case missing on one side is found (exit 1); bad input is one line,
exit 2."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from benchmarks import diff_verdicts
from tests.results.samples import write_sample_db


@pytest.fixture
def two(tmp_path):
    db, _ = write_sample_db(tmp_path)
    other = str(tmp_path / "copy.db")
    shutil.copy(db, other)
    return db, other


def _edit(path, sql, *params):
    with sqlite3.connect(path) as con:
        con.execute(sql, params)


def test_the_same_run_has_the_same_verdicts(two, capsys):
    assert diff_verdicts.main([*two, "--checks"]) == 0
    assert "0 different" in capsys.readouterr().out


@pytest.mark.parametrize(
    "breakage, flags",
    [
        (
            "UPDATE results SET status = 'fail' WHERE case_id = (SELECT case_id FROM results WHERE status = 'pass' AND run_id = 2 LIMIT 1) AND run_id = 2",
            [],
        ),
        (
            "DELETE FROM results WHERE run_id = 2 AND case_id = (SELECT case_id FROM results WHERE run_id = 2 LIMIT 1)",
            [],
        ),
        (
            "UPDATE results SET checks = '[]' WHERE run_id = 2 AND checks != '[]' AND case_id = (SELECT case_id FROM results WHERE run_id = 2 AND checks != '[]' LIMIT 1)",
            ["--checks"],
        ),
    ],
)
def test_a_changed_verdict_is_found(two, capsys, breakage, flags):
    before, after = two
    _edit(after, breakage)
    assert diff_verdicts.main([before, after, *flags]) == 1
    out = capsys.readouterr().out
    assert "1 different" in out and "->" in out


def test_timings_are_not_verdicts(two):
    before, after = two
    _edit(after, "UPDATE results SET timings = '{\"total_s\": 999}' WHERE run_id = 2")
    assert diff_verdicts.main([before, after, "--checks"]) == 0


@pytest.mark.parametrize("argv_tail, needle", [(["--runs", "1", "99"], "99"), (None, "no such results database")])
def test_bad_input_is_one_line_exit_2(two, tmp_path, capsys, argv_tail, needle):
    before, after = two
    argv = [before, after, *argv_tail] if argv_tail else [before, str(tmp_path / "nope.db")]
    assert diff_verdicts.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("diff_verdicts:") and len(err.splitlines()) == 1 and needle in err
