"""`torch` provider of the mla_sparse family: the indexer, its top-k and the sparse MLA in plain
torch. CPU and GPU, bf16/fp16/fp32, kv auto/fp8 (per-tensor: k_scale for the latent plane,
v_scale for the indexer's) and fp8_ds_mla (byte rows with their own per-tile scales, written by
backend/attention/ds_mla.py and dequantised from the rows each read gathers).

Graph-safe: every shape comes from tensor shapes and the metadata's host ints (the gather length
from the host max_seq_len, frozen by a graph at max_model_len), the top-k is a fixed-width sort
into the persistent topk_indices buffer, the sparse gather reads index_topk rows a token (masked
where an index is -1), and nothing reads a tensor value on the host. Declares UNIFORM_BATCH, as
vLLM's sparse MLA backends do.

The indexer (the family's test model, backend/families/mla_sparse.py): a cached key j's score is
sum_h w_h relu(q_h . k_j) in float64, q and w the layer's indexer query and head weights; the step's
own tokens rank above every cached key, the latest first; ties go to the lower position (a stable
sort over keys in position order).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from backend.attention import ds_mla
from backend.attention.ds_mla import DSMLALayout
from backend.attention.kv_cache import dequantize, write_slots
from backend.attention.mla_sparse import SparseMLABackend, SparseMLAImpl
from backend.providers import mla_ops
from backend.providers.torch_backend import gather_length

# The score of this step's own tokens: above any cached key's (|score| <= Hi * |w| * |q| |k|, far
# below this at the test model's scales); + position keeps the latest first, exactly, in float64.
NEW_TOKEN_SCORE = 1e12


def index_scores(keys: torch.Tensor, index_q: torch.Tensor, index_w: torch.Tensor) -> torch.Tensor:
    """keys [..., S, Di] (fp32, as the cache returns them) -> float64 [..., S]: sum_h w_h relu(q_h . k).
    float64: a product of two model-dtype values is exact there and the sums nearly so, so the
    provider and the fp32 reference rank the same keys whatever order they add them in."""
    dots = torch.einsum("...sd,hd->...sh", keys.double(), index_q.double())
    return torch.relu(dots) @ index_w.double()


def select_topk(scores: torch.Tensor, context_lens: torch.Tensor, token_lens: torch.Tensor, k: int) -> torch.Tensor:
    """scores float64 [T, S] over positions 0..S-1 of each token's request; context_lens [T] (keys
    cached before the step), token_lens [T] (keys a token may select) -> int32 [T, k]: positions by
    rank, -1 past the candidates."""
    pos = torch.arange(scores.shape[1], device=scores.device)
    s = torch.where(pos[None, :] >= context_lens[:, None], NEW_TOKEN_SCORE + pos[None, :].double(), scores)
    s = s.masked_fill(pos[None, :] >= token_lens[:, None], float("-inf"))
    if s.shape[1] < k:
        s = torch.nn.functional.pad(s, (0, k - s.shape[1]), value=float("-inf"))
    ranked, order = torch.sort(s, dim=1, descending=True, stable=True)
    return torch.where(ranked[:, :k] > float("-inf"), order[:, :k], -1).to(torch.int32)


class TorchSparseMLAImpl(SparseMLAImpl):
    def forward(
        self, q, kv_c, k_pe, k_index, kv_cache, metadata, k_scale, v_scale, output, w_uk_t, w_uv, index_q, index_w
    ):
        self.write(kv_cache, kv_c, k_pe, k_index, metadata, k_scale, v_scale)
        n = q.shape[0]
        topk = self.topk_for(metadata)[:n]
        self.select(kv_cache, metadata, v_scale, index_q, index_w, topk)
        return self.attend(q, kv_cache, metadata, k_scale, output, w_uk_t, w_uv, topk)

    # Separate steps: the mutation suite's broken providers replace one.
    def write(self, kv_cache, kv_c, k_pe, k_index, md, k_scale, v_scale) -> None:
        if is_ds_mla(kv_cache):
            lay = DSMLALayout.of(self.config)
            ds_mla.write_latent(kv_cache[0], kv_c, k_pe, md.slot_mapping, lay)
            ds_mla.write_index(kv_cache[1], k_index, md.slot_mapping, lay)
            return
        mla_ops.write_latent(kv_cache[0], kv_c, k_pe, md.slot_mapping, k_scale)
        width = kv_cache.shape[-1]  # the key in the first Di values of a latent-wide row
        write_slots(
            kv_cache[1], torch.nn.functional.pad(k_index, (0, width - k_index.shape[-1])), md.slot_mapping, v_scale
        )

    def read_keys(self, kv_cache, md, length: int, v_scale) -> torch.Tensor:
        """Every block-table row's indexer keys, positions [0, length) -> fp32 [R, length, Di]."""
        di = self.index.index_head_dim
        if is_ds_mla(kv_cache):  # the key's bytes only, not the row's zero tail
            lay = DSMLALayout.of(self.config)
            return ds_mla.unpack_index(gather_rows(kv_cache[1][..., : lay.index_bytes], md.block_table, length), lay)
        return mla_ops.gather_latent(kv_cache[1][..., :di], md.block_table, length, v_scale)

    def read_latent(self, kv_cache, slots: torch.Tensor, k_scale) -> torch.Tensor:
        """The latent rows at flat slot indices [m] -> fp32 [m, L + R]."""
        plane = kv_cache[0]
        flat = plane.reshape(plane.shape[0] * plane.shape[1], plane.shape[-1])
        rows = flat.index_select(0, slots)
        return (
            ds_mla.unpack_latent(rows, DSMLALayout.of(self.config))
            if is_ds_mla(kv_cache)
            else dequantize(rows, k_scale)
        )

    def select(self, kv_cache, md, v_scale, index_q, index_w, topk: torch.Tensor) -> None:
        """Each token's top-k positions into topk [n, K]."""
        n, block_size = topk.shape[0], kv_cache.shape[2]
        length = gather_length(md, block_size)
        rows = md.block_table.shape[0]
        req = md.req_id_per_token[:n].to(torch.int64).clamp(0, max(rows - 1, 0))  # a kernel reads the row named
        # The scores depend on the key only (the query is the layer's): once per request row.
        keys = self.read_keys(kv_cache, md, length, v_scale)  # [R, S, Di]
        scores = index_scores(keys, index_q, index_w)[req]  # [n, S]
        ctx = (md.seq_lens.to(torch.int64) - md.query_lens.to(torch.int64))[req]
        topk.copy_(select_topk(scores, ctx, md.token_seq_lens[:n].to(torch.int64), topk.shape[1]))

    def attend(self, q, kv_cache, md, k_scale, output, w_uk_t, w_uv, topk: torch.Tensor):
        """Absorbed MQA of every token over its picked latent rows (vLLM's sparse MLA runs the
        absorbed form for decode and prefill alike)."""
        n, block_size, lat = topk.shape[0], kv_cache.shape[2], self.dims.kv_lora_rank
        idx = topk.to(torch.int64)  # [n, K] request-local positions
        valid = idx >= 0
        at = idx.clamp_min(0)
        rows = md.block_table.shape[0]
        req = md.req_id_per_token[:n].to(torch.int64).clamp(0, max(rows - 1, 0))
        blocks = md.block_table.to(torch.int64)[req[:, None], (at // block_size).clamp(max=md.block_table.shape[1] - 1)]
        slots = (blocks.clamp_min(0) * block_size + at % block_size).masked_fill(~valid, 0)  # -1 reads nothing
        picked = self.read_latent(kv_cache, slots.reshape(-1), k_scale).view(n, idx.shape[1], -1)
        picked = picked.masked_fill(~valid[..., None], 0.0)  # [n, K, L + R]
        qq = mla_ops.absorb_query(q[:n], w_uk_t, self.dims)  # [n, Hl, L + R]
        scores = torch.matmul(qq.float() * self.config.scale, picked.transpose(1, 2))  # [n, Hl, K]
        scores.masked_fill_(~valid[:, None, :], float("-inf"))
        p = torch.softmax(scores, dim=-1)
        p = p.masked_fill(~valid.any(dim=-1)[:, None, None], 0.0)  # nothing picked: 0, not 0/0
        o_lat = torch.matmul(p, picked[..., :lat])
        output[:n].copy_(mla_ops.up_project(o_lat.to(q.dtype), w_uv))
        return output


def is_ds_mla(kv_cache: torch.Tensor) -> bool:
    return kv_cache.dtype == torch.uint8  # an fp8_ds_mla cache: byte rows (backend/attention/ds_mla.py)


def gather_rows(plane: torch.Tensor, block_rows: torch.Tensor, length: int) -> torch.Tensor:
    """plane [num_blocks, block_size, row], block_rows [C, max_blocks] -> [C, length, row] in the
    plane's dtype (positions 0..length-1 of each row's sequence; a -1 block is read as block 0)."""
    block_size = plane.shape[1]
    nblocks = -(-length // block_size)
    blocks = block_rows[:, :nblocks].reshape(-1).to(torch.int64).clamp_min(0)
    return plane.index_select(0, blocks).view(block_rows.shape[0], nblocks * block_size, -1)[:, :length]


class TorchSparseMLABackend(SparseMLABackend):
    name: ClassVar[str] = "torch"
    impl_cls = TorchSparseMLAImpl

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        from backend.attention.capabilities import device_class, torch_unavailable

        return torch_unavailable(device_class(device))
