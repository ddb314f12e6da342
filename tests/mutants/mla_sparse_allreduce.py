"""Bug class (mla_sparse): a custom all-reduce's capture corrupts sparse-MLA replay (vLLM #41760 ->
#41835, ROCm: DeepSeek V3.2 at tp 4 gave garbage under HIP graphs).

Here the backend's own tp all-reduce does nothing while a graph is captured (a communicator not
ready at capture), so every captured graph returns a rank's partial sum of the row-parallel
projection after the sparse MLA: red at tp > 1 in every mode that captures it (PIECEWISE and the
FULL ones), green at tp 1 and in eager.
"""

from __future__ import annotations

import torch

from backend.graphs import is_capturing
from backend.harness.distributed import all_reduce_
from backend.providers.torch_mla_sparse import TorchSparseMLABackend


def _all_reduce_unless_capturing(t: torch.Tensor) -> torch.Tensor:
    return t if is_capturing() else all_reduce_(t)


class Backend(TorchSparseMLABackend):
    name = "mutant-mla-sparse-allreduce"
    tp_all_reduce = staticmethod(_all_reduce_unless_capturing)
