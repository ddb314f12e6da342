"""Which aten ops a real graph capture refuses because they read device data on the host, and the
one op PyTorch turns into a graph-safe one on a GPU (DESIGN.md §4).

On CPU these ops read memory directly; on a GPU each waits for the device and copies to the host,
which a capturing stream refuses (cudaErrorStreamCaptureUnsupported). The emulation raises
GraphCaptureError for them as a real capture fails.
"""

from __future__ import annotations

from typing import Any

import torch

from backend.graphs.host import is_host
from backend.graphs.leaves import leaves

# Ops whose result depends on tensor data on the host (a device->host sync on a GPU).
HOST_SYNC_OPS = frozenset(
    {
        "aten::_local_scalar_dense",
        "aten::is_nonzero",
        "aten::nonzero",
        "aten::masked_select",
        "aten::_unique",
        "aten::_unique2",
        "aten::unique_dim",
        "aten::unique_consecutive",
        "aten::unique_dim_consecutive",
        "aten::equal",
        "aten::bincount",
        "aten::argwhere",
        "aten::allclose",
        "aten::item",  # aten::item is seen when dispatched inside an op's body
        # torch.linalg's error checks (cholesky, inv, solve, ...: `info` read on the host); the `_ex`
        # forms return `info` instead and capture.
        "aten::_linalg_check_errors",
    }
)
# What a backend wrote that reached each sync op: the aten name alone does not say `.item()`.
_PYTHON_FORM = {
    "aten::_local_scalar_dense": "`.item()` (or int()/float()/bool() of a tensor)",
    "aten::item": "`.item()` (or int()/float()/bool() of a tensor)",
    "aten::is_nonzero": "`if tensor:` (or bool() of a tensor)",
    "aten::nonzero": "`nonzero()` (its output size is read from the data)",
    "aten::argwhere": "`argwhere()` (its output size is read from the data)",
    "aten::masked_select": "`masked_select()` (its output size is read from the data)",
    "aten::equal": "`torch.equal()`",
    "aten::allclose": "`torch.allclose()`",
    "aten::bincount": "`bincount()` (its output size is read from the data)",
    **{
        op: "`unique()` (its output size is read from the data)"
        for op in (
            "aten::_unique",
            "aten::_unique2",
            "aten::unique_dim",
            "aten::unique_consecutive",
            "aten::unique_dim_consecutive",
        )
    },
}
_BOOL_INDEX_OPS = frozenset({"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"})
_PUT_OPS = frozenset({"aten::index_put", "aten::index_put_", "aten::_index_put_impl_"})


def host_sync_reason(func: torch._ops.OpOverload, args: tuple, kwargs: dict, flat: list | None = None) -> str | None:
    name = func._schema.name
    if name in HOST_SYNC_OPS:
        if name == "aten::_linalg_check_errors":
            return f"{func} (torch.linalg's error check reads `info` on the host; the _ex form does not)"
        return f"{_PYTHON_FORM.get(name, 'an op')}: a host read of a device tensor ({func})"
    if name == "aten::histc":
        lo = args[2] if len(args) > 2 else kwargs.get("min", 0)
        hi = args[3] if len(args) > 3 else kwargs.get("max", 0)
        if lo == hi:
            return f"{func} with min == max (the range is read from the data on the host)"
    if any(isinstance(x, torch.Generator) for x in (leaves((args, kwargs)) if flat is None else flat)):
        return (
            f"{func} with an explicit torch.Generator (a CUDA graph refuses a generator it was "
            "not given through register_generator_state)"
        )
    if (
        name == "aten::repeat_interleave"
        and func._overloadname in ("Tensor", "self_Tensor")
        and kwargs.get("output_size") is None
    ):
        return f"{func} without output_size (output shape depends on tensor data)"
    if name in _BOOL_INDEX_OPS:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        for ix in indices or ():
            if isinstance(ix, torch.Tensor) and ix.dtype in (torch.bool, torch.uint8):
                return f"{func} with a boolean mask (output shape depends on tensor data)"
    return None


def masked_fill_form(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict] | None:
    """`x[mask] = scalar` as PyTorch runs it on a GPU: index_put_ with one boolean mask on the
    device and a one-element value in host memory becomes `masked_fill_(mask, value.item())`
    (aten/src/ATen/native/TensorAdvancedIndexing.cpp, _index_put_impl_ -> canDispatchToMaskedFill):
    no nonzero, no sync, graph-safe, the value read once on the host. Returns the op to record
    instead, or None when the GPU would not take this path (then the mask is a sync)."""
    if func._schema.name not in _PUT_OPS:
        return None
    self = args[0]
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    value = args[2] if len(args) > 2 else kwargs.get("values")
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    if accumulate or not isinstance(value, torch.Tensor) or value.numel() != 1 or not is_host(value):
        return None
    mask, dims = None, 0
    for ix in indices or ():
        if ix is None:
            dims += 1
            continue
        # uint8 masks take the same path on a GPU but masked_fill refuses them here: left to the
        # sync rule (a conservative capture error)
        if ix.dtype != torch.bool or is_host(ix) or mask is not None:
            return None
        if tuple(ix.shape) != tuple(self.shape[dims : dims + ix.dim()]):
            return None
        mask, dims = ix, dims + ix.dim()
    if mask is None:
        return None
    for _ in range(dims, self.dim()):
        mask = mask.unsqueeze(-1)
    scalar = value.item()
    if func._schema.name == "aten::index_put":
        return torch.ops.aten.masked_fill.Scalar, (self, mask, scalar), {}
    return torch.ops.aten.masked_fill_.Scalar, (self, mask, scalar), {}
