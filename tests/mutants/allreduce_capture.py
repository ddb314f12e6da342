"""Bug class: a collective skipped during graph capture (vLLM #29539).

The backend brings its own tp all-reduce, which does nothing while a graph is being captured
(as a communicator that is "not ready" during warm-up/capture would). Eager steps reduce
correctly, so the reference check passes; every captured graph has no reduction in it, so at
tp > 1 replays return one rank's partial sum: the replay check fails in every mode that
captures the row-parallel projection (PIECEWISE and the FULL ones). Invisible at tp 1.
"""

from __future__ import annotations

import torch

from backend.graphs import is_capturing
from backend.harness.distributed import all_reduce_
from backend.providers.torch_backend import TorchBackend


def _all_reduce_unless_capturing(t: torch.Tensor) -> torch.Tensor:
    if is_capturing():
        return t
    return all_reduce_(t)


class Backend(TorchBackend):
    name = "mutant-allreduce-capture"
    tp_all_reduce = staticmethod(_all_reduce_unless_capturing)
