"""How many CPU threads a worker's torch may run: its share of its node's cores. Pure (no Ray, no
torch): the driver computes it when it places a gang (pool.GangPool.spec) and the actor applies it
on itself before torch does any work (actors.limit_threads).

Why: a GPU worker is a Ray actor with num_cpus=0, and torch's default intra-op pool is every core
of the node. N workers per GPU then run N x cores threads on the node's cores: step inputs and the
reference ran 15-40x slower than with one worker (docs/EXECUTION.md, "Threads")."""

from __future__ import annotations

# CPU workers hold a quarter of a core each (cluster.CPU_PER_WORKER) and run one thread.
CPU_WORKER_THREADS = 1


def worker_threads(node_cpus: int, node_slots: int, width: int) -> int:
    """Threads for one rank of a worker `width` slots wide on a node of `node_slots` slots and
    `node_cpus` cores: its share of the cores, at least 1. A gang's rank holds a whole GPU
    (`width` = workers per GPU), a tp 1 worker its shares. Unknown cores or slots: 1."""
    if node_cpus <= 0 or node_slots <= 0:
        return 1
    return max(1, node_cpus * max(1, width) // node_slots)
