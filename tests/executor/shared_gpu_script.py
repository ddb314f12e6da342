"""Run by test_shared_gpu.py in a subprocess: a Ray of its own with one fake GPU (`num_gpus=1` on
a CPU machine), three workers sharing it (--workers-per-gpu 3, fractional num_gpus). Prints one
JSON line: the slots, and per case (status, reason, worker)."""

from __future__ import annotations

import json

import ray

from orchestrator.executor.cluster import connect
from orchestrator.executor.executor import ExecConfig, Executor
from tests.executor.faulty_backends import make_case


def main() -> None:
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, object_store_memory=80 * 1024**2, log_to_driver=False)
    info = connect("auto", devices="gpu", workers_per_gpu=3)
    cases = [make_case("slow", i) for i in range(12)]
    # Singles: each worker takes cases as it frees up, so all three run at once.
    final = Executor(info, ExecConfig(runner="tests.executor.faulty_backends:fault_runner", batch_target_s=0.0,
                                      poll_s=0.1)).run(cases)  # fmt: skip
    print("RESULT " + json.dumps({"slots": info.total_slots, "banner": info.banner,
                                  "results": {k: [v.status.value, v.reason, v.worker] for k, v in final.items()}}))
    ray.shutdown()


if __name__ == "__main__":
    main()
