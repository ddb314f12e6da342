"""Run by test_node_loss.py in a subprocess: a 2-node ray.cluster_utils.Cluster of its own, one
node removed while its cases run. Prints one JSON line: {case_id: [status, attempts, worker]}."""

from __future__ import annotations

import json
import threading
import time

import ray
from ray.cluster_utils import Cluster

from orchestrator.executor.cluster import connect
from orchestrator.executor.executor import ExecConfig, Executor
from tests.executor.faulty_backends import make_case


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 80 * 1024**2})
    keep = cluster.add_node(num_cpus=1, object_store_memory=80 * 1024**2)
    doomed = cluster.add_node(num_cpus=1, object_store_memory=80 * 1024**2)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    info = connect("auto", devices="cpu", workers=4)  # 2 slots per node (0.25 CPU each)
    cases = [make_case("slow", i) for i in range(12)]
    started = threading.Event()

    def on_result(r, final):
        started.set()

    def kill_later():
        started.wait(60)
        cluster.remove_node(doomed, allow_graceful=False)

    threading.Thread(target=kill_later, daemon=True).start()
    # Singles (no batching) so both nodes hold work when one goes away.
    final = Executor(info, ExecConfig(runner="tests.executor.faulty_backends:fault_runner", batch_target_s=0.0,
                                      retries=1, poll_s=0.2), on_result=on_result).run(cases)  # fmt: skip
    print("RESULT " + json.dumps({"nodes": [n.node_id for n in info.nodes], "keep": keep.node_id, "doomed": doomed.node_id,
                      "results": {k: [v.status.value, v.attempts, v.worker] for k, v in final.items()}}))  # fmt: skip
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
