"""Worker for the 2-process gloo test (importable by torch.multiprocessing spawn)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from backend.graphs.emulated import EmulatedCapturedGraph, EmulatedGraphRunner


def allreduce_replay(rank: int, port: int, world: int, queue) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        x = torch.zeros(4)

        def fn():
            t = x * 1.0  # row-parallel output: a fresh local partial sum
            dist.all_reduce(t)
            return t + 1.0

        runner = EmulatedGraphRunner()
        runner.warmup(fn, iters=1)
        graph = runner.capture(fn)
        results = {"ops": [str(op.func) for op in graph._ops]}
        for step in range(2):  # fresh inputs each step, through the same graph
            x.fill_(10.0 * step + rank + 1.0)
            results[f"step{step}"] = graph.replay().clone().tolist()
        # The same recording with the collective dropped: what a replay that does not re-issue it reads.
        no_collective = EmulatedCapturedGraph([op for op in graph._ops if op.kind != "c10d"], graph.outputs)
        results["without_collective"] = no_collective.replay().clone().tolist()
        queue.put((rank, results))
        # Flush the queue's feeder thread before tearing down: a rank blocked in
        # destroy_process_group (rank 0, the store's host, already gone) could otherwise keep its
        # result unsent, and the test timed out on it now and then. Both ranks then leave together.
        queue.close()
        queue.join_thread()
        dist.barrier()
    finally:
        dist.destroy_process_group()
