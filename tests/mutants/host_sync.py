"""Bug class: a host sync inside the forward (AITER's pa_decode wrapper calls k_scale.item()).

Reads the longest sequence on the host to size its work. Fine eagerly and in PIECEWISE; a FULL
capture fails (cudaErrorStreamCaptureInvalidated on a GPU, GraphCaptureError in the emulation),
which the checker reports as ERROR with error_kind "capture", not a crash.
"""

from __future__ import annotations

from backend.providers.torch_backend import TorchBackend, TorchImpl


class HostSyncImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        self.longest = int(metadata.seq_lens.max())  # device -> host: not capturable
        return super().forward(query, key, value, kv_cache, metadata, k_scale, v_scale, output)


class Backend(TorchBackend):
    name = "mutant-host-sync"
    impl_cls = HostSyncImpl
