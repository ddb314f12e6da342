"""Sharing the session cluster with another job: a placement that waits on someone else's
resources is waited for and said, never NOT_RUN, and the executor gives back its idle gangs
meanwhile (orchestrator/executor/sharing.py).

The other job is a placement group this test holds, as another driver's gang would."""

from __future__ import annotations

import threading
import time

import pytest

from backend.result import Status
from orchestrator.executor.executor import ExecConfig, Executor
from tests.executor.conftest import session_node
from tests.executor.faulty_backends import make_case

pytestmark = pytest.mark.xdist_group("ray")
RUNNER = "tests.executor.faulty_backends:fault_runner"


def test_a_placement_held_up_by_another_job_waits_says_so_and_frees_idle_gangs(ray_cluster):
    from ray.util.placement_group import placement_group, remove_placement_group

    # The session cluster has 4 CPUs; the other job holds 2. The run claims 3 slots of 1 CPU:
    # its tp 1 gang takes one, then its tp 2 gang needs 2 of the 1 left. Only giving the idle tp 1
    # gang back lets the tp 2 gang in before the other job lets go.
    other = placement_group([{"CPU": 2.0}])
    ray_cluster.get(other.ready(), timeout=60)
    released = []

    def let_go():
        released.append(time.monotonic())
        remove_placement_group(other)

    safety = threading.Timer(45.0, let_go)  # without the give-back the run would wait for this
    safety.start()
    one, two = make_case("ok", 0), make_case("ok", 1, tp=2)
    notices: list[str] = []
    try:
        cluster = session_node(3, cpu_per_worker=1.0)
        config = ExecConfig(runner=RUNNER, placement_timeout_s=1.0, poll_s=0.2, wait_notice_s=0.5)
        t0 = time.monotonic()
        # The tp 1 case first (longest estimate): its gang is idle when the tp 2 placement waits.
        final = Executor(cluster, config, history={one.case_id: 5.0, two.case_id: 0.01}, on_notice=notices.append).run(
            [one, two]
        )
        took = time.monotonic() - t0
        before_release = not released
    finally:
        safety.cancel()
        if not released:
            let_go()
    assert final[one.case_id].status == Status.PASS
    # Past its 1 s placement deadline, and not NOT_RUN: another job held what it needed.
    assert final[two.case_id].status == Status.PASS, (final[two.case_id].reason, notices)
    assert before_release and took < 40, took  # in by giving the idle gang back, not by the other job leaving
    assert any(n.startswith("waiting for 2 CPU worker(s) on one node: 2 of 4 held by other jobs") for n in notices), (
        notices
    )
    assert any("got the CPU workers after waiting" in n for n in notices), notices


def test_the_end_of_a_wait_is_said_on_the_first_turn_with_nothing_left_to_place():
    """Ray's state is queried every CHECK_EVERY_S, but the end of a wait needs no query: a run whose
    last gang got in within those 2 s ended before the next query and never said it."""
    from orchestrator.executor.sharing import SharedCluster

    notices: list[str] = []
    shared = SharedCluster(None, ExecConfig(runner=RUNNER), notices.append, "CPU worker")  # type: ignore[arg-type]
    shared.waiting_since = time.monotonic() - 3.0
    shared._checked = time.monotonic()  # a state query this very moment: the next is 2 s away
    assert shared.tick([], lambda: 0.0) is False
    assert len(notices) == 1 and notices[0].startswith("placement: got the CPU workers after waiting 3s"), notices
    assert shared.tick([], lambda: 0.0) is False and len(notices) == 1  # said once
