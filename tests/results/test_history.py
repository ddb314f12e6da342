"""The gate against history: baselines by label, flakiness over a window, muted entries and the
paste-ready entries for new failures, on a real SQLite store."""

from __future__ import annotations

import datetime as dt

import pytest

from backend.result import Status
from orchestrator import flakiness, suggest
from orchestrator.cli import main as cli_main
from orchestrator.errors import ExitCode, InputError
from orchestrator.gate import evaluate
from orchestrator.judging import Judging
from orchestrator.known_failures import parse
from orchestrator.outputs import gather
from orchestrator.store import NewRun, ResultStore, find_baseline
from tests.results import samples

CASES = samples.make_cases()
C = CASES[0]


def _run(
    store,
    statuses: dict[str, Status] | None = None,
    *,
    label="main",
    matrix="matrices/sample.yaml",
    device="cpu",
    finish=True,
) -> int:
    """A run of the sample matrix: every case passes unless `statuses` says otherwise."""
    statuses = statuses or {}
    rid = store.create_run(NewRun(matrix=matrix, cases=CASES, label=label))
    store.record_many(
        rid, [(samples.result_for(c, statuses.get(c.case_id, Status.PASS), device=device), True) for c in CASES]
    )
    if finish:
        store.finish_run(rid, "finished")
    return rid


# scenario -> (runs before the gated one: (label, matrix, device, finished), expected baseline index or None)
BASELINES = {
    "the latest finished run of the label": ([("main", "m", "cpu", True), ("main", "m", "cpu", True)], 1),
    "another label's run is not it": ([("main", "m", "cpu", True), ("pr-7", "m", "cpu", True)], 0),
    "an unfinished run is not it": ([("main", "m", "cpu", True), ("main", "m", "cpu", False)], 0),
    "another matrix's run is not it": ([("main", "m", "cpu", True), ("main", "other", "cpu", True)], 0),
    "another device's run is not it": (
        [("main", "m", "cpu", True), ("main", "m", "NVIDIA H100 80GB HBM3 (cuda:0)", True)],
        0,
    ),
    "none at all: gated without one": ([("pr-7", "m", "cpu", True)], None),
}


@pytest.mark.parametrize("scenario", BASELINES)
def test_baseline_by_label(tmp_path, scenario):
    before, expected = BASELINES[scenario]
    with ResultStore(str(tmp_path / "r.db")) as store:
        ids = [_run(store, label=l, matrix=f"matrices/{m}.yaml", device=d, finish=f) for l, m, d, f in before]
        current = _run(store, label="pr-9", matrix="matrices/m.yaml")
        found = find_baseline("main", store, current)
        if expected is None:
            assert found.results is None and found.note.startswith("no baseline: no run labelled 'main'")
        else:
            assert found.run.id == ids[expected] and "latest labelled 'main'" in found.where


def test_a_label_baseline_is_what_was_known_when_the_run_started(tmp_path):
    """A main run that finishes after the gated run began is not its baseline, so `orch gate`
    later gives the verdict `orch run` gave."""
    with ResultStore(str(tmp_path / "r.db")) as store:
        old = _run(store, label="main")
        late = _run(store, label="main", finish=False)
        current = _run(store, label="pr-9")
        store.finish_run(late, "finished")
        assert find_baseline("main", store, current).run.id == old


REFS = {
    "a run id": ("1", 1),
    "a label": ("main", 2),
    "another store, its latest run": ("{other}", 1),
    "another store's run": ("{other}#1", 1),
    "another store's label": ("{other}#main", 1),
}


@pytest.mark.parametrize("scenario", REFS)
def test_baseline_references(tmp_path, scenario):
    other = str(tmp_path / "other.db")
    with ResultStore(other) as s:
        _run(s, {C.case_id: Status.FAIL}, label="main")
    spec, run = REFS[scenario]
    with ResultStore(str(tmp_path / "r.db")) as store:
        _run(store, label="x")
        _run(store, label="main")
        current = _run(store, label="pr")
        found = find_baseline(spec.format(other=other), store, current)
        assert found.run.id == run
        status = {r.case_id: r.status for r in found.results}[C.case_id]
        assert (status == Status.FAIL) == ("other" in spec)


@pytest.mark.parametrize("spec", ["7", "3", "{db}", "missing.db", "{db}#latest"])
def test_a_bad_baseline_reference_is_an_input_error(tmp_path, spec):
    db = str(tmp_path / "r.db")
    with ResultStore(db) as store:
        _run(store)
        _run(store)
        current = _run(store)
        with pytest.raises(InputError):
            find_baseline(spec.format(db=db), store, current)


# scenario -> (statuses oldest first, flips, retried, score)
FLAKINESS = {
    "steady pass": (["pass"] * 5, 0, 0, 0.0),
    "steady failure": (["fail"] * 5, 0, 0, 0.0),
    "one regression": (["pass"] * 4 + ["fail"], 1, 0, 1 / 9),
    "flipping every run": (["pass", "fail", "pass", "fail"], 3, 0, 3 / 7),
    "flaky on retry twice": (["pass", "flaky", "pass", "flaky"], 0, 2, 2 / 7),
    "skips and not-runs are not observed": (["pass", "skip", "not-run", "fail"], 1, 0, 1 / 3),
    "nothing observed": (["skip"], 0, 0, 0.0),
}


@pytest.mark.parametrize("scenario", FLAKINESS)
def test_flakiness_score(scenario):
    statuses, flips, retried, score = FLAKINESS[scenario]
    f = flakiness.score(statuses)
    assert (f.flips, f.retried) == (flips, retried) and f.score == pytest.approx(score)


def test_a_case_flaky_over_the_window_does_not_gate_one_steady_before_does(tmp_path):
    flip, steady = CASES[1].case_id, CASES[2].case_id
    with ResultStore(str(tmp_path / "r.db")) as store:
        for i in range(6):  # `flip` fails every other run of main; `steady` always passes
            _run(store, {flip: Status.FAIL} if i % 2 == 0 else {}, label="main")
        current = _run(store, {flip: Status.FAIL, steady: Status.FAIL}, label="pr-1")
        view = gather(store, current, Judging(baseline="main", flaky_window=5, flaky_threshold=0.3))
        assert view.gate.classification[flip] == "flaky" and flip in view.gate.flaky_history
        assert view.gate.classification[steady] == "regression" and view.gate.exit_code == ExitCode.GATE_FAILED
        assert view.flakiness[flip].runs == 5 and view.flakiness[flip].flips == 4
        assert len(view.window) == 5 and current not in view.window
        # Without a threshold the scores are shown, never used.
        assert gather(store, current, Judging(baseline="main")).gate.classification[flip] == "regression"


def test_muted_cases_run_report_their_status_and_never_gate():
    kf = parse('- case: "tp1-*"\n  reason: r\n  link: https://example.invalid/1\n  until: 2999-01-01\n  mute: true\n')
    results = [samples.result_for(c, Status.FAIL if c.tp == 1 else Status.PASS) for c in CASES]
    out = evaluate(results, known=kf)
    tp1 = [c.case_id for c in CASES if c.tp == 1]
    assert out.passed and set(out.muted) == set(tp1) and not out.fixed  # a passing muted case is not "fixed"
    assert all(out.classification[cid] == "muted" for cid in tp1) and "16 muted" in out.verdict()
    # Expired, the same entry no longer mutes: the failures gate again, and say which entry.
    expired = type(kf)(kf.entries, "kf.yaml", today=dt.date(3000, 1, 1))
    out = evaluate(results, known=expired)
    assert not out.passed and set(out.expired) == set(tp1)


# scenario -> (failing when(case) , expected globs)
SUGGESTIONS = {
    "FULL with fp8, every tp and batch": (
        lambda c: c.mode == "FULL" and c.kv_cache_dtype == "fp8",
        ["tp*-FULL-fp8-*-torch-s0"],
    ),
    "one case": (lambda c: c.case_id == C.case_id, [C.case_id]),
    "two separate causes": (
        lambda c: (c.mode == "NONE" and c.batch.name == "mixed") or (c.tp == 2 and c.mode == "FULL"),
        ["tp*-NONE-*-mixed-torch-s0", "tp2-FULL-*-*-torch-s0"],
    ),
}


@pytest.mark.parametrize("scenario", SUGGESTIONS)
def test_paste_ready_entries_are_narrowed_to_the_axes_that_failed(scenario):
    fails, expected = SUGGESTIONS[scenario]
    results = [samples.result_for(c, Status.FAIL if fails(c) else Status.PASS) for c in CASES]
    failing = [r.case_id for r in results if r.status == Status.FAIL]
    found = suggest.suggest(results, failing, today=dt.date(2026, 12, 6))
    assert sorted(s.pattern for s in found) == sorted(expected)
    assert sorted(cid for s in found for cid in s.cases) == sorted(failing)  # each failure covered once
    # Pasted as is, the entries parse and cover exactly the failures.
    kf = parse(suggest.render(found), "new.yaml")
    assert {c.case_id for c in CASES if kf.match(c.case_id)} == set(failing)
    assert all(e.until == dt.date(2027, 1, 5) for e in kf.entries)


def test_orch_gate_prints_the_entries_and_the_baseline(tmp_path, capsys):
    db = str(tmp_path / "r.db")
    with ResultStore(db) as store:
        _run(store, label="main")
        _run(
            store, {c.case_id: Status.FAIL for c in CASES if c.mode == "FULL" and c.kv_cache_dtype == "fp8"}, label="pr"
        )
    assert cli_main(["gate", "--db", db, "--baseline", "main"]) == 1
    out = capsys.readouterr().out
    assert "baseline: run 1 (latest labelled 'main')" in out
    assert 'case: "tp*-FULL-fp8-*-torch-s0"   # 4 failing case(s)' in out
