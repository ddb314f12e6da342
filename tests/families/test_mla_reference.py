"""The MLA family's fp32 reference (backend/families/mla.py): its two forms agree, it uses the
model's scale, and an fp8 cache's one k_scale dequantises K and V alike (correct for MLA)."""

from __future__ import annotations

import pytest
import torch

from backend.attention.mla import MLADims
from backend.families import family
from backend.families.mla import reference_requests, split_kv_b
from tests.families.conftest import TINY_MLA

D = MLADims(kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16)
H = 4


def _inputs(seed: int, query_lens, seq_lens):
    g = torch.Generator().manual_seed(seed)
    q = [torch.randn(ql, H, D.qk_nope_head_dim + D.qk_rope_head_dim, generator=g) for ql in query_lens]
    rows = [torch.randn(s, D.row, generator=g) for s in seq_lens]
    w_kv_b = torch.randn(H * (D.qk_nope_head_dim + D.v_head_dim), D.kv_lora_rank, generator=g) / D.kv_lora_rank**0.5
    w_uk, w_uv = split_kv_b(w_kv_b, H, D)
    return q, rows, w_uk, w_uv


# (query lens, seq lens): decode rows, a verify block, fresh and chunked prefills
BATCHES = {
    "decode": ([1, 1, 1], [5, 33, 70]),
    "verify q=3": ([3, 3], [20, 41]),
    "prefill + extend": ([7, 12], [7, 50]),
    "one token of context": ([1], [1]),
}


@pytest.mark.parametrize("name", BATCHES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_absorbed_and_decompressed_forms_agree(name, seed):
    q, rows, w_uk, w_uv = _inputs(seed, *BATCHES[name])
    scale = family("mla").scale(TINY_MLA)
    absorbed = reference_requests(q, rows, w_uk, w_uv, D, scale, "absorbed")
    decompressed = reference_requests(q, rows, w_uk, w_uv, D, scale, "decompressed")
    for a, b in zip(absorbed, decompressed):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_the_forms_can_disagree():
    """The agreement above can fail: the same inputs with the decompressed form's rope part
    dropped (k_pe zeroed on one side only) are far apart."""
    q, rows, w_uk, w_uv = _inputs(0, *BATCHES["decode"])
    scale = family("mla").scale(TINY_MLA)
    a = reference_requests(q, rows, w_uk, w_uv, D, scale, "absorbed")
    rows_no_pe = [torch.cat([r[:, : D.kv_lora_rank], torch.zeros_like(r[:, D.kv_lora_rank :])], 1) for r in rows]
    b = reference_requests(q, rows_no_pe, w_uk, w_uv, D, scale, "decompressed")
    assert max((x - y).abs().max().item() for x, y in zip(a, b)) > 1e-2


def test_scale_is_the_models_mha_scale_not_the_latent_width():
    assert family("mla").scale(TINY_MLA) == pytest.approx((16 + 16) ** -0.5)
    assert family("mla").scale(TINY_MLA) != pytest.approx((32 + 16) ** -0.5)


def test_fp8_one_scale_for_the_whole_row():
    """The latent cache has one plane, dequantised by the K scale: V is the latent, so the GQA
    rule "V uses its own scale" has nothing to apply to here."""
    mla = family("mla")
    k, v = torch.tensor([0.5]), torch.tensor([2.0])
    assert mla.plane_scales(k, v) == (k,)
    gqa = family("gqa")
    assert gqa.plane_scales(k, v) == (k, v)
