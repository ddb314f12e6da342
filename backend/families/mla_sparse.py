"""mla_sparse: DeepSeek V3.2's sparse attention (DSA) over MLA: an indexer scores every cached key,
each query token attends only the index_topk keys it picked (docs/FAMILIES.md "mla_sparse").

Per layer on one tp rank: mla.py's projections (q, kv_c, k_pe), and the indexer's key
    k_index = h @ W_ik.T                    # [T, Di], replicated on every rank (as the indexer is)
written beside the latent row, into the cache's second plane, at the same slot_mapping (kv auto and
fp8: in the first Di values of a latent-wide row; fp8_ds_mla: byte rows with their own scales,
mla_sparse_cache.py). A key j's score is sum_h w_h relu(q_h . k_j) with the layer's indexer query
q [Hi, Di] and head weights w [Hi]; token i of a request (position p = context + i) picks, among
positions <= p, the step's own tokens first (latest first), then cached keys by score; the lower
position wins a tie; a context shorter than index_topk is attended whole. Then absorbed MLA over
the picked rows.

Two simplifications of DeepSeek's indexer keep the selection exact, because a top-k is
discontinuous: a last-bit difference between the provider's scores and the fp32 reference's would
swap a near-tie token and fail the reference check with no bug. So (1) the indexer query is a
learned per-layer vector, not a projection of the token (the layer's input differs from the
reference's by the model dtype's rounding after the first layer), (2) the step's own tokens rank
by position, not by their keys (computed from that same input), and scores are float64 over keys
read back from the cache, which both sides hold bit for bit. What the family is about, lengths and
indices under padding and graphs, is untouched by either.

The reference (fp32): the dense scores and the top-k by the same rule, then dense absorbed MLA
masked to the picked set. The family's checks (mla_sparse_checks.py) hold the metadata's and the
top-k buffer's contract after every run, and the graph run's top-k to eager's.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from backend.attention.ds_mla import NAME as DS_MLA
from backend.attention.ds_mla import DSMLALayout
from backend.attention.kv_cache import write_slots
from backend.attention.mla import MLADims
from backend.attention.mla_sparse import IndexerDims
from backend.families import mla_sparse_cache as ds_cache
from backend.families.contract import split_by
from backend.families.mla import MLA, split_kv_b
from backend.families.mla_sparse_checks import CHECKS
from backend.families.specs import MLA_SPARSE as SPEC
from backend.harness.model import rmsnorm
from backend.result import CHECK_STATE_INTEGRITY


class MLASparse(MLA):
    spec = SPEC
    num_planes: ClassVar[int] = 2
    # The index/length contract is reported under state_integrity: the one check name a family's
    # StepState reports into (docs/FAMILIES.md says what it holds for this family).
    extra_checks: ClassVar[tuple[str, ...]] = (CHECK_STATE_INTEGRITY,)

    def planes(self, cache):
        return [cache[0], cache[1]]

    def plane_scales(self, k_scale, v_scale):
        return (k_scale, v_scale)  # the latent row's, the indexer cache's own

    def context_rows(self, shape):
        return ((MLADims.of(shape).row,), (IndexerDims.of(shape).index_head_dim,))

    def write(self, cache, values, slots, k_scale, v_scale):
        if ds_cache.is_ds_mla(cache):
            ds_cache.write(cache, values, slots)
            return
        write_slots(cache[0], values[0], slots, k_scale)
        write_slots(cache[1], index_plane_row(values[1], cache.shape[-1]), slots, v_scale)

    # ---- the fp8_ds_mla cache (mla_sparse_cache.py); kv auto and fp8 are the backend's planes ----
    def allocate_caches(self, backend_cls, config, shape):
        return ds_cache.allocate(config, shape) if config.kv_cache_dtype == DS_MLA else None

    def garbage_views(self, cache, shape):
        return ds_cache.garbage_views(cache, shape) if ds_cache.is_ds_mla(cache) else self.planes(cache)

    def round_stored(self, shape, plane, rows, cache_dtype):
        return ds_cache.round_rows(shape, plane, rows) if ds_cache.is_ds_mla(cache_dtype) else None

    def decode_rows(self, shape, plane, rows):
        return ds_cache.decode(shape, plane, rows) if ds_cache.is_ds_mla(rows) else None

    def cache_slot_bytes(self, config):
        return DSMLALayout.of(config).row_bytes if config.kv_cache_dtype == DS_MLA else None

    def draw(self, w, norm, shape, layer):
        ix = IndexerDims.of(shape)
        # w() is rounded to the model dtype already: the rank's copies (cast to it) are these values
        return {
            **super().draw(w, norm, shape, layer),
            "w_ik": w(ix.index_head_dim, shape.hidden_size),
            "index_q": w(ix.index_n_heads, ix.index_head_dim),
            "index_w": w(ix.index_n_heads, 1).view(-1),
        }

    def shard(self, weights, layout, shape):
        return {**super().shard(weights, layout, shape), **{k: weights[k] for k in ("w_ik", "index_q", "index_w")}}

    def project(self, lw, h, layout, shape):
        q, kv_c, k_pe = super().project(lw, h, layout, shape)
        return q, kv_c, k_pe, (h @ lw["w_ik"].t()).contiguous()

    def attend(self, impl, lw, inputs, cache, metadata, k_scale, v_scale, out):
        q, kv_c, k_pe, k_index = inputs
        return impl.forward(
            q,
            kv_c,
            k_pe,
            k_index,
            cache,
            metadata,
            k_scale,
            v_scale,
            out,
            lw["w_uk_t"],
            lw["w_uv"],
            lw["index_q"],
            lw["index_w"],
        )

    def reference(self, weights, h, context, query_lens, round_new, round_query, shape, rnd):
        d, ix, t, nh = MLADims.of(shape), IndexerDims.of(shape), h.shape[0], shape.num_heads
        q = rnd(h @ weights["wq"].t()).view(t, nh, -1)
        if round_query is not None:
            q = round_query(q)
        ckv = rnd(h @ weights["w_kv_a"].t())
        kv_c = rnd(rmsnorm(ckv[:, : d.kv_lora_rank], weights["kv_norm"]))
        new_lat = round_new(0, torch.cat([kv_c, ckv[:, d.kv_lora_rank :]], dim=-1))
        new_idx = round_new(1, rnd(h @ weights["w_ik"].t()))
        w_uk, w_uv = split_kv_b(weights["w_kv_b"], nh, d)
        scale = self.scale(shape)
        outs = []
        for qr, ctx_lat, ctx_idx, lat, idx, ql in zip(
            split_by(q, query_lens),
            context[0],
            context[1],
            split_by(new_lat, query_lens),
            split_by(new_idx, query_lens),
            query_lens,
        ):
            rows = torch.cat([ctx_lat, lat])  # [s, L + R]
            keys = torch.cat([ctx_idx, idx])
            mask = picked_mask(keys, ctx_lat.shape[0], ql, weights["index_q"], weights["index_w"], ix.index_topk)
            outs.append(sparse_absorbed(qr, rows, mask, w_uk, w_uv, d, scale))
        return torch.cat(outs) if outs else q.new_zeros(0, nh, d.v_head_dim)

    def step_state(self):
        return CHECKS


def index_plane_row(k: torch.Tensor, width: int) -> torch.Tensor:
    """k [T, Di] -> [T, width]: a kv auto / fp8 indexer plane holds the key in the first Di values
    of a row as wide as the latent's, zeros after."""
    return F.pad(k, (0, width - k.shape[-1]))


def picked_mask(
    keys: torch.Tensor, context: int, query_len: int, index_q: torch.Tensor, index_w: torch.Tensor, topk: int
) -> torch.Tensor:
    """One request's selection, densely: keys [s, Di] (s = context + query_len) -> bool [query_len, s],
    True where query row i attends position j. Every score is computed, every candidate ranked
    against every other (no sort: the provider sorts): j' outranks j when j' is one of the step's
    tokens and j is cached, or both are the step's and j' is later, or both are cached and j' scores
    higher, or the same and j' is earlier."""
    s = keys.shape[0]
    score = torch.relu(keys.double() @ index_q.double().t()) @ index_w.double()  # [s], float64
    pos = torch.arange(s, device=keys.device)
    new = pos >= context
    a, b = pos[:, None], pos[None, :]  # a outranks b?
    cached_pair = ~new[:, None] & ~new[None, :]
    beats = (
        (new[:, None] & ~new[None, :])
        | (new[:, None] & new[None, :] & (a > b))
        | (cached_pair & ((score[:, None] > score[None, :]) | ((score[:, None] == score[None, :]) & (a < b))))
    )
    last = context + torch.arange(query_len, device=keys.device)  # query row i's last candidate
    # rank of j among row i's candidates (positions <= last[i]): how many of them outrank it
    rank = torch.cumsum(beats.to(torch.int64), dim=0)[last]  # [query_len, s]
    return (b <= last[:, None]) & (rank < topk)


def sparse_absorbed(
    q: torch.Tensor,
    rows: torch.Tensor,
    mask: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    d: MLADims,
    scale: float,
) -> torch.Tensor:
    """One request, fp32: dense absorbed MLA (mla.py's reference_absorbed) with query row i masked
    to the positions mask[i] picked -> [q, H, V]."""
    q32, r32 = q.float(), rows.float()
    ql = torch.einsum("qhp,lhp->qhl", q32[..., : d.qk_nope_head_dim], w_uk.float())
    qq = torch.cat([ql, q32[..., d.qk_nope_head_dim :]], dim=-1).transpose(0, 1)  # [H, q, L + R]
    s = torch.einsum("hqd,sd->hqs", qq, r32) * scale
    s = s.masked_fill(~mask[None], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that picked nothing attends nothing
    o_lat = torch.einsum("hqs,sl->hql", p, r32[:, : d.kv_lora_rank])
    return torch.einsum("hql,lhv->qhv", o_lat, w_uv.float())
