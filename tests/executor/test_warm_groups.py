"""A worker goes back to a session it still holds: real Ray, one worker, the fault runner's slow
cases in three groups (sessions), their estimates set through history. The worker ran a1 (group
A) and b1 (group B); B is done, and c1 (C) is the longest waiting task, with a2 (A) within
GROUP_TIE of it: a2 runs first, its session still in the worker's cache. A dispatcher that looks
only at the worker's last group (B) builds C's session first and A's again after it."""

from __future__ import annotations

import pytest

from backend.case import BatchSpec, Case
from backend.result import Status
from orchestrator.executor.config import group_key
from orchestrator.executor.executor import ExecConfig, Executor
from orchestrator.scheduling.cost import estimate_all
from orchestrator.scheduling.policy import GROUP_TIE
from tests.executor.conftest import session_node

RUNNER = "tests.executor.faulty_backends:fault_runner"


def _case(kv: str, seed: int, backend: str = "torch") -> Case:
    return Case(
        backend=backend, tp=1, mode="NONE", kv_cache_dtype=kv, batch=BatchSpec("slow", (1, 1), (8, 8), ""), seed=seed
    )


CASES = {
    "a1": _case("auto", 0),
    "a2": _case("auto", 1),
    "b1": _case("fp8", 0),
    "c1": _case("auto", 0, "aiter-emulated"),
}
OBSERVED = {"a1": 20.0, "b1": 12.0, "c1": 9.0, "a2": 3.0}  # seconds, as an earlier run recorded them


@pytest.mark.xdist_group("ray")
def test_a_worker_goes_back_to_a_session_it_still_holds(ray_cluster):
    history = {CASES[k].case_id: s for k, s in OBSERVED.items()}
    by_id = estimate_all(list(CASES.values()), history)
    est = {k: by_id[c.case_id] for k, c in CASES.items()}
    groups = {k: group_key(c) for k, c in CASES.items()}
    # What the order below rests on: three groups; longest first a1, b1, c1, a2; a2 outside the
    # tie with b1 (so B runs second) and inside it with c1.
    assert groups["a1"] == groups["a2"] and len(set(groups.values())) == 3
    assert est["a1"] > est["b1"] > est["c1"] > est["a2"]
    assert est["b1"] * (1 - GROUP_TIE) > est["a2"] >= est["c1"] * (1 - GROUP_TIE), est
    order: list[str] = []
    name = {c.case_id: k for k, c in CASES.items()}
    config = ExecConfig(runner=RUNNER, poll_s=0.05, setup_timeout_s=60, retries=0, batch_target_s=0.0)
    executor = Executor(
        session_node(1), config, history=history, on_result=lambda r, final: order.append(name[r.case_id])
    )
    final = executor.run(list(CASES.values()))
    assert {r.status for r in final.values()} == {Status.PASS}
    assert order == ["a1", "b1", "a2", "c1"]
