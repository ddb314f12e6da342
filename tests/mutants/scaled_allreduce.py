"""Bug class: the row-parallel reduction wrong by a factor (a communicator that sums a rank's
partial twice, or averages instead of summing), outside attention.

`Backend`: the backend's `tp_all_reduce` scales by 1.5 in eager and graphs alike: attention is
right in the first layer, the residual stream is not, so only the reference check on the model
output sees it (with one layer, nothing after it feeds another attention). `CapturedBackend`: the
same only on the capture path (a communicator configured differently while capturing, cf.
allreduce_capture): eager is right, replays are not, so only the replay check sees it (visible at
tp 1, unlike allreduce_capture, since it scales instead of skipping).
"""

from __future__ import annotations

import torch

from backend.graphs import is_capturing
from backend.harness.distributed import all_reduce_
from backend.providers.torch_backend import TorchBackend


def _scaled(t: torch.Tensor) -> torch.Tensor:
    all_reduce_(t)
    return t.mul_(1.5)


def _scaled_when_capturing(t: torch.Tensor) -> torch.Tensor:
    all_reduce_(t)
    return t.mul_(1.5) if is_capturing() else t


class Backend(TorchBackend):
    name = "mutant-scaled-allreduce"
    tp_all_reduce = staticmethod(_scaled)


class CapturedBackend(TorchBackend):
    name = "mutant-scaled-allreduce-captured"
    tp_all_reduce = staticmethod(_scaled_when_capturing)
