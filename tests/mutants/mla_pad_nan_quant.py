"""Bug class (MLA): padded requests of a FULL decode graph have seq_len 0, the split-KV reduce
divides 0 by 0 there, and a per-tensor quantiser after attention spreads the NaN to every row
(vLLM #57017, open in 0.34; #37442): its scale is the amax of the whole output, padded rows
included.

The quantiser's rounding is left out (its scale multiplies and divides back), so eager, which
has no padded rows, is exact; in a padded FULL decode graph the scale is NaN and so is every real
row: the finite check fails where a decode graph pads.
"""

from __future__ import annotations

import torch

from backend.providers import mla_ops
from backend.providers.torch_mla import TorchMLABackend, TorchMLAImpl


class Impl(TorchMLAImpl):
    def decode(self, qq, kv_cache, md, k_scale):
        o = mla_ops.absorbed_decode(qq, kv_cache, md, k_scale, self.config.scale, self.dims, md.num_decode_tokens)
        # The unguarded acc / e_sum of a split-KV reduce: a token with no key gets 0/0.
        has_key = torch.arange(o.shape[0], device=o.device) < md.query_start_loc[-1]
        o = torch.where(has_key[:, None, None], o, torch.full_like(o, float("nan")))
        scale = o.abs().amax() / 448.0  # per-tensor fp8 scale over every row
        return o / scale * scale


class Backend(TorchMLABackend):
    name = "mutant-mla-pad-nan-quant"
    impl_cls = Impl
