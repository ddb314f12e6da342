"""Bug class (MLA): the decode kernel writes only the rows of real requests and leaves the padded
rows of its output as they were (ROCm MLA, vLLM #37682): there, a workspace that was never
written. Modelled deterministically as NaN, what uninitialised memory may hold.

Real rows are right; eager has no padded rows. Only padded_finite sees it, where a FULL decode
graph pads.
"""

from __future__ import annotations

import torch

from backend.providers import mla_ops
from backend.providers.torch_mla import TorchMLABackend, TorchMLAImpl


class Impl(TorchMLAImpl):
    def decode(self, qq, kv_cache, md, k_scale):
        o = mla_ops.absorbed_decode(qq, kv_cache, md, k_scale, self.config.scale, self.dims, md.num_decode_tokens)
        workspace = torch.full_like(o, float("nan"))  # never written where no request is
        real = torch.arange(o.shape[0], device=o.device) < md.query_start_loc[-1]
        return torch.where(real[:, None, None], o, workspace)


class Backend(TorchMLABackend):
    name = "mutant-mla-pad-rows-unwritten"
    impl_cls = Impl
