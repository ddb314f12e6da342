"""mla_sparse's fp8_ds_mla cache (backend/attention/ds_mla.py, backend/families/mla_sparse_cache.py):
the byte layout, the round trip through a write and a read against the reference's own rounding,
-1 slots, garbage that decodes finite, and the cells other backends skip."""

from __future__ import annotations

import functools

import pytest
import torch

from backend.attention import ds_mla
from backend.attention.ds_mla import DSMLALayout
from backend.families import family
from backend.families.mla_sparse_cache import garbage_views, layout_of, round_rows
from backend.harness.checker import run_case
from backend.result import Status
from tests.families.test_mla_sparse import TINY, make_case, sparse_sessions  # noqa: F401 - a pytest fixture, used by name

DEEPSEEK = DSMLALayout(latent=512, rope=64, index_dim=128)
CPU = DSMLALayout.of(TINY)  # L 32, R 16, Di 16


@pytest.mark.parametrize(
    "layout, row_bytes, index_bytes, tile, index_tile",
    [
        (DEEPSEEK, 656, 132, 128, 128),  # vLLM's 656-byte row, its indexer's 128 + 4
        (CPU, 80, 20, 8, 16),  # 32 + 16 + 32; still 4 tiles a row on the CPU shape
        (DSMLALayout(512, 64, 256), 656, 264, 128, 128),  # two indexer blocks
    ],
)
def test_the_byte_layout(layout, row_bytes, index_bytes, tile, index_tile):
    assert (layout.row_bytes, layout.index_bytes, layout.tile, layout.index_tile) == (
        row_bytes,
        index_bytes,
        tile,
        index_tile,
    )
    assert layout.problems() == []
    assert layout_of(layout.row_bytes, layout.latent + layout.rope, layout.index_dim) == layout


@pytest.mark.parametrize(
    "layout, problem",
    [
        (DSMLALayout(30, 16, 16), "kv_lora_rank 30 is not a multiple of 16"),
        (DSMLALayout(32, 16, 18), "index_head_dim 18 is not a multiple of 4"),
        (DSMLALayout(512, 64, 200), "index_head_dim 200 is not a multiple of 128"),
        (DSMLALayout(32, 0, 48), "the indexer row (52 bytes) is wider than the latent row (48)"),
    ],
)
def test_dims_without_a_layout_are_named(layout, problem):
    assert any(p.startswith(problem) for p in layout.problems()), layout.problems()


def _rows(n: int, width: int, tile: int, seed: int) -> torch.Tensor:
    """[n, width] bf16 values whose tiles differ in magnitude by 10^3 (a scale read off another
    tile is far off), one tile all zeros."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, width, generator=gen)
    mags = torch.tensor([1e3, 1.0, 1e-3, 3.0])
    x = (x.view(n, -1, tile) * mags.repeat(width // tile // 4 + 1)[: width // tile, None]).view(n, width)
    x[0, :tile] = 0.0
    return x.bfloat16().float()


@pytest.mark.parametrize("layout", [CPU, DEEPSEEK], ids=["cpu", "deepseek"])
def test_latent_round_trip_is_the_reference_rounding_per_tile(layout):
    lat = _rows(5, layout.latent, layout.tile, 1)
    pe = torch.randn(5, layout.rope, generator=torch.Generator().manual_seed(2))
    packed = ds_mla.pack_latent(lat, pe, layout)
    assert packed.dtype == torch.uint8 and packed.shape == (5, layout.row_bytes)
    back = ds_mla.unpack_latent(packed, layout)
    # bit for bit what the reference's own arithmetic says the cache returns
    want = round_rows(TINY if layout == CPU else _deepseek_shape(), 0, torch.cat([lat, pe], dim=-1))
    assert torch.equal(back, want)
    # within fp8 e4m3's rounding of each tile over its own scale (half a step: 2^-4 of the value,
    # or of the smallest normal times the scale)
    scale = lat.view(5, -1, layout.tile).abs().amax(-1, keepdim=True).clamp_min(ds_mla.SCALE_FLOOR) / 448.0
    bound = torch.maximum(lat.view(5, -1, layout.tile).abs() / 16, scale * 2.0**-10).view(5, -1)
    assert ((back[:, : layout.latent] - lat).abs() <= bound).all()
    assert torch.equal(back[0, : layout.tile], torch.zeros(layout.tile))  # a zero tile: 0, not 0/0
    # the rope part is bf16, unquantised, at the row's end
    assert torch.equal(packed[:, layout.latent + 16 :].view(torch.bfloat16), pe.bfloat16())
    assert torch.equal(back[:, layout.latent :], pe.bfloat16().float())


def _deepseek_shape():
    import dataclasses

    return dataclasses.replace(TINY, dims=(("index_head_dim", 128), ("kv_lora_rank", 512), ("qk_rope_head_dim", 64)))


def test_index_round_trip_and_its_scales():
    k = _rows(4, 256, 128, 3)
    lay = DSMLALayout(512, 64, 256)
    packed = ds_mla.pack_index(k, lay)
    assert packed.shape == (4, lay.row_bytes) and not packed[:, lay.index_bytes :].any()
    scales = packed[:, 256:264].contiguous().view(torch.float32)  # one per 128-value block
    want = k.view(4, 2, 128).abs().amax(-1).clamp_min(ds_mla.SCALE_FLOOR) / 448.0
    assert torch.equal(scales, want)
    assert torch.equal(ds_mla.unpack_index(packed, lay), round_rows(_deepseek_shape(), 1, k))


def test_minus_one_slots_write_nothing():
    plane = torch.randint(0, 256, (3, 4, CPU.row_bytes), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    before = plane.clone()
    lat, pe = torch.randn(3, CPU.latent), torch.randn(3, CPU.rope)
    ds_mla.write_latent(plane, lat, pe, torch.tensor([5, -1, 9]), CPU)
    changed = (plane != before).any(-1).view(-1).nonzero().view(-1).tolist()
    assert changed == [5, 9]  # slot 0 (where -1 is redirected) as it was
    rows = plane.view(12, -1)
    assert torch.equal(rows[9], ds_mla.pack_latent(lat[2:], pe[2:], CPU)[0])


def test_garbage_decodes_finite():
    """The session's garbage (seeded randn in each typed part) is a cache no read can turn NaN."""
    fam = family("mla_sparse")
    cache = torch.zeros(2, 6, 16, CPU.row_bytes, dtype=torch.uint8)
    gen = torch.Generator().manual_seed(7)
    for part in garbage_views(cache, TINY):
        part.copy_(torch.randn(part.shape, generator=gen, dtype=torch.bfloat16).to(part.dtype))
    assert cache[0].any() and cache[1].any()
    assert torch.isfinite(ds_mla.unpack_latent(cache[0], CPU)).all()
    assert torch.isfinite(ds_mla.unpack_index(cache[1], CPU)).all()
    assert fam.garbage_views(cache, TINY)[1].dtype == torch.float32


def test_other_backends_skip_fp8_ds_mla_with_a_reason(sparse_sessions):  # noqa: F811 - the imported fixture, by name
    from tests.families.conftest import make_case as mla_case

    r = run_case(mla_case("torch", "FULL", "fp8_ds_mla"), sessions=sparse_sessions)
    assert r.status == Status.SKIP and "kv_cache_dtype fp8_ds_mla not supported by torch" in r.reason, r.reason


def _perturbed(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(eager's rows, the graph's) [2 planes, 4 slots, row_bytes] of one write, the graph's latent
    inputs perturbed by `kind`."""
    gen = torch.Generator().manual_seed(5)
    lat = torch.randn(4, CPU.latent, generator=gen).bfloat16()
    pe, key = torch.randn(4, CPU.rope, generator=gen), torch.randn(4, CPU.index_dim, generator=gen)

    def rows(lat):
        return torch.stack([ds_mla.pack_latent(lat.float(), pe, CPU), ds_mla.pack_index(key, CPU)])

    eager = rows(lat)
    other = lat.clone()
    amax_at = lat[0, : CPU.tile].float().abs().argmax()
    if kind == "amax an ulp off":  # a padded GEMM's rounding: the tile's scale moves with it
        v = lat[0, amax_at].float()
        other[0, amax_at] = (v - torch.sign(v) * 2.0 ** (torch.floor(torch.log2(v.abs())) - 7)).bfloat16()
    graph = rows(other)
    if kind == "scale doubled":  # a tile's scale written twice too large
        s = graph[0, 0, CPU.latent : CPU.latent + 4].view(torch.float32)
        graph[0, 0, CPU.latent : CPU.latent + 4] = (s * 2).view(torch.uint8)
    return eager, graph


@pytest.mark.parametrize("kind, ok", [("same", True), ("amax an ulp off", True), ("scale doubled", False)])
def test_kv_integrity_compares_real_slots_as_decoded_values(kind, ok):
    from backend.case import Tolerance
    from backend.harness.checks import kv_integrity

    eager, graph = _perturbed(kind)
    assert torch.equal(eager, graph) == (kind == "same")
    real, ones = torch.arange(4), (torch.ones(1), torch.ones(1))
    decode = functools.partial(family("mla_sparse").decode_rows, TINY)  # as sides.py binds it
    tol = Tolerance(2e-2, 2e-2)
    k = kv_integrity(graph.clone(), graph.clone(), eager, real, ones, tol, decode=decode)
    assert (k.ok, k.real_bitwise) == (ok, kind == "same"), k
    if kind == "amax an ulp off":  # compared as bytes, the tile's moved scale bytes would be red
        assert not kv_integrity(graph.clone(), graph.clone(), eager, real, ones, tol).ok


def test_the_memory_estimate_counts_the_byte_rows():
    """The caches and their one snapshot copy, at row_bytes a slot and plane."""
    from backend.attention.registry import get_backend
    from backend.harness.model import TPLayout
    from backend.harness.session import attention_config, estimate_bytes

    backend = get_backend("torch", "mla_sparse")
    config = attention_config(TINY, TPLayout(1, 0, 4, 1, 48), "fp8_ds_mla", (1, 2), "cpu")
    caches = family("mla_sparse").allocate_caches(backend, config, TINY)
    assert [(c.dtype, c.shape[-1]) for c in caches] == [(torch.uint8, CPU.row_bytes)] * TINY.num_layers
    assert estimate_bytes(backend, config, TINY.num_layers) == 2 * sum(c.numel() for c in caches)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/HIP device")
def test_device_rows_are_the_references_and_the_cpus():
    """On the device, at the CPU shape's and DeepSeek's dims: the read of what the writer packed
    is the reference's rounding bit for bit (the top-k's exactness rests on it there too), and on
    e4m3fn devices the bytes are the CPU's (amax, the division and the fp8 cast agree)."""
    from backend.attention.kv_cache import fp8_dtype

    dev = torch.device("cuda")
    for lay, shape in ((CPU, TINY), (DEEPSEEK, _deepseek_shape())):
        lat = _rows(64, lay.latent, lay.tile, 9)
        pe = torch.randn(64, lay.rope, generator=torch.Generator().manual_seed(10))
        key = _rows(64, lay.index_dim, lay.index_tile, 11)
        rows = ds_mla.pack_latent(lat.to(dev), pe.to(dev), lay)
        index = ds_mla.pack_index(key.to(dev), lay)
        assert torch.equal(ds_mla.unpack_latent(rows, lay), round_rows(shape, 0, torch.cat([lat, pe], dim=-1).to(dev)))
        assert torch.equal(ds_mla.unpack_index(index, lay), round_rows(shape, 1, key.to(dev)))
        if fp8_dtype(dev) == torch.float8_e4m3fn:
            assert torch.equal(rows.cpu(), ds_mla.pack_latent(lat, pe, lay))
            assert torch.equal(index.cpu(), ds_mla.pack_index(key, lay))
