"""The emulated runner re-issues c10d collectives at replay, in order, on every rank (gloo, 2 processes)."""

from __future__ import annotations

import socket

import torch.multiprocessing as mp

from tests.graphs._dist_worker import allreduce_replay


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_allreduce_replayed_across_two_ranks():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=allreduce_replay, args=(rank, port, 2, queue)) for rank in range(2)]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=90) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():  # a hung rank must not outlive the test
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    for rank in (0, 1):
        r = results[rank]
        assert "c10d.allreduce_.default" in r["ops"]
        # step 0: ranks hold 1 and 2 -> 3 + 1; step 1: 11 and 12 -> 23 + 1 (the sum, not the local value)
        assert r["step0"] == [4.0] * 4
        assert r["step1"] == [24.0] * 4
        # Not re-issuing the collective leaves the local partial sum: rank+11 + 1.
        assert r["without_collective"] == [rank + 12.0] * 4
