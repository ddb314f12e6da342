"""mla_sparse's fp8_ds_mla cache on the family's side (the format: backend/attention/ds_mla.py):
its allocation, the typed parts the session fills with garbage, the context write, the rows'
values for kv_integrity, and the fp32 reference's rounding of rows the way the format stores them.

The reference's rounding is its own arithmetic: per tile, the scale amax / fp8_max from the rows
it rounds (floored as the format says) and fp8_round (backend/harness/reference.py) of the rows
over it; the rope part rounded to bf16. A correct writer stores, and a correct reader returns, the
same fp32 values bit for bit (amax is exact, the division and the product are single fp32
operations on both sides), so the indexer's keys are bit-equal on both sides and the top-k stays
exact (docs/FAMILIES.md "Why the selection is exact").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backend.attention import ds_mla
from backend.attention.ds_mla import LATENT_TILES, SCALE_BYTES, SCALE_FLOOR, DSMLALayout
from backend.attention.kv_cache import fp8_dtype
from backend.harness.reference import fp8_round

BYTES = torch.uint8  # the dtype of an fp8_ds_mla cache (and only of one, in this family)


def is_ds_mla(cache_or_dtype) -> bool:
    dtype = cache_or_dtype if isinstance(cache_or_dtype, torch.dtype) else cache_or_dtype.dtype
    return dtype == BYTES


def allocate(config, shape) -> list[torch.Tensor]:
    """Every layer's cache: uint8 [2, num_blocks, block_size, row_bytes], zeroed."""
    row = DSMLALayout.of(shape).row_bytes
    dims = (2, config.num_blocks, shape.block_size, row)
    return [torch.zeros(dims, dtype=BYTES, device=config.device) for _ in range(shape.num_layers)]


def garbage_views(cache: torch.Tensor, shape) -> list[torch.Tensor]:
    """Each plane's parts in their own dtypes: fp8 values, float32 scales, bf16 rope (the indexer
    plane's zero tail stays zero, as every write leaves it)."""
    lay, fp8 = DSMLALayout.of(shape), fp8_dtype(cache.device)
    lat, di, s = lay.latent, lay.index_dim, lat_scale_end(lay)
    latent, index = cache[0], cache[1]
    return [
        latent[..., :lat].view(fp8),
        latent[..., lat:s].view(torch.float32),
        latent[..., s : lay.row_bytes].view(ds_mla.ROPE_DTYPE),
        index[..., :di].view(fp8),
        index[..., di : lay.index_bytes].view(torch.float32),
    ]


def lat_scale_end(lay: DSMLALayout) -> int:
    return lay.latent + SCALE_BYTES * LATENT_TILES


def layout_of(row_bytes: int, latent_row: int, index_dim: int) -> DSMLALayout:
    """The layout from a plane's row bytes, the latent row's width L + R and the key's Di (the
    family's write gets the cache and the rows, not the shape): row_bytes = L + 4T + 2R."""
    rope = row_bytes - SCALE_BYTES * LATENT_TILES - latent_row
    lay = DSMLALayout(latent_row - rope, rope, index_dim)
    if rope < 0 or lay.row_bytes != row_bytes:
        raise ValueError(f"a {row_bytes}-byte row holds no fp8_ds_mla latent row of {latent_row} values")
    return lay


def write(cache: torch.Tensor, values: Sequence[torch.Tensor], slots: torch.Tensor) -> None:
    """The context rows (plane 0 [n, L + R], plane 1 [n, Di]) through the providers' writer."""
    lay = layout_of(cache.shape[-1], values[0].shape[-1], values[1].shape[-1])
    ds_mla.write_latent(cache[0], values[0][:, : lay.latent], values[0][:, lay.latent :], slots, lay)
    ds_mla.write_index(cache[1], values[1], slots, lay)


def _round_tiles(x: torch.Tensor, tile: int) -> torch.Tensor:
    fp8 = fp8_dtype(x.device)
    t = x.float().unflatten(-1, (-1, tile))
    amax = t.abs().amax(dim=-1, keepdim=True).clamp_min(SCALE_FLOOR)
    s = amax / torch.full_like(amax, torch.finfo(fp8).max)  # a true division on every device
    return (fp8_round(t / s, 1.0, fp8) * s).flatten(-2)


def round_rows(shape, plane: int, rows: torch.Tensor) -> torch.Tensor:
    """rows fp32 (plane 0 [n, L + R], plane 1 [n, Di]) as an fp8_ds_mla cache returns them."""
    lay = DSMLALayout.of(shape)
    if plane == 1:
        return _round_tiles(rows, lay.index_tile)
    lat = lay.latent
    return torch.cat([_round_tiles(rows[..., :lat], lay.tile), rows[..., lat:].to(ds_mla.ROPE_DTYPE).float()], dim=-1)


def decode(shape, plane: int, rows: torch.Tensor) -> torch.Tensor:
    """A plane's byte rows [..., row_bytes] as the values the providers' reader returns."""
    lay = DSMLALayout.of(shape)
    return ds_mla.unpack_index(rows, lay) if plane == 1 else ds_mla.unpack_latent(rows, lay)
