"""On a cold GPU machine the warm-up helpers compile the JIT backends' kernels while the worker
runs the other backends' cases; those of the JIT backends wait until the warm-up is over (or
nothing else is left). Real Ray (the session cluster), one worker, the fault runner."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.executor.executor import Deferral, ExecConfig, Executor
from tests.executor.conftest import session_node
from tests.executor.faulty_backends import make_case

pytestmark = pytest.mark.xdist_group("ray")
RUNNER = "tests.executor.faulty_backends:fault_runner"

TORCH = [make_case("ok", i) for i in range(3)]
JIT = [dataclasses.replace(make_case("ok", 10 + i), backend="aiter-triton") for i in range(3)]
# The JIT cases are the longest by history, so longest-first alone would run them first.
HISTORY = {c.case_id: 10.0 for c in JIT} | {c.case_id: 1.0 for c in TORCH}


def _order(deferral: Deferral | None, seen: list[str] | None = None) -> list[str]:
    cluster = session_node(1)
    # One case a batch, so the order results arrive in is the order they were dispatched in.
    config = ExecConfig(runner=RUNNER, poll_s=0.05, setup_timeout_s=60, max_batch=1)
    seen = [] if seen is None else seen
    final = Executor(
        cluster, config, on_result=lambda r, f: seen.append(r.case_id), history=HISTORY, deferral=deferral
    ).run(TORCH + JIT)
    assert all(r.status.value == "pass" for r in final.values()) and len(final) == 6
    return ["jit" if cid in {c.case_id for c in JIT} else "torch" for cid in seen]


@pytest.mark.parametrize(
    "deferral, expected",
    [
        (None, ["jit"] * 3 + ["torch"] * 3),
        (Deferral(frozenset({"aiter-triton"}), lambda: True), ["torch"] * 3 + ["jit"] * 3),  # warm-up never ends
        (Deferral(frozenset({"aiter-triton"}), lambda: False), ["jit"] * 3 + ["torch"] * 3),  # already over
        (Deferral(frozenset({"aiter"}), lambda: True), ["jit"] * 3 + ["torch"] * 3),  # not these backends
    ],
    ids=["none", "warming", "warm", "other-backend"],
)
def test_jit_cases_wait_for_the_warm_up(ray_cluster, deferral, expected):
    assert _order(deferral) == expected


def test_the_wait_ends_with_the_warm_up(ray_cluster):
    # The warm-up "ends" once the first result is in: the JIT cases go next (longest first).
    seen: list[str] = []
    order = _order(Deferral(frozenset({"aiter-triton"}), lambda: not seen), seen)
    assert order == ["torch"] + ["jit"] * 3 + ["torch"] * 2, order
