"""`orch diff RUN_A RUN_B` on real stores: changes grouped by transition and axis, versions side
by side, exit 1 only when a case regressed, across a SQLite file and a PostgreSQL database."""

from __future__ import annotations

import json

import pytest

from backend.result import CheckOutcome, Status
from orchestrator.cli import main as cli_main
from orchestrator.store import NewRun, ResultStore
from tests.results import samples

CASES = samples.make_cases()
FULL_FP8 = [c for c in CASES if c.mode == "FULL" and c.kv_cache_dtype == "fp8"]


def _write(path: str, changes: dict[str, dict], versions: dict | None = None, label: str = "") -> None:
    """A store with one finished run: every case passes unless `changes` says otherwise."""
    with ResultStore(path) as s:
        rid = s.create_run(NewRun(matrix="matrices/sample.yaml", cases=CASES, label=label, versions=versions or {}))
        worker = {"versions": versions} if versions else {}  # what the workers ran with
        s.record_many(rid, [(samples.result_for(c, **{**worker, **changes.get(c.case_id, {})}), True) for c in CASES])
        s.finish_run(rid, "finished")


def _diff(capsys, *argv):
    code = cli_main(["diff", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


BAD_CHECKS = (CheckOutcome("replay", False, step=2, max_abs_err=0.5),)
# scenario -> (B's changes against an all-pass A, extra flags, exit code, lines expected in the output)
SCENARIOS = {
    "the same verdicts": ({}, [], 0, ["0 regressed, 0 changed, 32 the same", "diff PASSED: no case regressed"]),
    "FULL fp8 regressed": (
        {c.case_id: {"status": Status.FAIL} for c in FULL_FP8},
        [],
        1,
        [
            "4 regressed, 4 changed, 28 the same",
            "pass -> fail  4: tp*-FULL-fp8-*-torch-s0",
            "by axis: tp 1 2, 2 2; cudagraph_mode FULL 4; kv_cache_dtype fp8 4; batch decode4 2, mixed 2",
            "diff FAILED: 4 case(s) regressed from run 1 to run 1",
        ],
    ),
    "pass to flaky is a change, not a regression": (
        {CASES[0].case_id: {"status": Status.FLAKY}},
        [],
        0,
        ["pass -> flaky  1: " + CASES[0].case_id],
    ),
    "a check that changed, only with --checks": (
        {CASES[0].case_id: {"checks": BAD_CHECKS}},
        ["--checks"],
        0,
        ["pass -> pass (checks)  1:"],
    ),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_diff_groups_changes_by_transition_and_axis(tmp_path, capsys, scenario):
    changes, flags, code, expected = SCENARIOS[scenario]
    a, b = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    _write(a, {})
    _write(b, changes)
    got, out, err = _diff(capsys, a, b, *flags)
    assert got == code, out + err
    for line in expected:
        assert line in out, out


def test_a_case_only_on_one_side_is_listed_and_is_no_regression(tmp_path, capsys):
    a, b = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    _write(a, {})
    with ResultStore(b) as s:
        rid = s.create_run(NewRun(matrix="matrices/sample.yaml", cases=CASES[1:]))
        s.record_many(rid, [(samples.result_for(c), True) for c in CASES[1:]])
    code, out, _ = _diff(capsys, a, b, "-v")
    assert code == 0 and f"pass -> absent  1: {CASES[0].case_id}" in out and f"    {CASES[0].case_id}" in out


def test_diff_across_sqlite_and_postgresql_with_versions_side_by_side(tmp_path, pg_url, pg_server, capsys):
    a = str(tmp_path / "pinned.db")
    _write(a, {}, versions={"torch": "2.13.0", "vllm": "0.34.0"}, label="pinned")
    _write(
        pg_url,
        {c.case_id: {"status": Status.ERROR} for c in FULL_FP8[:1]},
        versions={"torch": "2.14.0", "vllm": "0.34.0"},
        label="nightly",
    )
    code, out, _ = _diff(capsys, f"{a}#pinned", f"{pg_url}#nightly")
    assert code == 1 and pg_server.password not in out
    assert "  torch  2.13.0 | 2.14.0  *" in out and "  vllm   0.34.0 | 0.34.0\n" in out
    assert f"pass -> error  1: {FULL_FP8[0].case_id}" in out
    code, out, _ = _diff(capsys, f"{a}#1", f"{pg_url}#1", "--json")
    data = json.loads(out)
    assert data["regressions"] == [FULL_FP8[0].case_id] and data["versions"]["torch"] == {"a": "2.13.0", "b": "2.14.0"}


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["1", "9"], "no run 9"),
        (["1", "nolabel"], "no finished run labelled 'nolabel'"),
        (["{tmp}/missing.db", "1"], "no results database here"),
    ],
)
def test_a_bad_run_reference_is_exit_2_in_one_line(tmp_path, capsys, argv, needle):
    db = str(tmp_path / "r.db")
    _write(db, {})
    code, _out, err = _diff(capsys, "--db", db, *[a.format(tmp=tmp_path) for a in argv])
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


def test_every_glob_or_how_many_more(tmp_path, capsys):
    """A transition whose cases need more globs than a line shows says how many it left out; -v
    prints every one (a fixed cut once dropped them without a word)."""
    from orchestrator import diff as d
    from orchestrator.commands.diff import GLOBS

    def odd(c) -> bool:  # a checkerboard over the axes: no glob covers two of these cases
        return (c.tp + samples.MODES.index(c.mode) + (c.kv_cache_dtype == "fp8") + (c.batch.name == "mixed")) % 2 == 1

    scattered = {c.case_id for c in CASES if odd(c)}
    a, b = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    _write(a, {})
    _write(b, {cid: {"status": Status.FAIL} for cid in scattered})
    with ResultStore(a) as sa, ResultStore(b) as sb:
        before, after = sa.results(1), sb.results(1)
    globs = d.describe(d.compare(before, after).changes, after, before)
    assert len(globs) > GLOBS
    _, out, _ = _diff(capsys, a, b)
    line = next(ln for ln in out.splitlines() if ln.startswith("pass -> fail"))
    assert line.endswith(f"{', '.join(globs[:GLOBS])} and {len(globs) - GLOBS} more"), line
    _, out, _ = _diff(capsys, a, b, "-v")
    line = next(ln for ln in out.splitlines() if ln.startswith("pass -> fail"))
    assert line.endswith(", ".join(globs)), line
