"""Bug class: nondeterministic kernels, alone and on top of a real bug (the determinism rule).

`Backend`: correct attention plus a fresh random nudge of 0.05 on every element (an atomics-style
reduction order that changes every run); eager disagrees with itself by about as much as it
disagrees with the reference, so the verdict is FLAKY. `WrongBackend`: the wrong_prefill bug
plus a nudge of 1e-3; eager jitter is far below the reference error, so the verdict must stay
FAIL. `TinyBackend`: a nudge of 1e-3 alone, below every tolerance: only the determinism check
sees it (FLAKY), the counterpart of tests/checker/test_load_bearing.py.

The noise is a hash of (element, call count), the count a device tensor the forward increments
in place: each run differs, and a captured graph replays the increment, so replays differ too.
No RNG on purpose: torch's default CUDA generator refuses eager draws ("Offset increment outside
graph capture encountered unexpectedly") once a capture in the process has failed between
capture_begin and the generator's capture epilogue (its state stays `capturing_`; the mutation
suite's capture-error mutants do exactly that), and an explicit generator is a capture error.
"""

from __future__ import annotations

import torch

from backend.providers.torch_backend import TorchBackend, TorchImpl
from tests.mutants.wrong_prefill import WrongPrefillImpl


class _Noise:
    """Pseudo-random values in [0, 1) that change on every call, eager or replayed."""

    def __init__(self, device):
        self.calls = torch.zeros((), dtype=torch.float32, device=device)

    def nudge(self, out: torch.Tensor, t: int, size: float) -> None:
        self.calls.add_(1.0)  # in place, on the device: captured, and replayed each time
        view = out[:t]
        idx = torch.arange(view.numel(), device=out.device, dtype=torch.float32).reshape(view.shape)
        u = torch.frac(torch.sin(idx * 12.9898 + self.calls * 78.233) * 43758.5453).abs()
        view.add_((u * size).to(out.dtype))


class JitteryImpl(TorchImpl):
    nudge = 0.05

    def __init__(self, config):
        super().__init__(config)
        self._noise = _Noise(config.device)

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        out = super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        self._noise.nudge(out, metadata.num_padded_tokens, self.nudge)
        return out


class TinyJitteryImpl(JitteryImpl):
    nudge = 1e-3


class JitteryWrongImpl(WrongPrefillImpl):
    def __init__(self, config):
        super().__init__(config)
        self._noise = _Noise(config.device)

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        out = super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        self._noise.nudge(out, metadata.num_padded_tokens, 1e-3)
        return out


class Backend(TorchBackend):
    name = "mutant-jittery"
    impl_cls = JitteryImpl


class TinyBackend(TorchBackend):
    name = "mutant-jittery-tiny"
    impl_cls = TinyJitteryImpl


class WrongBackend(TorchBackend):
    name = "mutant-jittery-wrong"
    impl_cls = JitteryWrongImpl
