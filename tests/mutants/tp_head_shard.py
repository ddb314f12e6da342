"""Bug class: tensor-parallel head sharding wrong.

The Impl permutes its local query heads by the tp rank (rank r rolls them by r), as a kernel
that offsets head indices with the global rank would: rank 0 is right, every other rank attends
with another head's query. Invisible at tp 1; at tp 2 the all-reduced output is wrong on every
rank, in every mode (eager included), so the reference check flags it.
"""

from __future__ import annotations

import torch.distributed as dist

from backend.providers.torch_backend import TorchBackend, TorchImpl


class TPHeadShardImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if rank:
            query = query.roll(shifts=rank, dims=1)
        return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)


class Backend(TorchBackend):
    name = "mutant-tp-head-shard"
    impl_cls = TPHeadShardImpl
