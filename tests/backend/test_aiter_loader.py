"""aiter_loader's NVIDIA adaptations that need no GPU to check: the MHA tile choice."""

from __future__ import annotations

import pytest
import torch

from backend.providers import aiter_loader as L


@pytest.mark.parametrize(
    "q_dim, v_dim, given, expect",
    [
        (192, 128, None, "non-pe tiles"),  # MLA prefill: the json's pe tiles overflow an H100's smem
        (128, 128, None, None),  # q as wide as v: aiter picks its own config
        (192, 128, {"BLOCK_M": 16}, {"BLOCK_M": 16}),  # a caller's config is left alone
    ],
)
def test_mha_on_nvidia_takes_the_non_pe_tiles_for_wide_queries(q_dim, v_dim, given, expect):
    seen, asked = {}, []

    def varlen(q, k, v, *args, **kwargs):
        seen.update(kwargs)

    def get_config(dropout, dtype, has_pe=False):
        asked.append((dropout, dtype, has_pe))
        return "non-pe tiles"

    launch = L._mha_within_cuda_smem(varlen, get_config)
    q, v = torch.zeros(2, 1, q_dim), torch.zeros(2, 1, v_dim)
    launch(q, q, v, softmax_scale=0.1, causal=True, **({"config": given} if given else {}))
    assert seen.get("config") == expect
    assert asked == ([(False, torch.float32, False)] if expect == "non-pe tiles" else [])
