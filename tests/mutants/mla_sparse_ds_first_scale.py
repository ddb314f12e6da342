"""Bug class (mla_sparse, kv fp8_ds_mla): a writer that computes the tile scales once per batch
from its first token (a scale reduction launched over one row, or indexed by the block instead of
the token) and quantises every token's latent with them: tokens whose tiles are larger saturate,
smaller ones lose their precision.

The rows decode consistently (each carries the scales it was divided by), and eager and graphs
write the same bytes (kv_integrity stays green): the values the sparse MLA attends to are off
the fp32 reference in every fp8_ds_mla cell with more than one new token, and nowhere else.
"""

from __future__ import annotations

import torch

from backend.attention import ds_mla
from backend.attention.ds_mla import DSMLALayout
from backend.attention.kv_cache import fp8_dtype, quantize_fp8, write_slots
from backend.providers.torch_mla_sparse import TorchSparseMLABackend, TorchSparseMLAImpl, is_ds_mla


class Impl(TorchSparseMLAImpl):
    def write(self, kv_cache, kv_c, k_pe, k_index, md, k_scale, v_scale):
        if not is_ds_mla(kv_cache):
            return super().write(kv_cache, kv_c, k_pe, k_index, md, k_scale, v_scale)
        lay = DSMLALayout.of(self.config)
        n = md.slot_mapping.shape[0]
        fp8 = fp8_dtype(kv_c.device)
        t = kv_c[:n].float().reshape(n, -1, lay.tile)
        first = t[:1].abs().amax(dim=-1).clamp_min(ds_mla.SCALE_FLOOR) / torch.finfo(fp8).max  # [1, tiles]
        scale = first.expand(n, -1).contiguous()
        q = quantize_fp8(t, scale[..., None], fp8).reshape(n, -1)
        rows = torch.cat(
            [q.view(torch.uint8), scale.view(torch.uint8), k_pe[:n].to(ds_mla.ROPE_DTYPE).view(torch.uint8)], -1
        )
        write_slots(kv_cache[0], rows, md.slot_mapping, k_scale)
        ds_mla.write_index(kv_cache[1], k_index, md.slot_mapping, lay)


class Backend(TorchSparseMLABackend):
    name = "mutant-mla-sparse-ds-first-scale"
    impl_cls = Impl
