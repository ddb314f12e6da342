"""Bug class: ranks of one tp gang resolve different cudagraph modes (vLLM #45094: under pipeline
parallelism one rank resolved PIECEWISE and another NONE, `tests/v1/cudagraph/
test_pp_cudagraph_consensus.py`). Here rank 1 reads a lower support level than rank 0
(UNIFORM_SINGLE_TOKEN_DECODE against ALWAYS), as a backend whose support depends on a rank-local
fact would: FULL resolves to FULL on rank 0 and to FULL_AND_PIECEWISE on rank 1. Each rank's own
checks pass (both modes compute the right thing); only the gang's rank_consensus check sees it.
Every other mode resolves alike on both ranks and passes.
"""

from __future__ import annotations

import torch.distributed as dist

from backend.attention.interface import AttentionCGSupport
from backend.providers.torch_backend import TorchBackend


class _RankLocalSupport(type):
    @property
    def cudagraph_support(cls) -> AttentionCGSupport:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE if rank == 1 else AttentionCGSupport.ALWAYS


class Backend(TorchBackend, metaclass=_RankLocalSupport):
    name = "mutant-rank-split-mode"
