"""The actors take the driver's Triton cache settings (actors.FORWARDED_ENV) and the
vLLM release it names (ORCH_VLLM), so workers import the release the driver planned with.

The workers of a joined cluster are its nodes' processes, started with the nodes' environment; a
run into a head kept running compiled every kernel again in the head's default cache while the
driver named a warm one (H100, docs/BENCHMARKS.md). The test session's cluster plays that head: its
raylet started before the variable is set here, so only the forwarding can bring it to an actor.
Real Ray (the session cluster), the env runner (tests/executor/faulty_backends.py).
"""

from __future__ import annotations

import uuid

import pytest

from backend.result import Status
from orchestrator.executor.executor import ExecConfig, Executor
from tests.executor.conftest import session_node
from tests.executor.faulty_backends import make_case

pytestmark = pytest.mark.xdist_group("ray")


def _worker_sees(name: str) -> str:
    cluster = session_node(1, 1)
    config = ExecConfig(runner="tests.executor.faulty_backends:env_runner", poll_s=0.1, setup_timeout_s=60)
    case = make_case("env", description=name)
    result = Executor(cluster, config).run([case])[case.case_id]
    assert result.status == Status.PASS, result
    return result.reason.split("=", 1)[1]


@pytest.mark.parametrize("name", ["TRITON_CACHE_DIR", "TRITON_HOME", "ORCH_VLLM"])
def test_an_actor_uses_the_triton_cache_the_driver_names(ray_cluster, monkeypatch, tmp_path, name):
    monkeypatch.delenv(name, raising=False)
    unset = _worker_sees(name)  # the contrast: what the cluster's own workers have
    value = str(tmp_path / f"cache-{uuid.uuid4().hex[:8]}")
    assert unset != value
    monkeypatch.setenv(name, value)
    assert _worker_sees(name) == value
