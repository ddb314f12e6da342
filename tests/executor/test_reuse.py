"""Worker processes are reused across tp phases. An idle gang whose ranks divide into the tp
the next case needs is split (every rank leaves its process group, the new gangs join on fresh
ports) instead of being torn down for new actors. Real Ray (the session cluster), the fault
runner (tests/executor/faulty_backends.py): "rank" cases all-reduce over the gang they were given."""

from __future__ import annotations

import pytest

from backend.result import Status
from orchestrator.executor import gangs
from orchestrator.executor.executor import ExecConfig, Executor
from tests.executor.conftest import session_node
from tests.executor.faulty_backends import make_case

pytestmark = pytest.mark.xdist_group("ray")
RUNNER = "tests.executor.faulty_backends:fault_runner"


def _run(monkeypatch, cases, *, reuse: bool, retries: int = 1, max_batch: int = 64):
    """Run the cases; also returns every actor process a gang was formed over (pids) and how
    many actors were created."""
    pids: list[int] = []
    created: list[int] = []
    join, start = gangs.join, gangs.start_actors

    def spy_join(gang, infos, timeout_s):
        pids.extend(i.pid for i in infos)
        return join(gang, infos, timeout_s)

    def spy_start(gang):
        created.append(gang.tp)
        return start(gang)

    monkeypatch.setattr(gangs, "join", spy_join)
    monkeypatch.setattr(gangs, "start_actors", spy_start)
    attempts: list = []
    config = ExecConfig(
        runner=RUNNER, poll_s=0.1, setup_timeout_s=60, retries=retries, reuse_gangs=reuse, max_batch=max_batch
    )
    final = Executor(session_node(4, 2), config, on_result=lambda r, f: attempts.append(r)).run(cases)
    return final, set(pids), sum(created), attempts


PHASES = (
    [make_case("rank", i, tp=4) for i in range(2)]
    + [make_case("rank", 10 + i, tp=2) for i in range(3)]
    + [make_case("ok", 20 + i) for i in range(4)]
)


@pytest.mark.parametrize("reuse, processes", [(True, 4), (False, 4 + 2 + 2)])
def test_tp_4_then_2_then_1_start_only_four_worker_processes(ray_cluster, monkeypatch, reuse, processes):
    # reuse=False is the old behaviour (a new gang per tp phase): the same assertion on it must
    # see more processes, so the count is not vacuous.
    final, pids, created, _ = _run(monkeypatch, PHASES, reuse=reuse)
    assert {cid: r.status for cid, r in final.items()} == {c.case_id: Status.PASS for c in PHASES}, final
    # A re-formed gang's process group has exactly its own ranks: sum of rank+1 over the gang.
    for c in PHASES:
        if c.tp > 1:
            reason = final[c.case_id].reason
            assert f"world={c.tp} " in reason and f" sum={c.tp * (c.tp + 1) // 2} " in reason, reason
    assert created == (4 if reuse else processes), created
    assert len(pids) == processes, pids
    if reuse:  # every case ran in one of the tp 4 gang's processes
        ran = {int(r.reason.rsplit("pid=", 1)[1]) for r in final.values()}
        assert ran <= pids, (ran, pids)


def test_a_crash_in_a_re_formed_gang_is_still_a_crash_and_later_cases_run(ray_cluster, monkeypatch):
    cases = [make_case("rank", 0, tp=2), make_case("rank", 1, tp=2), make_case("crash", 2)] + [
        make_case("ok", 10 + i) for i in range(4)
    ]
    # One case per call, so every worker the crash case kills is one of its recorded attempts
    # (in a batch it would also take a worker down before it is run alone).
    final, _pids, created, attempts = _run(monkeypatch, cases, reuse=True, max_batch=1)
    crash = final["tp1-FULL-auto-crash-torch-s2"]
    assert crash.status == Status.ERROR and crash.error_kind == "crash", crash
    assert crash.log_tail.startswith("[orch] case tp1-FULL-auto-crash-torch-s2") and "about to crash" in crash.log_tail
    tp2_gang = final["tp2-FULL-auto-rank-torch-s0"].worker.split("r0@")[0]  # "cpu-g<id>"
    first = next(r for r in attempts if r.case_id == crash.case_id)
    assert first.worker.startswith(tp2_gang + "r"), (first.worker, tp2_gang)  # it crashed a re-formed worker
    for i in range(4):
        assert final[f"tp1-FULL-auto-ok-torch-s{10 + i}"].status == Status.PASS
    # The tp 1 phase starts no actor of its own: beyond the tp 2 gang, a new worker only replaces
    # one the crash case killed. How many replacements depends on timing (a replacement comes up
    # while the surviving half is still busy), never more than the workers that died.
    deaths = sum(r.case_id == crash.case_id and r.error_kind == "crash" for r in attempts)
    assert deaths == 2, attempts  # retries=1: two attempts, each on its own worker
    assert 2 <= created <= 2 + deaths, (created, deaths)


def test_a_split_is_only_made_where_the_ranks_divide():
    spec = gangs.GangSpec(4, "cpu", RUNNER, "/tmp")
    g = gangs.Gang(spec=spec, node=0, node_id="n", pg=object(), infos=[None] * 4)  # type: ignore[list-item]
    assert gangs.splits(g, 2) and gangs.splits(g, 1)
    assert not gangs.splits(g, 3) and not gangs.splits(g, 4) and not gangs.splits(g, 8)
    g.infos = []  # never started: nothing to re-form
    assert not gangs.splits(g, 2)


def test_wide_again_after_narrow_joins_the_split_workers(ray_cluster, monkeypatch):
    # Estimates order the matrix tp 4, tp 1 x 4, tp 4 (as a store's history can): the second tp 4
    # case joins the tp 1 workers split from the first gang again instead of starting new ones.
    from orchestrator.executor import executor as executor_module

    cases = [make_case("rank", 0, tp=4)] + [make_case("ok", 10 + i) for i in range(4)] + [make_case("rank", 1, tp=4)]
    est = {cases[0].case_id: 3.0, cases[-1].case_id: 0.5, **{c.case_id: 2.0 for c in cases[1:-1]}}
    monkeypatch.setattr(executor_module, "grouped_estimates", lambda *a, **k: est)
    pids: list[int] = []
    created: list[int] = []
    join, start = gangs.join, gangs.start_actors
    monkeypatch.setattr(gangs, "join", lambda g, infos, t: (pids.extend(i.pid for i in infos), join(g, infos, t))[1])
    monkeypatch.setattr(gangs, "start_actors", lambda g: (created.append(g.tp), start(g))[1])
    order: list[str] = []
    config = ExecConfig(runner=RUNNER, poll_s=0.1, setup_timeout_s=60, retries=0, max_batch=1)
    final = Executor(session_node(4, 2), config, on_result=lambda r, f: order.append(r.case_id)).run(cases)
    assert order[0] == cases[0].case_id and order[-1] == cases[-1].case_id, order
    assert {r.status for r in final.values()} == {Status.PASS}, final
    for c in (cases[0], cases[-1]):
        assert "world=4 " in final[c.case_id].reason and " sum=10 " in final[c.case_id].reason
    assert sum(created) == 4 and len(set(pids)) == 4, (created, pids)
