"""Several workers per GPU on a Ray cluster of fake GPUs (`num_gpus=2` on a CPU box), in a process of
its own (the test session's cluster has no GPUs). Prints one JSON object: what the executor asked
Ray for per gang, and what each case's worker got (tests/executor/test_memory_packing.py).

    python tests/executor/packing_script.py PER_GPU LOG [wide]

`wide`: tp 1 cases only, the first recorded as needing 30 GiB of an 80 GiB device (a worker of
three shares at 4 per GPU), the second running out of memory on any worker of less than a GPU,
the third on the first worker it meets, which keeps memory it cannot give back.
`config`: the five cudagraph modes of one config, only the first recorded as needing 30 GiB (the
mode that pays the config's session), and four cases of other configs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys


def main() -> None:
    per_gpu, log = int(sys.argv[1]), sys.argv[2]
    wide = sys.argv[3:] == ["wide"]
    grouped = sys.argv[3:] == ["config"]
    # `threads`: 12 cores and torch preloaded in Ray's workers (as `orch run`'s cluster does), so
    # each worker's torch threads show its share of the cores (tests/executor/test_threads.py).
    threads = sys.argv[3:] == ["threads"]
    os.environ["ORCH_PACKING_LOG"] = log  # before ray.init: the workers inherit the raylet's env
    from orchestrator.matrix import load_matrix

    m = load_matrix("matrices/smoke.yaml", devices="cpu")
    tp1 = [c for c in m.cases if c.tp == 1][: 8 if wide else 4 if threads else 16]
    tp2 = [] if wide or grouped else [c for c in m.cases if c.tp == 2][: 1 if threads else 2]
    if grouped:
        from orchestrator.executor.config import config_key

        lead = next(c for c in m.cases if c.tp == 1 and c.mode == "FULL_AND_PIECEWISE")
        modes = [c for c in m.cases if config_key(c) == config_key(lead)]
        tp1 = [lead, *(c for c in modes if c is not lead), *[c for c in m.cases if c.tp == 1 and c not in modes][:4]]
    if wide:
        os.environ["ORCH_PACKING_OOM"] = tp1[1].case_id
        os.environ["ORCH_PACKING_KEPT"] = tp1[2].case_id
    import ray

    from orchestrator.executor import gangs
    from orchestrator.executor.cluster import connect
    from orchestrator.executor.executor import ExecConfig, Executor

    extra = {"_system_config": {"preload_python_modules": ["torch"]}} if threads else {}
    ray.init(
        address="local",
        num_cpus=12 if threads else 4,
        num_gpus=2,
        include_dashboard=False,
        object_store_memory=256 * 1024**2,
        log_to_driver=False,
        **extra,
    )
    specs = []
    real_start = gangs.start_actors

    def recording(gang):
        specs.append(
            {
                "tp": gang.spec.tp,
                "gpu_share": gang.spec.gpu_share,
                "bundle": gang.spec.bundle(),
                "memory": dict(gang.spec.memory),
                "threads": gang.spec.threads,
            }
        )
        return real_start(gang)

    gangs.start_actors = recording

    def no_process_group(gang, infos, timeout_s):
        # Fake GPUs cannot host NCCL: the gang's ranks run the runner without a process group
        # (it uses no collective); what this test checks is where Ray put them.
        gang.infos = list(infos)
        gang.state = gangs.GangState.IDLE
        return []

    gangs.join = no_process_group
    cluster = connect("local", devices="gpu", workers_per_gpu=per_gpu)
    config = ExecConfig(
        runner="tests.executor.packing_runner:run", gpu_memory_utilization=0.8, batch_target_s=0.0, retries=0
    )
    if wide or grouped:
        config = dataclasses.replace(config, memory_needs={tp1[0].case_id: 30 * 1024**3}, device_bytes=80 * 1024**3)
    final = Executor(cluster, config).run([*tp1, *tp2])
    print(
        json.dumps(
            {
                "slots": cluster.total_slots,
                "banner": cluster.banner,
                "specs": specs,
                "statuses": sorted({r.status.value for r in final.values()}),
                "results": len(final),
                "cases": [c.case_id for c in tp1],
                "final": {k: [r.status.value, r.attempts, r.log_tail] for k, r in final.items()},
            }
        )
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
