"""On real Ray: an out-of-memory of the harness is never the backend's verdict (the gate
lists it as infrastructure), and several workers share each GPU (fractional GPUs, whole devices
for a gang's ranks), each with its share of the memory budget."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from junitparser import Error, JUnitXml

from backend.result import CaseResult, Status
from orchestrator.commands import run as run_cmd
from orchestrator.errors import InputError
from orchestrator.executor.attempts import REFRESHED
from orchestrator.executor.packing import (
    MAX_PER_GPU,
    GiB,
    WorkerNeed,
    auto_per_gpu,
    config_widths,
    parse_gib,
    parse_workers_per_gpu,
    slot_width,
)
from orchestrator.store import ResultStore

FILTER = "attention=gqa kv_cache_dtype=auto cudagraph_mode=FULL batch=decode_7,mixed_small"  # tp 1 x2, tp 2 x1


def _run(tmp_path, backend: str, name: str, extra: str = ""):
    out = tmp_path / name
    code = run_cmd.main(
        "matrices/smoke.yaml",
        backend=f"tests.mutants.out_of_memory:{backend}",
        filter_expr=f"{FILTER} {extra}".strip(),
        db=str(tmp_path / f"{name}.db"),
        out_dir=str(out),
        devices="cpu",
        no_progress=True,
    )
    with ResultStore(str(tmp_path / f"{name}.db")) as store:
        return code, out, {r.case_id: r for r in store.results(store.latest_run_id())}


@pytest.mark.xdist_group("ray")
@pytest.mark.slow
def test_out_of_memory_that_goes_away_when_alone_is_a_pass_never_flaky(ray_cluster, tmp_path):
    # tp 1: the worker reruns the case itself (a gang's fresh processes would each run out again).
    code, _, results = _run(tmp_path, "OnceBackend", "once", "tp=1")
    assert code == 0
    assert {r.status.value for r in results.values()} == {"pass"}
    # Every worker process's first forward ran out of memory; each such case was rerun once there.
    rerun = [r for r in results.values() if "rerun once on a cleared worker" in r.log_tail]
    assert rerun and all(r.attempts == 1 for r in rerun)


@pytest.mark.xdist_group("ray")
@pytest.mark.slow
def test_out_of_memory_when_alone_is_infrastructure_in_every_output(ray_cluster, tmp_path, capsys):
    code, out, results = _run(tmp_path, "AlwaysBackend", "always")
    said = capsys.readouterr().out  # what the run concluded is on stdout
    assert code == 3  # infrastructure: nothing gates but the harness's memory
    assert {(r.status.value, r.error_kind) for r in results.values()} == {("error", "oom")}
    by_tp = {r.axes["tp"]: r for r in results.values()}
    assert by_tp[1].attempts == 1 and by_tp[1].reason.startswith("out of memory when alone")
    assert by_tp[2].attempts == 2  # a gang's ranks cannot rerun alone: the executor reran it on a fresh gang
    assert "3 out of memory (infrastructure)" in said and "flaky" not in said
    summary = (out / "summary.md").read_text()
    assert "Out of memory (infrastructure)" in summary and "New failures" not in summary
    cases = [c for suite in JUnitXml.fromfile(str(out / "junit.xml")) for c in suite]
    assert all(isinstance(c.result[0], Error) and "[oom]" in c.result[0].message for c in cases)


def _packing(tmp_path, *variant: str) -> tuple[dict, Path]:
    """tests/executor/packing_script.py at 4 workers per fake GPU: its report and its case log."""
    log = tmp_path / "cases.jsonl"
    proc = subprocess.run(
        [sys.executable, "tests/executor/packing_script.py", "4", str(log), *variant],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), log


def test_several_workers_per_gpu_take_shares_and_a_gangs_ranks_whole_devices(tmp_path):
    report, log = _packing(tmp_path)
    assert report["slots"] == 8 and report["statuses"] == ["pass"] and report["results"] == 18
    by_tp = defaultdict(list)
    for spec in report["specs"]:
        by_tp[spec["tp"]].append(spec)
    assert {s["bundle"]["GPU"] for s in by_tp[1]} == {0.25}
    assert {s["memory"]["share"] for s in by_tp[1]} == {0.25} and {s["memory"]["utilization"] for s in by_tp[1]} == {
        0.8
    }
    assert {s["bundle"]["GPU"] for s in by_tp[2]} == {1.0} and {s["memory"]["share"] for s in by_tp[2]} == {1.0}
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    tp1_pids_per_gpu = defaultdict(set)
    for r in rows:
        if r["tp"] == 1:
            assert len(r["gpus"]) == 1
            tp1_pids_per_gpu[r["gpus"][0]].add(r["pid"])
    assert sum(len(p) for p in tp1_pids_per_gpu.values()) > 2  # more workers than GPUs
    assert all(len(p) <= 4 for p in tp1_pids_per_gpu.values())
    gangs = defaultdict(set)
    for r in rows:
        if r["tp"] == 2:
            gangs[r["case"]].add(r["gpus"][0])
    assert gangs and all(len(g) == 2 for g in gangs.values())  # a gang's ranks on distinct devices
    # A gang holds whole devices: no tp 1 worker ran while a gang did.
    spans = [(r["start"], r["end"]) for r in rows if r["tp"] == 2]
    assert not any(r["tp"] == 1 and any(r["start"] < e and s < r["end"] for s, e in spans) for r in rows)


def test_a_case_that_needs_more_than_a_share_runs_on_a_wider_worker(tmp_path):
    """4 workers per fake GPU: a case recorded as needing 30 GiB of an 80 GiB device runs on a worker
    of three shares; a case that runs out of memory on one share runs again on a whole GPU, and
    its result says so (no FLAKY, no oom verdict); one that runs out of memory beside what its
    worker could not give back runs again on a fresh worker of one share; the rest run on one share
    each."""
    report, log = _packing(tmp_path, "wide")
    big, oom, kept, *rest = report["cases"]
    assert report["statuses"] == ["pass"] and report["results"] == 8
    runs, pids = defaultdict(list), defaultdict(list)
    for line in log.read_text().splitlines():
        r = json.loads(line)
        runs[r["case"]].append(r["share"])
        pids[r["case"]].append(r["pid"])
    assert runs[big] == [0.75]  # 30 GiB x 1.25 + 0.75 of 16 GiB shares (80 x 0.8 / 4): three
    assert runs[oom] == [0.25, 1.0]  # one share, out of memory, then the whole GPU
    assert runs[kept] == [0.25, 0.25] and len(set(pids[kept])) == 2  # a fresh worker, the same share
    assert all(runs[c] == [0.25] for c in rest)
    status, attempts, log_tail = report["final"][oom]
    assert (status, attempts) == ("pass", 1) and "out of device memory on a worker of 1/4 of a GPU" in log_tail
    status, attempts, log_tail = report["final"][kept]
    assert (status, attempts) == ("pass", 1) and log_tail.startswith(REFRESHED)
    assert {s["memory"]["share"] for s in report["specs"]} == {0.25, 0.75, 1.0}


def test_a_configs_modes_take_the_widest_modes_share_on_one_worker(tmp_path):
    """4 workers per fake GPU: of a config's five cudagraph modes only the first recorded a need
    (30 GiB: the mode that paid the session; the others reused it), yet all five run on one worker
    of three shares, one after another; the other configs' cases on one share each."""
    report, log = _packing(tmp_path, "config")
    modes, rest = report["cases"][:5], report["cases"][5:]
    assert report["statuses"] == ["pass"] and report["results"] == 9 and len(rest) == 4
    rows = {r["case"]: r for r in map(json.loads, log.read_text().splitlines())}
    assert {rows[c]["share"] for c in modes} == {0.75}
    assert len({rows[c]["pid"] for c in modes}) == 1
    assert {rows[c]["share"] for c in rest} == {0.25}


CONFIG_WIDTHS = [
    # (name, widths, configs, expected)
    (
        "a config at its widest mode's",
        {"a": 3, "b": 1, "c": 1},
        {"a": "x", "b": "x", "c": "x"},
        {"a": 3, "b": 3, "c": 3},
    ),
    ("configs apart", {"a": 3, "b": 1, "c": 2}, {"a": "x", "b": "y", "c": "y"}, {"a": 3, "b": 2, "c": 2}),
    ("no config keeps its own", {"a": 3, "b": 1}, {"a": "x", "b": ""}, {"a": 3, "b": 1}),
    ("unknown config keeps its own", {"a": 2, "b": 1}, {"a": "x"}, {"a": 2, "b": 1}),
]


@pytest.mark.parametrize("name,widths,configs,expected", CONFIG_WIDTHS, ids=[w[0] for w in CONFIG_WIDTHS])
def test_config_widths(name, widths, configs, expected):
    assert config_widths(widths, configs) == expected


WIDTHS = [
    # (name, need GiB, device GiB, utilization, per GPU, expected slots)
    ("fits one share", 10, 80, 0.9, 4, 1),
    ("two shares", 20, 80, 0.9, 4, 2),  # 25.75 GiB of 18 GiB shares
    ("never more than the GPU", 100, 80, 0.9, 4, 4),
    ("one worker per GPU: always one", 100, 80, 0.9, 1, 1),
    ("nothing recorded: one", 0, 80, 0.9, 4, 1),
    ("device size unknown: one", 20, None, 0.9, 4, 1),
]


@pytest.mark.parametrize("name,need,device,util,per_gpu,expected", WIDTHS, ids=[w[0] for w in WIDTHS])
def test_slot_width(name, need, device, util, per_gpu, expected):
    assert slot_width(int(need * GiB), device and int(device * GiB), util, per_gpu) == expected


NEED = WorkerNeed(bytes=int(10 * GiB), case_id="tp1-FULL-auto-decode_64-torch-s0", recorded=10, cases=12)
AUTO = [
    # (name, need, device bytes, utilization, cores, gpus, expected workers per GPU), under a cap
    # of 8: how memory and cores bound it
    ("H100, 16 cores: memory allows 5, cores 4 of 4 threads", NEED, 80 * GiB, 0.9, 16, 1, 4),
    ("H200, 64 cores: memory allows 9, the cap is 8", NEED, 141 * GiB, 0.9, 64, 1, 8),
    ("few cores: one thread each, one core left", NEED, 141 * GiB, 0.9, 4, 1, 3),
    ("8 GPUs sharing 128 cores: memory allows 5, cores 4", NEED, 80 * GiB, 0.9, 128, 8, 4),
    ("8 GPUs sharing 256 cores: memory allows 5", NEED, 80 * GiB, 0.9, 256, 8, 5),
    ("24 GiB card: one", NEED, 24 * GiB, 0.9, 16, 1, 1),
    ("nothing recorded: one", WorkerNeed(0, "", 0, 12), 80 * GiB, 0.9, 16, 1, 1),
    ("device size unknown: one", NEED, None, 0.9, 16, 1, 1),
    # Sized for the median case (the H100's families: most cases need 2-5 GiB, a few 17-21): the
    # large ones take several shares (slot_width) instead of every worker being sized for them.
    (
        "median 4 GiB, largest 20: sized for the median",
        WorkerNeed(int(20 * GiB), "big", 10, 10, int(4 * GiB)),
        80 * GiB,
        0.9,
        64,
        1,
        8,
    ),
]


@pytest.mark.parametrize("name,need,device,util,cores,gpus,expected", AUTO, ids=[a[0] for a in AUTO])
def test_auto_packs_by_recorded_needs_and_cores(name, need, device, util, cores, gpus, expected):
    packing = auto_per_gpu(need, device, util, cores, gpus, cap=8)
    assert packing.per_gpu == expected, packing.why


DEFAULT_CAP = [
    # (name, need, device bytes, cores, gpus, expected): the default cap, 3 (measured: the GPU's
    # device work time-slices between more workers, packing.MAX_PER_GPU)
    ("H100, 16 cores: 3, not the cores' 4", NEED, 80 * GiB, 16, 1, 3),
    ("H200, 64 cores: 3", NEED, 141 * GiB, 64, 1, 3),
    ("H100, 8 cores: the cores' 2", NEED, 80 * GiB, 8, 1, 2),
    ("24 GiB card: memory's 1", NEED, 24 * GiB, 16, 1, 1),
    ("2 cores: 1", NEED, 80 * GiB, 2, 1, 1),
]


@pytest.mark.parametrize("name,need,device,cores,gpus,expected", DEFAULT_CAP, ids=[a[0] for a in DEFAULT_CAP])
def test_auto_stops_at_the_cap(name, need, device, cores, gpus, expected):
    packing = auto_per_gpu(need, device, 0.9, cores, gpus)
    assert packing.per_gpu == expected, packing.why
    assert f"cap {MAX_PER_GPU}" in packing.why  # the run's workers line says why


@pytest.mark.parametrize("value,expected", [("1", 1), ("4", 4), ("auto", "auto"), (" AUTO ", "auto"), (None, 1)])
def test_workers_per_gpu_parses(value, expected):
    assert parse_workers_per_gpu(value) == expected


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_bad_workers_per_gpu_is_input_error(value):
    with pytest.raises(InputError, match="--workers-per-gpu"):
        parse_workers_per_gpu(value)


@pytest.mark.parametrize("value,expected", [("24", 24 * GiB), ("24GiB", 24 * GiB), ("0.5g", GiB // 2), (None, None)])
def test_gpu_memory_sizes(value, expected):
    assert parse_gib(value, "--gpu-memory") == expected


def test_a_worker_expects_each_cases_recorded_need_before_it_runs(tmp_path):
    """CaseWorker.run_batch (in process: the actor's loop without Ray) hands its sessions each
    case's recorded need before the case, and 0 for a case without one: a case that never got its
    session (a skip) leaves no need behind for the next."""
    from backend.harness.session_cache import SessionCache
    from orchestrator.executor.actors import CaseWorker, WorkerInfo
    from orchestrator.matrix import load_matrix

    a, b, c = [x for x in load_matrix("matrices/smoke.yaml", devices="cpu").cases if x.tp == 1][:3]
    seen = {}

    def runner(case, *, sessions, **_):
        seen[case.case_id] = sessions.expected  # what the case's get() would make room for
        return CaseResult(case_id=case.case_id, status=Status.PASS, requested_mode=case.mode, axes=case.axes)

    w = CaseWorker.__new__(CaseWorker)
    w._runner, w._sessions, w._gang, w._nvml, w.device = runner, SessionCache(), (0, 1), None, "cpu"
    w.info_ = WorkerInfo("cpu-w0", "", "127.0.0.1", 0, (), "cpu", str(tmp_path / "w.log"))
    w.run_batch([x.to_dict() for x in (a, b, c)], [5 * GiB, 0, 2 * GiB])
    assert seen == {a.case_id: 5 * GiB, b.case_id: 0, c.case_id: 2 * GiB}
    w.run_batch([a.to_dict()])
    assert seen[a.case_id] == 0
