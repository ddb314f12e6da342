"""The executor on real Ray (CPU workers of the session cluster) against runners that break on purpose.

One mixed run (module fixture) holds every fault next to healthy cases, batched together, so each
scenario below also checks that a fault is blamed on its own case only and the run goes on.
"""

from __future__ import annotations

import time

import pytest

from backend.result import Status
from orchestrator.executor import gangs
from orchestrator.executor.cluster import connect
from orchestrator.executor.executor import ExecConfig, Executor
from tests.executor.conftest import session_node
from tests.executor.faulty_backends import make_case

pytestmark = pytest.mark.xdist_group("ray")
RUNNER = "tests.executor.faulty_backends:fault_runner"


@pytest.fixture(scope="module")
def mixed_run(ray_cluster, tmp_path_factory):
    marker = tmp_path_factory.mktemp("flaky") / "seen"
    cases = [make_case("ok", i) for i in range(8)] + [
        make_case("crash", 1),
        make_case("segv", 1),
        make_case("hang", 1, timeout_s=2.0),
        make_case("cudaerr", 1),
        make_case("fail", 1),
        make_case("flaky", 1, description=str(marker)),
        make_case("failerr", 1, description=str(marker) + "-failerr"),
    ]
    cluster = connect("local", devices="cpu", workers=2)
    attempts: list = []
    t0 = time.monotonic()
    final = Executor(
        cluster, ExecConfig(runner=RUNNER, poll_s=0.2), on_result=lambda r, f: attempts.append((r, f))
    ).run(cases)
    return final, attempts, time.monotonic() - t0


# scenario -> (batch kind, final status, attempts, error_kind, text that must be in reason or log tail)
SCENARIOS = {
    "os._exit kills the worker": ("crash", Status.ERROR, 2, "crash", "about to crash"),
    "segfault kills the worker": ("segv", Status.ERROR, 2, "crash", "about to segfault"),
    "hang past the deadline": ("hang", Status.TIMEOUT, 2, "timeout", "no result within 2s"),
    "device error poisons the worker": ("cudaerr", Status.ERROR, 2, "exception", "worker recycled"),
    "a failure that repeats": ("fail", Status.FAIL, 2, "", "fail"),
    "a failure that does not repeat": ("flaky", Status.FLAKY, 2, "", "retry disagreed"),
    # FLAKY needs a passing attempt: FAIL then ERROR is a failure (was FLAKY, gate green).
    "a failure, then a crash of another kind": ("failerr", Status.ERROR, 2, "exception", "failed twice: fail on"),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_fault_is_recorded_on_its_own_case(mixed_run, scenario):
    final, attempts, _ = mixed_run
    kind, status, n, error_kind, text = SCENARIOS[scenario]
    res = final[f"tp1-FULL-auto-{kind}-torch-s1"]
    assert res.status == status, res
    assert res.attempts == n
    assert res.error_kind == error_kind
    assert text in res.reason + res.log_tail
    tries = [r for r, final_ in attempts if r.case_id == res.case_id]
    # The retry ran on another worker (a recreated actor counts: the old one is gone).
    assert len(tries) == 2 and tries[0].worker != tries[1].worker


def test_healthy_cases_in_broken_batches_are_not_blamed(mixed_run):
    final, attempts, _ = mixed_run
    ok = [r for cid, r in final.items() if "-ok-" in cid]
    assert len(ok) == 8 and all(r.status == Status.PASS and r.attempts == 1 for r in ok)
    assert len(final) == 15
    assert sum(1 for _, f in attempts if f) == 15  # every case reported final exactly once


def test_crash_log_tail_is_the_crashing_case(mixed_run):
    final, _, _ = mixed_run
    tail = final["tp1-FULL-auto-crash-torch-s1"].log_tail
    assert tail.startswith("[orch] case tp1-FULL-auto-crash-torch-s1")
    assert "-ok-" not in tail


def test_actor_reports_its_device_and_gang_joins_gloo(ray_cluster):
    cluster = connect("local", devices="cpu")
    assert cluster.device_kind == "cpu" and "no GPU: CPU workers, graphs emulated" in cluster.banner
    final = Executor(cluster, ExecConfig(runner=RUNNER)).run([make_case("rank", 0, tp=2)])
    res = final["tp2-FULL-auto-rank-torch-s0"]
    assert res.status == Status.PASS, res
    # all_reduce of (rank + 1) over the gang: 1 + 2 on both ranks, so gloo really connected them.
    assert "world=2" in res.reason and "sum=3" in res.reason and "device=cpu" in res.reason
    assert res.device == "cpu" and res.worker.count("@") == 2  # both ranks named


def test_a_rank_leaving_a_case_early_does_not_pair_with_the_next_case(ray_cluster):
    """tp 2, one batch [rankerr, rank]: rank 1 raises in rankerr while rank 0 waits in an
    all_reduce. Before the gang barrier rank 1 went on to `rank`'s all_reduce, which paired with
    rank 0's stale one (both looked fine), then rank 0 hung in `rank`: TIMEOUT, blamed on rankerr.
    Now the end-of-case barrier meets the stale collective: the gang is torn down at once, the
    culprit is an ERROR and the innocent case passes on a fresh gang. The deadlines are far above
    the case's own time (well under a second): the old hang ran into them, a loaded machine does
    not (15 s deadlines were met by 0.6 s on the 2-core box)."""
    cluster = connect("local", devices="cpu")
    cases = [make_case("rankerr", 0, tp=2, timeout_s=120.0), make_case("rank", 1, tp=2, timeout_s=120.0)]
    history = {cases[0].case_id: 0.002, cases[1].case_id: 0.001}  # cheap: batched together
    attempts: list = []
    final = Executor(
        cluster, ExecConfig(runner=RUNNER, poll_s=0.2), history=history, on_result=lambda r, f: attempts.append(r)
    ).run(cases)
    bad, good = final[cases[0].case_id], final[cases[1].case_id]
    assert good.status == Status.PASS and "sum=3" in good.reason, good
    assert bad.status == Status.ERROR and bad.error_kind in ("crash", "exception"), bad
    assert not any(r.status == Status.TIMEOUT for r in attempts), attempts


def test_worker_info_from_runtime_context(ray_cluster, tmp_path):
    import ray

    node = connect("local", devices="cpu").nodes[0]
    gang, ready = gangs.place(gangs.GangSpec(1, "cpu", RUNNER, str(tmp_path)), 0, node.node_id)
    try:
        ray.get(ready, timeout=30)
        (info,) = ray.get(gangs.start_actors(gang), timeout=60)
        assert info.accelerator_ids == () and info.device == "cpu" and info.node_id == node.node_id
        assert info.free_port > 0 and info.log_path.startswith(str(tmp_path))
    finally:
        gangs.teardown(gang)


def test_a_placement_timeout_is_not_run_within_the_deadline(ray_cluster):
    # Claim 16 slots of a whole core each: a tp 8 gang asks for 8 CPUs of a 4-CPU cluster and
    # its placement group never becomes ready (Ray never fails it by itself).
    cluster = session_node(16, cpu_per_worker=1.0)
    cases = [make_case("ok", 0, tp=8), make_case("ok", 1, tp=8), make_case("ok", 2)]
    t0 = time.monotonic()
    final = Executor(cluster, ExecConfig(runner=RUNNER, placement_timeout_s=2.0, poll_s=0.2)).run(cases)
    assert time.monotonic() - t0 < 30
    for cid in ("tp8-FULL-auto-ok-torch-s0", "tp8-FULL-auto-ok-torch-s1"):
        # Runnable in principle (16 slots claimed), never placed: NOT_RUN (was SKIP, which never gates).
        assert final[cid].status == Status.NOT_RUN and final[cid].error_kind == "placement"
        assert "needs 8 CPU workers on one node" in final[cid].reason
    assert final["tp1-FULL-auto-ok-torch-s2"].status == Status.PASS
