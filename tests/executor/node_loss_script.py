"""Run by test_node_loss.py in a subprocess: a 2-node ray.cluster_utils.Cluster of its own, one
node removed while its cases run. Prints one JSON line: the nodes, which the GCS reports
dead, the cases the executor requeued after the loss, whether the removal happened and the removal thread's
error (a daemon thread's exception would otherwise vanish), and {case_id: [status, attempts, worker]}."""

from __future__ import annotations

import json
import threading
import time

import ray
from ray.cluster_utils import Cluster

from orchestrator.executor.cluster import connect
from orchestrator.executor.executor import ExecConfig, Executor
from tests.executor.faulty_backends import make_case

CASES = 40


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 80 * 1024**2})
    keep = cluster.add_node(num_cpus=1, object_store_memory=80 * 1024**2)
    doomed = cluster.add_node(num_cpus=1, object_store_memory=80 * 1024**2)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    info = connect("auto", devices="cpu", workers=4)  # 2 slots per node (0.25 CPU each)
    # 0.3 s cases on 4 slots: 40 of them are ~3 s of work, so cases still run on the doomed node
    # when it goes (with 12, ~1 s, a loaded CI box saw every case done before the removal landed).
    cases = [make_case("slow", i) for i in range(CASES)]
    started = threading.Event()
    removal: dict = {"removed": False, "error": None}

    def on_result(r, final):
        started.set()

    def kill_later():
        try:
            if not started.wait(60):
                raise TimeoutError("no case finished within 60 s: nothing was running to lose")
            cluster.remove_node(doomed, allow_graceful=False)
            removal["removed"] = True
        except BaseException as e:  # noqa: BLE001 - reported in RESULT: a daemon thread's error is otherwise lost
            removal["error"] = f"{type(e).__name__}: {e}"

    killer = threading.Thread(target=kill_later, daemon=True)
    killer.start()
    # Singles (no batching) so both nodes hold work when one goes away.
    executor = Executor(
        info,
        ExecConfig(runner="tests.executor.faulty_backends:fault_runner", batch_target_s=0.0, retries=1, poll_s=0.2),
        on_result=on_result,
    )
    final = executor.run(cases)
    killer.join(5)
    # The GCS's own view of the removed node (it may notice after the executor did, through the
    # broken actor connection): waited for, not assumed.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dead = [n["NodeID"] for n in ray.nodes() if not n.get("Alive")]
        if doomed.node_id in dead or not removal["removed"]:
            break
        time.sleep(0.5)
    print(
        "RESULT "
        + json.dumps(
            {
                "nodes": [n.node_id for n in info.nodes],
                "keep": keep.node_id,
                "doomed": doomed.node_id,
                "dead": dead,
                "requeued_after_loss": sorted(executor.attempts.lost),
                "removed": removal["removed"],
                "removal_error": removal["error"],
                "results": {k: [v.status.value, v.attempts, v.worker] for k, v in final.items()},
            }
        )
    )
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
