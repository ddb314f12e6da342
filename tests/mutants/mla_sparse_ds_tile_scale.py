"""Bug class (mla_sparse, kv fp8_ds_mla): a per-tile scale read at a fixed offset, so the first
tile's scale dequantises every tile of the latent row (a scale pointer that never advances with
the tile, as a kernel written for a per-token scale reads it).

The rows are written correctly (kv_integrity stays green); what the sparse MLA attends to is each
tile's fp8 values times the wrong scale, so the outputs move away from the fp32 reference in every
fp8_ds_mla cell, and nowhere else: kv auto and fp8 caches have no tiles.
"""

from __future__ import annotations

from backend.attention.ds_mla import LATENT_TILES, SCALE_BYTES, DSMLALayout, unpack_latent
from backend.providers.torch_mla_sparse import TorchSparseMLABackend, TorchSparseMLAImpl, is_ds_mla


class Impl(TorchSparseMLAImpl):
    def read_latent(self, kv_cache, slots, k_scale):
        if not is_ds_mla(kv_cache):
            return super().read_latent(kv_cache, slots, k_scale)
        lay = DSMLALayout.of(self.config)
        plane = kv_cache[0]
        rows = plane.reshape(-1, plane.shape[-1]).index_select(0, slots).clone()
        first = rows[:, lay.latent : lay.latent + SCALE_BYTES]
        rows[:, lay.latent : lay.latent + SCALE_BYTES * LATENT_TILES] = first.repeat(1, LATENT_TILES)
        return unpack_latent(rows, lay)


class Backend(TorchSparseMLABackend):
    name = "mutant-mla-sparse-ds-tile-scale"
    impl_cls = Impl
