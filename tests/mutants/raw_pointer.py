"""A correct backend whose Impl finishes its output with a copy on raw pointers, behind PyTorch's
dispatcher: the output goes to a scratch buffer by address and is copied back. On a
GPU a kernel launched this way (a C extension, Triton, ctypes) is captured like any other. Under
the CPU emulation: the ctypes form is recorded and replayed (PASS, as on a GPU); the numpy form
(numpy's C code copying between addresses: a C extension the emulation cannot see into) is
`emulation: unverifiable` (a disagreement there: status UNVERIFIABLE); the alignment check takes a
pointer and launches nothing (a pass the emulation cannot vouch for). CPU only: neither copy
copies device memory on a GPU.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from backend.providers.torch_backend import TorchBackend, TorchImpl

_MEMCPY = ctypes.CDLL(None).memcpy
_MEMCPY.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_MEMCPY.restype = ctypes.c_void_p


class _Raw:
    def __init__(self, ptr: int, nbytes: int):
        self.__array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}


def _ctypes_copy(dst: int, src: int, nbytes: int) -> None:
    _MEMCPY(dst, src, nbytes)


def _numpy_copy(dst: int, src: int, nbytes: int) -> None:
    np.copyto(np.asarray(_Raw(dst, nbytes)), np.asarray(_Raw(src, nbytes)))


class _RawCopyImpl(TorchImpl):
    copy = staticmethod(_ctypes_copy)

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        out = super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        assert out.is_contiguous()
        scratch = torch.empty_like(out)
        self.copy(scratch.data_ptr(), out.data_ptr(), out.numel() * out.element_size())
        out.copy_(scratch)
        return out


class _NumpyCopyImpl(_RawCopyImpl):
    copy = staticmethod(_numpy_copy)


class _PoisonedScratchImpl(_NumpyCopyImpl):
    """The numpy copy into a scratch the graph's own ops fill with NaN first: what a replay reads
    when the copy it cannot see leaves the pool's uninitialised bytes (pool.py poisons them, which
    depends on how the model's blocks are shared; this makes it certain)."""

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        out = TorchImpl.forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        scratch = torch.full_like(out, float("nan"))
        self.copy(scratch.data_ptr(), out.data_ptr(), out.numel() * out.element_size())
        out.copy_(scratch)
        return out


class _AlignmentCheckImpl(TorchImpl):
    """Correct: a wrapper's alignment check on the output's address (kernels with vectorised stores
    assert it). The pointer leaves the dispatcher and nothing launches on it: the replay is right,
    but the emulation cannot know that no C extension used it."""

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        assert output.data_ptr() % output.element_size() == 0
        return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)


class CtypesBackend(TorchBackend):
    name = "mutant-raw-pointer-ctypes"
    impl_cls = _RawCopyImpl


class CExtensionBackend(TorchBackend):
    name = "mutant-raw-pointer-c-extension"
    impl_cls = _NumpyCopyImpl


class AlignmentCheckBackend(TorchBackend):
    name = "mutant-raw-pointer-alignment-check"
    impl_cls = _AlignmentCheckImpl


class PoisonedCExtensionBackend(TorchBackend):
    name = "mutant-raw-pointer-c-extension-nan"
    impl_cls = _PoisonedScratchImpl
