"""Module-level functions for spawned gang tests (spawn pickles functions by module path)."""

from __future__ import annotations

import torch

from backend.harness.distributed import all_reduce_, world


def reduce_rank(rank: int, world_size: int, scale: float) -> tuple[int, int, float]:
    t = torch.tensor([float(rank + 1) * scale])
    all_reduce_(t)
    return (*world(), float(t))


def fail_on_rank_1(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("rank 1 broke on purpose")
    return rank
