"""Bug class: NaN on a real output row (a softmax over a fully masked row, 0/0), eager and
graphs alike: the first real token's first head. The finite check names it; reference and replay
see it too (NaN is never close), so the load-bearing test switches those off to show that the
finite check alone catches it.
"""

from __future__ import annotations

from backend.providers.torch_backend import TorchBackend, TorchImpl


class NaNOutputImpl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        out = super().attend(query, kv_cache, metadata, k_scale, v_scale, output)
        out[:1, :1].fill_(float("nan"))
        return out


class Backend(TorchBackend):
    name = "mutant-nan-output"
    impl_cls = NaNOutputImpl
