"""Bug class: nondeterministic kernels, alone and on top of a real bug (the determinism rule).

`Backend`: correct attention plus a fresh random nudge of 0.05 on every element (an atomics-style
reduction order that changes every run); eager disagrees with itself by about as much as it
disagrees with the reference, so the verdict is FLAKY. `WrongBackend`: the wrong_prefill bug
plus a nudge of 1e-3; eager jitter is far below the reference error, so the verdict must stay
FAIL. The noise comes from the global RNG on purpose: each run draws different numbers.
"""

from __future__ import annotations

import torch

from backend.attention.torch_backend import TorchBackend, TorchImpl
from tests.mutants.wrong_prefill import WrongPrefillImpl


def _nudge(out: torch.Tensor, t: int, size: float) -> None:
    out[:t].add_((torch.rand(out[:t].shape, device=out.device) * size).to(out.dtype))


class JitteryImpl(TorchImpl):
    nudge = 0.05

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        out = super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        _nudge(out, metadata.num_padded_tokens, self.nudge)
        return out


class JitteryWrongImpl(WrongPrefillImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        out = super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)
        _nudge(out, metadata.num_padded_tokens, 1e-3)
        return out


class Backend(TorchBackend):
    name = "mutant-jittery"
    impl_cls = JitteryImpl


class WrongBackend(TorchBackend):
    name = "mutant-jittery-wrong"
    impl_cls = JitteryWrongImpl
