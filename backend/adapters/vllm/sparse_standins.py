"""Torch stand-ins for the calls that keep vLLM 0.34's sparse builders (the DSA indexer's
DeepseekV32IndexerMetadataBuilder and the sparse MLA builders) from running off a GPU, each the
same arithmetic as the kernel it replaces, put in place only where there is no GPU and named in
every result (the adapter's EMULATED list and the backend's `emulated`).

- `token_to_req_indices`: vllm/v1/attention/ops/metadata.py compute_token_to_req_indices launches
  the Triton `_token_request_mapping_kernel` (a binary search over the device query_start_loc;
  tokens at or past the mapped count -> request 0). CommonAttentionMetadata.token_to_req_indices,
  which every sparse MLA builder's build calls, imports it from that module at call time.
- `prefill_chunk_metadata`: indexer.py's module instance _BUILD_PREFILL_CHUNK_METADATA_KERNEL
  (BuildPrefillChunkMetadataKernel, Triton) writes the per-token key ranges [ks, ke) and
  token_to_seq of an indexer prefill chunk; build_prefill_chunk_metadata calls it for every chunk.
  Without DCP and ShardQ positions only (refused otherwise: orch runs neither).
- `uniform_decode`: indexer.py's _PREPARE_UNIFORM_DECODE_KERNEL (PrepareUniformDecodeKernel,
  Triton) flattens a uniform decode batch of max_decode_len tokens a request to one row a token
  (its length clamped at 0, its block-table row, decode length 1): the indexer's path when native
  decode cannot take 1 + k rows (k >= 2 without DeepGEMM).
- `num_compute_units`: the builders size their tile-scheduler scratch by the device's SM count
  (vllm.utils.platform_utils.num_compute_units); vLLM's platform without a GPU ("unspecified")
  raises NotImplementedError. One unit: the scratch is read only by the GPU kernels.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from backend.adapters.vllm.native import note

TOKEN_TO_REQ = "compute_token_to_req_indices (orch's torch: vLLM's is Triton)"
PREFILL_CHUNK = "indexer BuildPrefillChunkMetadataKernel (orch's torch: vLLM's is Triton)"
UNIFORM_DECODE = "indexer PrepareUniformDecodeKernel (orch's torch: vLLM's is Triton)"
COMPUTE_UNITS = "num_compute_units = 1 (vLLM's platform without a GPU has none)"


def token_to_req_indices(
    query_start_loc: torch.Tensor, out: torch.Tensor, num_mapped_tokens: int, num_tokens: int
) -> torch.Tensor:
    """Token t -> the request whose [start, end) holds it (a zero-length request holds none),
    capped at the last request; 0 for t >= num_mapped_tokens. No host read."""
    num_reqs = query_start_loc.shape[0] - 1
    token = torch.arange(num_tokens, dtype=torch.int32, device=query_start_loc.device)
    req = torch.searchsorted(query_start_loc[1:].contiguous(), token, right=True, out_int32=True)
    req = req.clamp_(max=max(num_reqs - 1, 0))
    out[:num_tokens].copy_(torch.where(token < num_mapped_tokens, req, torch.zeros_like(req)))
    return out[:num_tokens]


def prefill_chunk_metadata(
    query_start_loc: torch.Tensor,
    uncompressed_seq_lens: torch.Tensor,
    cu_compressed_seq_lens: torch.Tensor,
    row_start_cu_compressed_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor,
    cu_compressed_seq_len_ks: torch.Tensor,
    cu_compressed_seq_len_ke: torch.Tensor,
    query_slice_start: int,
    query_slice_stop: int,
    DCP_RANK: int,
    DCP_WORLD: int,
    DCP_INTERLEAVE: int,
    *,
    num_reqs: int,
    COMPRESS_RATIO: int,
    positions: torch.Tensor | None = None,
) -> None:
    """BuildPrefillChunkMetadataKernel's stores: for query token a in [slice start, slice stop) of
    request r, ks = row start of r, ke = row start + (seq_len_r - query_len_r + offset + 1) //
    ratio; token_to_seq[j] = the request whose compressed keys hold j."""
    if DCP_WORLD != 1 or positions is not None:
        raise NotImplementedError(
            "orch's stand-in for BuildPrefillChunkMetadataKernel covers neither DCP nor ShardQ positions"
        )
    qsl = query_start_loc[: num_reqs + 1].to(torch.int64)
    query_lens = qsl[1:] - qsl[:-1]
    token = torch.arange(query_slice_start, query_slice_stop, device=qsl.device)
    req = torch.searchsorted(qsl[1:].contiguous(), token, right=True).clamp_(max=max(num_reqs - 1, 0))
    offset = token - qsl[req]
    start = uncompressed_seq_lens[:num_reqs].to(torch.int64)[req] - query_lens[req]
    row = row_start_cu_compressed_seq_lens[:num_reqs].to(torch.int64)[req]
    cu_compressed_seq_len_ks.copy_(row)
    cu_compressed_seq_len_ke.copy_(row + torch.div(start + 1 + offset, COMPRESS_RATIO, rounding_mode="floor"))
    keys = torch.arange(token_to_seq.shape[0], device=qsl.device)
    token_to_seq.copy_(
        torch.searchsorted(cu_compressed_seq_lens[1 : num_reqs + 1].to(torch.int64).contiguous(), keys, right=True)
    )


def uniform_decode(
    seq_lens: torch.Tensor,
    decode_seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    expanded_block_table: torch.Tensor,
    decode_lens: torch.Tensor,
    num_decode_tokens: int,
    max_decode_len: int,
) -> None:
    """PrepareUniformDecodeKernel's stores for tokens [0, num_decode_tokens): token idx of request
    idx // m, local idx % m: length max(seq_len - m + local + 1, 0), its request's block-table row
    (the expanded table's width), decode length 1."""
    idx = torch.arange(num_decode_tokens, device=seq_lens.device)
    req, local = idx // max_decode_len, idx % max_decode_len
    length = (seq_lens.to(torch.int64)[req] - max_decode_len + local + 1).clamp_(min=0)
    decode_seq_lens[:num_decode_tokens].copy_(length)
    width = expanded_block_table.shape[1]
    expanded_block_table[:num_decode_tokens].copy_(block_table[req, :width])
    decode_lens[:num_decode_tokens].fill_(1)


def one_compute_unit(device_id: int | None = 0) -> int:
    return 1


def install() -> tuple[str, ...]:
    """Put the stand-ins in place (no GPU here: vLLM's kernels are Triton); what was replaced, for
    versions["emulated"]. Idempotent. The modules must be imported already."""
    if torch.cuda.is_available():
        return ()
    # Module attributes vLLM's build paths look up at call time (Any: they are vLLM's names).
    metadata_ops: Any = sys.modules["vllm.v1.attention.ops.metadata"]
    metadata_ops.compute_token_to_req_indices = token_to_req_indices
    indexer: Any = sys.modules["vllm.v1.attention.backends.mla.indexer"]
    indexer._BUILD_PREFILL_CHUNK_METADATA_KERNEL = prefill_chunk_metadata
    indexer._PREPARE_UNIFORM_DECODE_KERNEL = uniform_decode
    sparse: Any = sys.modules["vllm.v1.attention.backends.mla.flashmla_sparse"]
    indexer.num_compute_units = sparse.num_compute_units = one_compute_unit
    # Modules that imported the pinned-memory constant by name (fixups.pin_memory_off covers vLLM's own).
    for name in (
        "vllm.model_executor.layers.attention.sparse_mla_attention",
        "vllm.v1.attention.backends.mla.indexer",
        "vllm.v1.attention.backends.mla.flashmla_sparse",
    ):
        module: Any = sys.modules.get(name)
        if module is not None and hasattr(module, "PIN_MEMORY"):
            module.PIN_MEMORY = False
    done = (TOKEN_TO_REQ, PREFILL_CHUNK, UNIFORM_DECODE, COMPUTE_UNITS)
    for what in done:
        note(what)
    return done
