"""fp8 on ROCm: e4m3fnuz (gfx942) is not e4m3fn (NVIDIA, gfx950). Real torch float8 ops on CPU show
the two facts our scales and caches depend on: each format saturates at its own max (240 vs 448),
so scales must be derived from the cache dtype's finfo, and the same bytes read in the other format
are off by a factor of 2 (exponent bias 8 vs 7), so a cache must be read in the format it was
written in."""

from __future__ import annotations

import pytest
import torch

from backend.attention.kv_cache import dequantize, fp8_dtype, quantize_fp8

FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz


@pytest.mark.parametrize("dtype,fmax", [(FN, 448.0), (FNUZ, 240.0)])
def test_quantiser_saturates_at_the_formats_own_max(dtype, fmax):
    scale = torch.tensor([0.5])
    x = torch.tensor([fmax * 0.5, fmax * 0.5 * 1.5, -1e6, 0.0])  # in range, 1.5x over, far under
    q = quantize_fp8(x, scale, dtype)
    back = dequantize(q, scale)
    assert torch.isfinite(back).all()
    assert back.tolist() == [fmax * 0.5, fmax * 0.5, -fmax * 0.5, 0.0]


@pytest.mark.parametrize("dtype", [FN, FNUZ])
def test_in_range_round_trip_is_within_e4m3_precision(dtype):
    scale = torch.tensor([0.01])
    x = torch.linspace(-2.0, 2.0, 101)  # |x| / scale <= 200 < 240: in range for both formats
    back = dequantize(quantize_fp8(x, scale, dtype), scale)
    torch.testing.assert_close(back, x, atol=scale.item() * 2**-6, rtol=2**-3)


def test_fn_bytes_read_as_fnuz_are_half_the_value():
    x = torch.tensor([1.0, -3.0, 0.25, 96.0])  # exactly representable in both
    as_fnuz = x.to(FN).view(torch.uint8).view(FNUZ).float()
    torch.testing.assert_close(as_fnuz, x / 2)


def test_cpu_caches_use_e4m3fn():
    assert fp8_dtype("cpu") == FN


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_fp8_lookup_is_bitwise_the_conversion(dtype):
    """kv_cache.fp8_to_float (a table by byte on the CPU) gives x.float()'s bits for every
    one of the 256 values (NaN and -0 included) and for a strided view of a cache."""
    from backend.attention.kv_cache import dequantize, fp8_to_float

    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    assert torch.equal(fp8_to_float(every).view(torch.int32), every.float().view(torch.int32))
    cache = torch.randn(4, 16, 2, 8).mul(40).to(dtype)[:, :, 1:]  # one kv head of two: not contiguous
    assert not cache.is_contiguous()
    got = fp8_to_float(cache)
    assert got.shape == cache.shape and torch.equal(got.view(torch.int32), cache.float().view(torch.int32))
    scale = torch.tensor([0.37])
    assert torch.equal(dequantize(cache, scale).view(torch.int32), (cache.float() * scale).view(torch.int32))
