"""The smoke run shared by the end-to-end and pytest-plugin tests (one `orch run` of smoke.yaml)."""

from __future__ import annotations

import pytest

from orchestrator.commands import run as run_cmd
from orchestrator.executor.cluster import ClusterInfo, NodeSlots, connect
from orchestrator.store import ResultStore


@pytest.fixture(scope="session")
def smoke_run(ray_cluster, tmp_path_factory):
    """`orch run matrices/smoke.yaml` in this process, on the session cluster, with the checker."""
    tmp = tmp_path_factory.mktemp("smoke")
    db = str(tmp / "results.db")
    code = run_cmd.main("matrices/smoke.yaml", db=db, out_dir=str(tmp / "out"), devices="cpu", no_progress=True)
    with ResultStore(db) as store:
        rid = store.latest_run_id()
        return code, tmp, {r.case_id: r for r in store.results(rid)}, store.run(rid)


def session_node(slots: int, cores: int = 0, cpu_per_worker: float = 0.25) -> ClusterInfo:
    """The session cluster's node seen as `slots` CPU slots (`cores`: NodeSlots' cap on ranks at
    once, 0 none), each worker asking `cpu_per_worker` CPUs: the shapes the executor tests need
    of a 4-CPU cluster."""
    real = connect("local", devices="cpu").nodes[0]
    return ClusterInfo("local", "cpu", (NodeSlots(real.node_id, real.ip, slots, cores),), cpu_per_worker=cpu_per_worker)
