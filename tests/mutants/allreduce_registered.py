"""Bug class: a custom all-reduce whose graph buffers were never registered (vLLM's custom
all-reduce records each captured buffer's `data_ptr()` during capture and reduces those addresses
with a kernel it launches itself; when the registration is missing the graph holds no reduction).

While a graph is captured this communicator takes the buffer's raw address, as the registration
does, and returns without reducing; eager steps reduce. At tp 2 every replay returns one rank's
partial sum. On a GPU the replay check fails. Under the CPU emulation the address leaves the
dispatcher untaken (backend/graphs/opaque.py): the emulation cannot know what the pointer was for,
but it sees the replay disagree with eager, so the verdict is UNVERIFIABLE ("run on a GPU to
decide"), which fails the gate: it once was a PASS and the gate passed.
"""

from __future__ import annotations

import torch

from backend.graphs import is_capturing
from backend.harness.distributed import all_reduce_
from backend.providers.torch_backend import TorchBackend

# Addresses "registered" during capture, for a launch that never comes.
REGISTERED: list[int] = []


def _all_reduce_registering(t: torch.Tensor) -> torch.Tensor:
    if is_capturing():
        REGISTERED.append(t.data_ptr())
        return t
    return all_reduce_(t)


class Backend(TorchBackend):
    name = "mutant-allreduce-registered"
    tp_all_reduce = staticmethod(_all_reduce_registering)
