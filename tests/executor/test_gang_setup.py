"""A tp gang that cannot come up is an infrastructure outcome of its cases (requeued once on a
new gang, then NOT_RUN "gang", which the gate fails as exit 3), never a crash or error blamed on
the cases; tp 1 cases on the same run are unaffected. Real Ray (the session cluster), actors
that break on purpose (tests/executor/faulty_actors.py)."""

from __future__ import annotations

import pytest

from backend.result import Status
from orchestrator.errors import ExitCode
from orchestrator.executor import gangs
from orchestrator.executor.cluster import connect
from orchestrator.executor.executor import ExecConfig, Executor
from orchestrator.gate import evaluate
from tests.executor import faulty_actors
from tests.executor.conftest import session_node
from tests.executor.faulty_backends import make_case

pytestmark = pytest.mark.xdist_group("ray")
RUNNER = "tests.executor.faulty_backends:fault_runner"

SCENARIOS = {
    # actor class -> (setup phase in the reason, text of the cause)
    "one rank's actor fails at construction": (faulty_actors.Rank1CannotStart, "(start)", "rank 1 cannot start"),
    "the process group cannot initialise": (
        faulty_actors.ProcessGroupCannotInit,
        "(join)",
        "process group cannot initialise",
    ),
}


def _run_broken_gangs(**config):
    cluster = connect("local", devices="cpu", workers=2)
    cases = [make_case("ok", 0, tp=2), make_case("ok", 1, tp=2), make_case("ok", 2)]
    attempts: list = []
    final = Executor(
        cluster,
        ExecConfig(runner=RUNNER, poll_s=0.2, setup_timeout_s=60, **config),
        on_result=lambda r, f: attempts.append((r, f)),
    ).run(cases)
    return final, attempts


def _assert_not_run_not_blamed(final, attempts, phase: str, cause: str) -> None:
    """The promise: tp 2 cases whose gang cannot come up are NOT_RUN "gang" (exit 3), never an
    attempt of theirs that failed; tp 1 cases pass."""
    for cid in ("tp2-FULL-auto-ok-torch-s0", "tp2-FULL-auto-ok-torch-s1"):
        r = final[cid]
        assert r.status == Status.NOT_RUN and r.error_kind == "gang", r
        assert f"tp2 gang setup failed {phase}" in r.reason and cause in r.reason, r.reason
    # Nothing was ever filed against the tp 2 cases as an attempt of theirs (no ERROR / crash).
    assert not [r for r, _ in attempts if r.axes.get("tp") == 2 and r.status != Status.NOT_RUN]
    # tp 1 gangs never join and their one actor is rank 0: the same broken class runs them.
    assert final["tp1-FULL-auto-ok-torch-s2"].status == Status.PASS
    gate = evaluate(list(final.values()))
    assert gate.exit_code == ExitCode.INFRA_ERROR and set(gate.not_run) == {
        "tp2-FULL-auto-ok-torch-s0",
        "tp2-FULL-auto-ok-torch-s1",
    }, gate


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_gang_that_cannot_come_up_is_not_run_not_a_crash(ray_cluster, monkeypatch, scenario):
    worker_cls, phase, cause = SCENARIOS[scenario]
    monkeypatch.setattr(gangs, "CaseWorker", worker_cls)
    final, attempts = _run_broken_gangs()
    _assert_not_run_not_blamed(final, attempts, phase, cause)


def test_the_check_would_catch_a_setup_failure_filed_as_a_crash(ray_cluster, monkeypatch):
    # Break the executor on purpose (file set-up failures as crashes of the batch, as it once did)
    # and run the same assertions as the test above: they must reject it. Asserting on what the
    # patch itself does would only show the patch works.
    from orchestrator.executor import executor as ex

    def as_crash(self, job, reason):
        self._lost_batch(job, reason, "crash", Status.ERROR)

    monkeypatch.setattr(ex.Executor, "_setup_failed", as_crash)
    monkeypatch.setattr(gangs, "CaseWorker", faulty_actors.ProcessGroupCannotInit)
    final, attempts = _run_broken_gangs(retries=0)
    _, phase, cause = SCENARIOS["the process group cannot initialise"]
    with pytest.raises(AssertionError):
        _assert_not_run_not_blamed(final, attempts, phase, cause)


@pytest.mark.parametrize("cores, most_workers", [(2, 2), (0, 8)])
def test_cpu_gangs_start_only_while_their_ranks_fit_in_the_cores(ray_cluster, cores, most_workers):
    # 8 slots (a tp 8 gang must fit) on a node of `cores` cores: with the cap, tp 1 cases share
    # two workers instead of starting eight processes; without it (0: --workers given) up to 8.
    cluster = session_node(8, cores)
    cases = [make_case("ok", i) for i in range(16)] + [make_case("ok", 100, tp=4)]
    final = Executor(
        cluster, ExecConfig(runner="tests.executor.faulty_backends:slow_runner", poll_s=0.1, batch_target_s=0.0)
    ).run(cases)
    assert all(r.status == Status.PASS for r in final.values()), final
    workers = {final[c.case_id].worker for c in cases if c.tp == 1}
    assert len(workers) <= most_workers and (cores or len(workers) > 2), workers
    assert final["tp4-FULL-auto-ok-torch-s100"].status == Status.PASS  # a gang larger than the cores still runs
