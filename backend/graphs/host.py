"""Which CPU tensors are host memory in the emulation (DESIGN.md §4): a registry, not a subclass.

On CPU the emulated device and the host are one device, so a tensor is a device tensor unless it
was marked here. Callers mark the tensors that stand for host memory (a builder's pinned staging
buffer, host-side query lens); on a real GPU those are plain CPU tensors and marking is a no-op
there. The mark belongs to the storage: every view, slice or reshape sharing it is host memory
too, also one that outlives the tensor that was marked, for as long as the storage lives (a weak
reference to the storage, so a freed and reused pointer is not taken for host memory).
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef

# storage data_ptr -> (weak ref to the marked storage, pinned)
_HOST: dict[int, tuple[StorageWeakRef, bool]] = {}
# Entries of freed storages go when looked up, and all at once when the registry doubles
# (backend/graphs/provenance.py marks every host tensor a session's set-up and captures make).
_PRUNE_AT = [1024]


def _ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def mark_host(t: torch.Tensor, pinned: bool = False) -> torch.Tensor:
    """Mark `t` (and every view of its storage) as host memory; pinned=True for a pinned buffer
    (the only source a graph may copy host->device from at replay). Returns `t`."""
    ptr = _ptr(t)
    if ptr:
        _HOST[ptr] = (StorageWeakRef(t.untyped_storage()), pinned)
        if len(_HOST) >= _PRUNE_AT[0]:
            for key in [k for k, (ref, _) in _HOST.items() if ref.expired()]:
                del _HOST[key]
            _PRUNE_AT[0] = max(1024, 2 * len(_HOST))
    return t


def _entry(t: torch.Tensor) -> tuple[StorageWeakRef, bool] | None:
    entry = _HOST.get(_ptr(t))
    if entry is None:
        return None
    if entry[0].expired():  # the marked storage was freed; its pointer may be reused
        _HOST.pop(_ptr(t), None)
        return None
    return entry


def is_host(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and _entry(t) is not None


def is_pinned_host(t: torch.Tensor) -> bool:
    entry = _entry(t)
    return entry is not None and entry[1]


def host_tensor(t: torch.Tensor, device: torch.device | str, pinned: bool = False) -> torch.Tensor:
    """`t` as host memory for a program on `device`: a (pinned) CPU tensor on a GPU, a marked CPU
    tensor under the emulation."""
    t = t.cpu()
    if torch.device(device).type == "cpu":
        return mark_host(t, pinned)
    return t.pin_memory() if pinned else t
