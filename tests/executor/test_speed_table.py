"""benchmarks/speed_table.py's rerun tail: how long a run went on after its last case that was not
rerun for memory (the H100's families' slice: 5.8 s of 50.8 s, six cases widened to a whole GPU)."""

from __future__ import annotations

import pytest

from backend.result import CaseResult, Status
from benchmarks.speed_table import rerun_tail
from orchestrator.executor.attempts import REFRESHED, WIDENED


def _r(case_id: str, note: str = "") -> CaseResult:
    return CaseResult(case_id, Status.PASS, log_tail=f"{note}: rerun\nmore" if note else "")


@pytest.mark.parametrize("notes, finished, tail", [
    ({}, {"a": 1.0, "b": 2.0}, 0.0),                              # nothing rerun
    ({"b": WIDENED}, {"a": 3.0, "b": 5.5}, 2.5),                 # widened: after every other case
    ({"b": REFRESHED}, {"a": 3.0, "b": 2.0}, 0.0),               # a fresh worker, done before the end
    ({"b": WIDENED, "c": REFRESHED}, {"a": 1.0, "b": 4.0, "c": 2.0}, 3.0),
    ({"a": WIDENED}, {"a": 1.0}, 0.0),                            # nothing else to end before it
])  # fmt: skip # a table: one row per line, as it reads
def test_rerun_tail(notes, finished, tail):
    ran = [_r(c, notes.get(c, "")) for c in finished]
    assert rerun_tail(ran, finished) == pytest.approx(tail)


def test_the_table_of_a_store_with_a_widened_case(tmp_path):
    """The whole table from a real store: its three sections, and a case widened at the end counted
    in its run's row with the tail it made."""
    import time

    from benchmarks.speed_table import main
    from orchestrator.store import NewRun, ResultStore
    from tests.results import samples

    cases = samples.make_cases()
    db, log = tmp_path / "r.db", tmp_path / "r.log"
    log.write_text("time: first to last result 3.5s\nwall 9.0 s, max rss 1 KB\n")
    with ResultStore(str(db)) as s:
        rid = s.create_run(NewRun(matrix="matrices/sample.yaml", cases=cases))
        # Two cases built their session (0.2 s in that phase), one found it cached (2 ms).
        session_s = {cases[1].case_id: 0.2, cases[2].case_id: 0.2, cases[3].case_id: 0.002}
        ran = [samples.result_for(c) for c in cases[1:]]
        ran = [r.replace(timings={**r.timings, "session_s": session_s.get(r.case_id, 0.0)}) for r in ran]
        s.record_many(rid, [(r, True) for r in ran])
        time.sleep(0.2)  # the widened case finishes after every other one
        s.record(rid, samples.result_for(cases[0], log_tail=f"{WIDENED} 1/2 of a GPU (oom): rerun on a whole GPU"))
        s.finish_run(rid, "finished")
    out = tmp_path / "speed.md"
    assert main([f"run={db}:{log}", "--same", "run,run", "--out", str(out)]) == 0
    text = out.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| run |") and "3.5" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["run", str(len(cases)), "9.0", "3.5"] and cells[6] == "0 / 1" and float(cells[7]) >= 0.2
    summed = text.split("| run (s summed over cases) |")[1].splitlines()[2]
    built, total = summed.split("|")[2:4]
    assert int(built) == 2
    assert float(total) == pytest.approx(sum(1.5 + c.tp for c in cases))  # every case's total_s
    assert "- heaviest in run: " in text and "Error" not in text
    assert "- verdicts run vs run: identical" in text
