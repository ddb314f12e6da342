"""A backend that declares `jit_kernels` (as the AITER Triton providers do) but runs the torch
provider's ops, so the Triton warm-up's helpers can be run on the CPU (tests/executor/test_precompile.py)."""

from backend.providers.torch_backend import TorchBackend, TorchImpl


class JitTorchBackend(TorchBackend):
    name = "jit-torch"
    jit_kernels = True


class _CountingImpl(TorchImpl):
    def forward(self, *args, **kwargs):
        CountingJitBackend.calls += 1
        return super().forward(*args, **kwargs)


class CountingJitBackend(JitTorchBackend):
    """Counts its attention calls (the kernels a warm-up launches)."""

    name = "counting-jit-torch"
    impl_cls = _CountingImpl
    calls = 0
