"""Bug class: a host sync inside a custom op's body (AITER pa_decode's k_scale.item(), wrapped in
a torch.library op the way AITER and vLLM ship their kernels).

The op reads the longest sequence on the host. Fine eagerly and in PIECEWISE; a FULL capture
fails. An emulation that ran the op as one opaque call would never see the .item() inside and
would pass it; recording through the body turns it into ERROR with error_kind "capture".
"""

from __future__ import annotations

import torch

from backend.providers.torch_backend import TorchBackend, TorchImpl


@torch.library.custom_op("orch_mutant::longest_seq", mutates_args=())
def _longest_seq(seq_lens: torch.Tensor) -> torch.Tensor:
    longest = int(seq_lens.max().item())  # device -> host: not capturable
    return torch.full((1,), longest, dtype=seq_lens.dtype, device=seq_lens.device)


@_longest_seq.register_fake
def _(seq_lens):
    return seq_lens.new_empty(1)


class CustomOpHostSyncImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        self.longest = torch.ops.orch_mutant.longest_seq(metadata.seq_lens)
        return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)


class Backend(TorchBackend):
    name = "mutant-customop-host-sync"
    impl_cls = CustomOpHostSyncImpl
