"""A backend that declares `jit_kernels` (as the AITER Triton providers do) but runs the torch
provider's ops, so the Triton warm-up's helpers can be run on the CPU (tests/executor/test_precompile.py)."""

import os
import time

from backend.providers.torch_backend import TorchBackend, TorchImpl

HOLD_ENV = "ORCH_TEST_JIT_HOLD"  # a file: HeldJitBackend's forward waits while it exists


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


class _HeldImpl(TorchImpl):
    def forward(self, *args, **kwargs):
        # Held while the test's hold file exists: a helper that cannot finish before the test
        # stops it, however fast the machine (the precompile helpers inherit the test's env).
        hold = os.environ.get(HOLD_ENV)
        while hold and os.path.exists(hold):
            time.sleep(0.05)
        return super().forward(*args, **kwargs)


class HeldJitBackend(JitTorchBackend):
    name = "held-jit-torch"
    impl_cls = _HeldImpl
