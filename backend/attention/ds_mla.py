"""The `fp8_ds_mla` KV-cache format of the mla_sparse family (DeepSeek V3.2; vLLM's FLASHMLA_SPARSE
"fp8" cache): the providers' write and read of its byte rows. The fp32 reference's rounding of the
same rows is its own arithmetic (backend/families/mla_sparse_cache.py), not this module.

A layer's cache is uint8 [2, num_blocks, block_size, row_bytes], one byte row per slot and plane:

    plane 0, the latent row:  [L fp8 e4m3 | T float32 scales | R bfloat16]      row_bytes = L + 4T + 2R
        kv_c in T = 4 tiles of L / 4 values, each tile divided by its own scale amax / fp8_max
        (amax over the tile at write time, floored at SCALE_FLOOR so a zero tile divides by a
        finite scale); k_pe in bf16, unquantised. DeepSeek's L 512, R 64: 4 tiles of 128, 656 bytes.
    plane 1, the indexer key: [Di fp8 e4m3 | Di / Ti float32 scales | zeros]    Ti = min(Di, 128)
        the key in blocks of Ti values, a scale per block the same way (Di 128: one per token, vLLM's
        indexer cache; its kernels keep a block's values, then its scales, orch a row per slot).

Scales are little-endian float32 in the row's bytes, read through a dtype view (the offsets are
multiples of 4). The layer's k_scale / v_scale are not used: every scale is in the row.

Writes are graph-safe: the rows are packed on the device (no host read) and scattered through
write_slots (a -1 slot writes nothing: no boolean-mask indexing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.attention.kv_cache import fp8_dtype, fp8_to_float, quantize_fp8, write_slots

NAME = "fp8_ds_mla"
LATENT_TILES = 4  # DeepSeek's 512 / 128; the CPU shape's 32 gives tiles of 8, still several a row
INDEX_TILE = 128  # the indexer's quantisation block (vLLM's)
# amax below it divides by SCALE_FLOOR / fp8_max: vLLM's indexer writer's floor, orch's for both planes
SCALE_FLOOR = 1e-4
SCALE_BYTES = 4
ROPE_DTYPE = torch.bfloat16  # vLLM's row: the rope part in bf16 whatever the model dtype
_NO_SCALE = torch.ones(1)  # write_slots' scale argument: unused for a uint8 plane


@dataclass(frozen=True)
class DSMLALayout:
    latent: int  # L (kv_lora_rank)
    rope: int  # R (qk_rope_head_dim)
    index_dim: int  # Di

    @classmethod
    def of(cls, config_or_shape) -> DSMLALayout:
        d = dict(config_or_shape.dims)
        return cls(d["kv_lora_rank"], d["qk_rope_head_dim"], d["index_head_dim"])

    @property
    def tile(self) -> int:
        return self.latent // LATENT_TILES

    @property
    def index_tile(self) -> int:
        return min(self.index_dim, INDEX_TILE)

    @property
    def index_tiles(self) -> int:
        return self.index_dim // self.index_tile

    @property
    def row_bytes(self) -> int:
        return self.latent + SCALE_BYTES * LATENT_TILES + 2 * self.rope

    @property
    def index_bytes(self) -> int:
        return self.index_dim + SCALE_BYTES * self.index_tiles

    def problems(self) -> list[str]:
        """Why these dims have no fp8_ds_mla layout ([] when they have one)."""
        out = []
        if self.latent % (LATENT_TILES * SCALE_BYTES):
            out.append(
                f"kv_lora_rank {self.latent} is not a multiple of {LATENT_TILES * SCALE_BYTES} (4 tiles, aligned scales)"
            )
        if self.index_dim % self.index_tile:
            out.append(f"index_head_dim {self.index_dim} is not a multiple of {INDEX_TILE} (the indexer's block)")
        if self.index_dim % SCALE_BYTES:
            out.append(f"index_head_dim {self.index_dim} is not a multiple of 4 (float32 scales follow the values)")
        if self.index_bytes > self.row_bytes:
            out.append(f"the indexer row ({self.index_bytes} bytes) is wider than the latent row ({self.row_bytes})")
        return out


def _tiles(x: torch.Tensor, tile: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """x [n, k * tile] -> (fp8 [n, k * tile], float32 scales [n, k]), each tile over its own scale."""
    fp8 = fp8_dtype(device)
    t = x.float().reshape(x.shape[0], -1, tile)
    amax = t.abs().amax(dim=-1).clamp_min(SCALE_FLOOR)  # [n, k]
    # Divided by a tensor, not the Python number: CUDA divides by a scalar as a multiply by its
    # reciprocal (1/448 is inexact), which moves a scale by an ulp against the CPU's bytes.
    scale = amax / torch.full_like(amax, torch.finfo(fp8).max)
    return quantize_fp8(t, scale[..., None], fp8).reshape(x.shape[0], -1), scale


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def pack_latent(kv_c: torch.Tensor, k_pe: torch.Tensor, layout: DSMLALayout) -> torch.Tensor:
    """kv_c [n, L], k_pe [n, R] -> uint8 rows [n, row_bytes]."""
    q, scale = _tiles(kv_c, layout.tile, kv_c.device)
    return torch.cat([_bytes(q), _bytes(scale), _bytes(k_pe.to(ROPE_DTYPE))], dim=-1)


def pack_index(k: torch.Tensor, layout: DSMLALayout) -> torch.Tensor:
    """k [n, Di] -> uint8 rows [n, row_bytes] (the key's bytes, then zeros)."""
    q, scale = _tiles(k[:, : layout.index_dim], layout.index_tile, k.device)
    row = torch.cat([_bytes(q), _bytes(scale)], dim=-1)
    return torch.nn.functional.pad(row, (0, layout.row_bytes - layout.index_bytes))


def write_latent(
    plane: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor, slot_mapping: torch.Tensor, layout: DSMLALayout
) -> None:
    """[kv_c | k_pe] of the first len(slot_mapping) tokens into plane [num_blocks, block_size,
    row_bytes] at slot_mapping (-1: nothing)."""
    n = slot_mapping.shape[0]
    write_slots(plane, pack_latent(kv_c[:n], k_pe[:n], layout), slot_mapping, _NO_SCALE)


def write_index(plane: torch.Tensor, k: torch.Tensor, slot_mapping: torch.Tensor, layout: DSMLALayout) -> None:
    n = slot_mapping.shape[0]
    write_slots(plane, pack_index(k[:n], layout), slot_mapping, _NO_SCALE)


def _scales(rows: torch.Tensor, start: int, count: int) -> torch.Tensor:
    return rows[..., start : start + SCALE_BYTES * count].contiguous().view(torch.float32)


def unpack_latent(rows: torch.Tensor, layout: DSMLALayout) -> torch.Tensor:
    """uint8 rows [..., row_bytes] -> fp32 [..., L + R]: each tile's fp8 values times its scale,
    the rope part as stored."""
    lat, t = layout.latent, LATENT_TILES
    fp8 = fp8_dtype(rows.device)
    q = fp8_to_float(rows[..., :lat].contiguous().view(fp8)).unflatten(-1, (t, layout.tile))
    scale = _scales(rows, lat, t)
    pe = rows[..., lat + SCALE_BYTES * t : layout.row_bytes].contiguous().view(ROPE_DTYPE).float()
    return torch.cat([(q * scale[..., None]).flatten(-2), pe], dim=-1)


def unpack_index(rows: torch.Tensor, layout: DSMLALayout) -> torch.Tensor:
    """uint8 rows [..., row_bytes] -> fp32 keys [..., Di]."""
    di, k = layout.index_dim, layout.index_tiles
    fp8 = fp8_dtype(rows.device)
    q = fp8_to_float(rows[..., :di].contiguous().view(fp8)).unflatten(-1, (k, layout.index_tile))
    return (q * _scales(rows, di, k)[..., None]).flatten(-2)
