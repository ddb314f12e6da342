"""`torch` provider: vectorised paged gather + masked softmax. CPU and GPU, bf16/fp16/fp32, auto/fp8.

Graph-safe (support ALWAYS): the mask is computed on device from seq_lens, query_start_loc and
query_lens; the one host value that reaches a shape is the gather length, the metadata's host
`max_seq_len` rounded up to whole blocks, as vLLM's backends size their launches by it
(FlashAttention's max_seqlen_k, the partition count of paged decode). A graph freezes it at
capture, where the builder sets it to max_model_len (vLLM's capture batch, DESIGN.md §4a), an
upper bound of every replay; eager steps and the attention between piecewise graphs gather only
the blocks their batch can reach (at the GPU shape a 200-request decode step gathered every
request's 4096 positions, 6.7 GB of fp32 K/V, for contexts of ~2048).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from backend.attention.builder import PersistentMetadataBuilder
from backend.attention.interface import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadata,
)
from backend.attention.kv_cache import write_kv
from backend.providers.torch_ops import gather_paged, masked_attention, token_chunks, token_to_request


def gather_length(metadata: AttentionMetadata, block_size: int) -> int:
    """Key positions each token gathers: the host max_seq_len in whole blocks, at most the block
    table's width (at least one block, so an empty batch keeps non-empty shapes)."""
    width = metadata.block_table.shape[1] * block_size
    need = -(-max(int(metadata.max_seq_len), 1) // block_size) * block_size
    return min(width, need)


def paged_causal_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    scale: float,
    diagonal: int = 0,
) -> torch.Tensor:
    """query [T, H, D] -> fp32 [T, H, D]. Token i of a request with query len q and seq len s
    attends to positions p < s with p <= s - q + i + diagonal (causal, bottom-right aligned; the
    mutation suite's off-by-one mask is diagonal -1)."""
    t, h, d = query.shape
    block_size, hkv = k_cache.shape[1], k_cache.shape[2]
    length = gather_length(metadata, block_size)
    req, pos = token_to_request(metadata.query_start_loc, t)
    seq = metadata.seq_lens.to(torch.int64)[req]
    qlen = metadata.query_lens.to(torch.int64)[req]
    limit = seq - qlen + pos + diagonal  # last position this token may see
    real = pos < qlen  # padded tokens (past the last request) attend nothing
    keys = torch.arange(length, device=query.device)
    out = torch.empty(t, h, d, dtype=torch.float32, device=query.device)
    per_token = length * hkv * d * 4 * 2 + h * length * 4 * 3
    for chunk in token_chunks(t, per_token):
        rows = metadata.block_table[req[chunk]]
        k = gather_paged(k_cache, rows, length, k_scale)
        v = gather_paged(v_cache, rows, length, v_scale)
        mask = (keys[None, :] <= limit[chunk, None]) & (keys[None, :] < seq[chunk, None]) & real[chunk, None]
        out[chunk] = masked_attention(query[chunk], k, v, mask, scale)
    return out


class TorchImpl(AttentionImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        self.write(kv_cache, key, value, metadata, k_scale, v_scale)
        return self.attend(query, kv_cache, metadata, k_scale, v_scale, output)

    # The two steps are separate so that subclasses (the mutation suite's broken backends) replace
    # the one they break instead of copying forward.
    def write(self, kv_cache, key, value, metadata, k_scale, v_scale) -> None:
        write_kv(kv_cache, key, value, metadata.slot_mapping, k_scale, v_scale)

    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        t = metadata.num_padded_tokens
        out = paged_causal_attention(query[:t], kv_cache[0], kv_cache[1], metadata, k_scale, v_scale, self.config.scale)
        output[:t].copy_(out.to(output.dtype))
        return output


class TorchBackend(AttentionBackend):
    name: ClassVar[str] = "torch"
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS
    builder_cls = PersistentMetadataBuilder
    impl_cls = TorchImpl

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        from backend.attention.capabilities import device_class, torch_unavailable

        return torch_unavailable(device_class(device))
