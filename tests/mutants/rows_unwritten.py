"""Bug class: a kernel that leaves rows of its output unwritten (ROCm MLA's padded rows, vLLM
#37682; AITER's varlen prefill skips rows with seqlen_q <= min_seqlen_q and relies on another
kernel writing them).

Here attention writes the rows of real tokens only (the count read live from the device
metadata) and leaves the padded rows of the output buffer as they were. Eager has no padded rows;
a FULL graph's output buffer is the session's static attention buffer, which held whatever the
previous replay (or the PIECEWISE run between pieces) wrote there: finite values, and before #39
the case passed. The checker now fills it with NaN before every replay: padded_finite fails
wherever a FULL graph pads.
"""

from __future__ import annotations

import torch

from backend.providers.torch_backend import TorchBackend, TorchImpl, paged_causal_attention


class _RealRowsImpl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        t = metadata.num_padded_tokens
        out = paged_causal_attention(query[:t], kv_cache[0], kv_cache[1], metadata, k_scale, v_scale,
                                     self.config.scale).to(output.dtype)
        real = (torch.arange(t, device=out.device) < metadata.query_start_loc[-1])[:, None, None]
        output[:t].copy_(torch.where(real, out, output[:t]))  # padded rows: as they were
        return output


class Backend(TorchBackend):
    name = "mutant-rows-unwritten"
    impl_cls = _RealRowsImpl
