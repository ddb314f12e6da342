"""A case's device memory in every output that shows a run: the report, the summary,
the dashboard's view model, and `orch plan`'s per-worker need, from the store's recorded needs."""

from __future__ import annotations

import json

from backend.case import BatchSpec, Case
from backend.result import Status
from orchestrator.cli import main
from orchestrator.dashboard.build import page_data
from orchestrator.outputs import gather, memory_line
from orchestrator.store import NewRun, ResultStore
from tests.results.samples import result_for

GIB = 1024**3


def _cases():
    return [Case("torch", 1, "FULL", "auto", BatchSpec(f"b{i}", (1,), (8,)), matrix="m.yaml") for i in range(3)]


def _store(tmp_path) -> tuple[str, list[Case]]:
    cases = _cases()
    mem = [
        {
            "peak_allocated": 9 * GIB,
            "peak_reserved": 10 * GIB,
            "needs": 7 * GIB,
            "session": 6 * GIB,
            "budget": 18 * GIB,
        },
        {
            "peak_allocated": 12 * GIB,
            "peak_reserved": 13 * GIB,
            "needs": 11 * GIB,
            "session": 9 * GIB,
            "budget": 18 * GIB,
        },
        {"session": GIB},
    ]  # a CPU result: its session only
    path = str(tmp_path / "r.db")
    with ResultStore(path) as s:
        rid = s.create_run(NewRun(matrix="m.yaml", cases=cases))
        s.record_many(rid, [(result_for(c, Status.PASS).replace(memory=m), True) for c, m in zip(cases, mem)])
        s.finish_run(rid, "finished")
    return path, cases


def test_the_report_summary_and_dashboard_show_the_runs_device_memory(tmp_path, capsys):
    path, cases = _store(tmp_path)
    line = (
        "device memory: peak reserved 13.00 GiB ("
        + cases[1].case_id
        + "), largest need 11.00 GiB ("
        + cases[1].case_id
        + "), worker budget 18.00 GiB"
    )
    with ResultStore(path, readonly=True) as store:
        view = gather(store, None)
        assert memory_line(view.results) == line
        data = page_data(view, store.status_history())
    cell = next(c for c in data["cases"] if c["id"] == cases[1].case_id)
    assert cell["memory"]["needs"] == 11 * GIB and cell["memory"]["session"] == 9 * GIB
    assert main(["report", "--db", path]) == 0
    assert line in capsys.readouterr().out
    assert main(["report", "--db", path, "--format", "md"]) == 0
    assert line in capsys.readouterr().out


def test_a_run_without_gpu_figures_prints_no_memory_line(tmp_path):
    cases = _cases()
    with ResultStore(str(tmp_path / "r.db")) as s:
        rid = s.create_run(NewRun(matrix="m.yaml", cases=cases))
        s.record_many(rid, [(result_for(c, Status.PASS).replace(memory={"session": GIB}), True) for c in cases])
        assert memory_line(s.results(rid)) == ""


def test_plan_says_what_a_worker_needs_from_the_recorded_needs(tmp_path, capsys):
    db = str(tmp_path / "r.db")
    with ResultStore(db) as s:
        rid = s.create_run(NewRun(matrix="matrices/smoke.yaml", cases=[]))
        s.record_many(
            rid,
            [
                (
                    result_for(
                        Case("torch", 1, "FULL", "auto", BatchSpec("decode_7", (1,), (8,)), matrix="m.yaml")
                    ).replace(case_id="tp1-FULL-auto-decode_7-torch-s0", memory={"needs": 5 * GIB}),
                    True,
                )
            ],
        )
    assert main(["plan", "matrices/smoke.yaml", "--db", db, "--json", "--devices", "cpu"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory["needs_bytes"] == 5 * GIB and memory["largest_case"] == "tp1-FULL-auto-decode_7-torch-s0"
    assert memory["recorded"] == 1 and memory["per_worker_bytes"] > 5 * GIB
    assert main(["plan", "matrices/smoke.yaml", "--db", db, "--devices", "cpu"]) == 0
    assert (
        "device memory per worker: largest case needs 5.00 GiB (tp1-FULL-auto-decode_7-torch-s0)"
        in capsys.readouterr().out
    )
