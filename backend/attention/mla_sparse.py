"""The backend contract for the mla_sparse family (DeepSeek V3.2's sparse attention, DSA): MLA whose
every query token attends only the index_topk tokens an indexer picked for it.

vLLM splits this over two builders (vllm/v1/attention/backends/mla/indexer.py's
DeepseekV32IndexerMetadataBuilder and the sparse MLA builders, e.g. flashmla_sparse.py,
rocm_aiter_mla_sparse.py); here one builder carries what both hand their kernels, in persistent
buffers a FULL graph keeps (written [:n], tails reset to the padding values on every build):

    token_seq_lens [max_num_tokens] int32   per token, the keys it may select: seq_len - query_len
        + i + 1 for token i of a request (causal), 0 for a padded token. vLLM's indexer builds the
        same per token (its decode path clamps at 0: a padded request of seq_len 0 and query len
        q would otherwise give -q + i + 1, which its top-k kernels read as an unsigned length).
    req_id_per_token [max_num_tokens] int32 the request row each token's indices resolve through
        (vLLM's req_id_per_token / token_to_req_indices); a padded token names a padded row.
    index_topk: the top-k width the buffers are sized for, the model's.

The top-k indices themselves are an activation, not metadata: the Impl writes them, per layer, into
a persistent [max_num_tokens, index_topk] int32 buffer (vLLM's topk_indices_buffer), each row the
request-local positions of its token's keys, -1 where there is none. The sparse MLA reads them
through req_id_per_token and the block table (slot = block_table[req, i // B] * B + i % B; -1 stays
-1: vLLM's convert_req_index_to_global_index).

`problems(...)` states the contract of those buffers as the family checks it after every run (a
violation names the field, the row and the value). Cache: [2, num_blocks, block_size, L + R]:
plane 0 the latent row [kv_c | k_pe] (k_scale), plane 1 the indexer's key in its first
index_head_dim values (v_scale: the indexer's cache has a scale of its own), both written at the
same slot_mapping. kv fp8_ds_mla: uint8 [2, num_blocks, block_size, row_bytes], the same planes
as byte rows with their scales inside (backend/attention/ds_mla.py), allocated by the family.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from backend.attention.ds_mla import NAME as DS_MLA
from backend.attention.ds_mla import DSMLALayout
from backend.attention.interface import AttentionConfig
from backend.attention.mla import MLABackend, MLAImpl, MLAMetadata, MLAMetadataBuilder
from backend.host_copy import copy_into


@dataclass(frozen=True)
class IndexerDims:
    index_n_heads: int  # Hi
    index_head_dim: int  # Di
    index_topk: int  # K

    @classmethod
    def of(cls, config_or_shape) -> IndexerDims:
        d = dict(config_or_shape.dims)
        return cls(d["index_n_heads"], d["index_head_dim"], d["index_topk"])


def token_seq_lens(query_lens: Sequence[int], seq_lens: Sequence[int]) -> list[int]:
    """Per real token, the keys it may select (causal): seq_len - query_len + i + 1."""
    return [s - q + i + 1 for q, s in zip(query_lens, seq_lens) for i in range(q)]


@dataclass
class SparseMLAMetadata(MLAMetadata):
    token_seq_lens: torch.Tensor | None = None  # [num_padded_tokens] int32
    req_id_per_token: torch.Tensor | None = None  # [num_padded_tokens] int32
    index_topk: int = 0


class SparseMLAMetadataBuilder(MLAMetadataBuilder):
    def __init__(self, config):
        super().__init__(config)
        self.index = IndexerDims.of(config)
        toks = config.max_num_tokens
        self.token_seq_lens = torch.zeros(toks, dtype=torch.int32, device=config.device)
        self.req_id_per_token = torch.zeros(toks, dtype=torch.int32, device=config.device)
        self.last: SparseMLAMetadata | None = None  # the latest build (the family's checks read it)

    def padded_tokens(self, md: MLAMetadata, query_lens: Sequence[int]) -> tuple[list[int], list[int]]:
        """(request row, token_seq_len) of each padded token [num_actual, num_padded): a FULL
        graph's padded requests of the uniform query len (1 + k), each of the padding seq_len,
        the tokens past them on the last row; a length is clamped at 0 (vLLM's indexer does so
        since seq_len-0 padded rows gave -1: an unsigned 4294967295 to its top-k)."""
        pad = md.num_padded_tokens - md.num_actual_tokens
        q = max(self.reorder_threshold, 1)
        first, last = md.num_reqs, max(md.num_padded_reqs - 1, 0)
        pad_seq = self.cg_padding[0]
        rows = [min(first + j // q, last) for j in range(pad)]
        return rows, [max(pad_seq - q + j % q + 1, 0) if rows[j] >= first else 0 for j in range(pad)]

    def _write(self, query_lens, seq_lens, block_table, slot_mapping, padded_tokens, padded_reqs, for_capture):
        md = super()._write(query_lens, seq_lens, block_table, slot_mapping, padded_tokens, padded_reqs, for_capture)
        rows = [r for r, q in enumerate(query_lens) for _ in range(q)]
        pad_rows, pad_lens = self.padded_tokens(md, query_lens)
        copy_into(self.req_id_per_token[: md.num_padded_tokens], torch.tensor(rows + pad_rows, dtype=torch.int32))
        copy_into(
            self.token_seq_lens[: md.num_padded_tokens],
            torch.tensor(token_seq_lens(query_lens, seq_lens) + pad_lens, dtype=torch.int32),
        )
        self.req_id_per_token[md.num_padded_tokens :].fill_(0)
        self.token_seq_lens[md.num_padded_tokens :].fill_(0)
        sparse = SparseMLAMetadata(
            **vars(md),
            token_seq_lens=self.token_seq_lens[: md.num_padded_tokens],
            req_id_per_token=self.req_id_per_token[: md.num_padded_tokens],
            index_topk=self.index.index_topk,
        )
        self.last = sparse
        return sparse


class SparseMLAImpl(MLAImpl):
    def __init__(self, config):
        super().__init__(config)
        self.index = IndexerDims.of(config)
        # The top-k indices (request-local positions, -1: none), shared by every layer as vLLM's
        # topk_indices_buffer is: persistent, so a graph writes and reads the storage it captured.
        self.topk_indices = torch.full(
            (config.max_num_tokens, self.index.index_topk), -1, dtype=torch.int32, device=config.device
        )

    def forward(
        self,
        q: torch.Tensor,
        kv_c: torch.Tensor,
        k_pe: torch.Tensor,
        k_index: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: SparseMLAMetadata,
        k_scale: torch.Tensor,
        v_scale: torch.Tensor,
        output: torch.Tensor,
        w_uk_t: torch.Tensor,
        w_uv: torch.Tensor,
        index_q: torch.Tensor,
        index_w: torch.Tensor,
    ) -> torch.Tensor:
        """Write [kv_c | k_pe] (plane 0, k_scale) and the indexer key k_index [T, Di] (plane 1,
        v_scale; an fp8_ds_mla cache: byte rows with their own scales) at slot_mapping; pick each
        token's top-k into topk_indices (index_q [Hi, Di], index_w [Hi]: the layer's indexer
        query and head weights); attend the picked keys (absorbed); write `output`
        [num_padded_tokens, Hl, V] and return it."""
        raise NotImplementedError

    def topk_for(self, metadata: SparseMLAMetadata) -> torch.Tensor:
        """The top-k buffer a run on `metadata` writes (the family's checks read it after the run)."""
        return self.topk_indices


class SparseMLABackend(MLABackend):
    family: ClassVar[str] = "mla_sparse"
    builder_cls = SparseMLAMetadataBuilder
    impl_cls = SparseMLAImpl
    # fp8_ds_mla: the family's byte rows (backend/attention/ds_mla.py), allocated by the family.
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto", "fp8", DS_MLA)

    @classmethod
    def unsupported_reasons(cls, config: AttentionConfig) -> list[str]:
        reasons = super().unsupported_reasons(config)
        if config.kv_cache_dtype == DS_MLA and DS_MLA in cls.supported_kv_cache_dtypes:
            reasons += [f"{DS_MLA}: {p}" for p in DSMLALayout.of(config).problems()]
        return reasons

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, head_size)  # the latent plane and the indexer's, L + R wide


@dataclass(frozen=True)
class Buffers:
    """A run's buffers as the contract reads them (host copies)."""

    num_actual_tokens: int
    num_padded_tokens: int
    num_reqs: int
    num_padded_reqs: int
    index_topk: int  # what the metadata says the buffers are sized for
    seq_lens: list[int]  # [num_padded_reqs]
    query_lens: list[int]
    block_table_rows: int
    token_seq_lens: list[int]  # [num_padded_tokens]
    req_id_per_token: list[int]
    topk: torch.Tensor  # [num_padded_tokens, width] int64 (the Impl's buffer, its rows for these tokens)

    @classmethod
    def of(cls, md: SparseMLAMetadata, topk_buffer: torch.Tensor) -> Buffers:
        n = md.num_padded_tokens
        return cls(
            md.num_actual_tokens,
            n,
            md.num_reqs,
            md.num_padded_reqs,
            md.index_topk,
            md.seq_lens.tolist(),
            md.query_lens.tolist(),
            md.block_table.shape[0],
            md.token_seq_lens.tolist(),
            md.req_id_per_token.tolist(),
            topk_buffer[:n].to("cpu", torch.int64),
        )


def problems(b: Buffers, model_topk: int) -> list[str]:
    """Every way the buffers break the contract (the module docstring), each naming the field, the
    row and the value; [] when they keep it. Rows: tokens [0, num_padded_tokens)."""
    out: list[str] = []
    if b.index_topk != model_topk or b.topk.shape[1] != model_topk:
        out.append(
            f"topk_indices: sized for index_topk {b.topk.shape[1]} (metadata {b.index_topk}), "
            f"the model's is {model_topk}"
        )
    live = b.num_reqs
    for t in range(b.num_padded_tokens):
        req, length = b.req_id_per_token[t], b.token_seq_lens[t]
        padded = t >= b.num_actual_tokens
        if not 0 <= req < b.block_table_rows:
            out.append(f"req_id_per_token[{t}] = {req}: outside the block table's {b.block_table_rows} rows")
            continue
        if padded and req < live and length:
            out.append(f"req_id_per_token[{t}] = {req}: padded token {t} resolves into live request {req}")
        ctx = b.seq_lens[req] if req < len(b.seq_lens) else 0
        if not 0 <= length <= ctx:
            out.append(f"token_seq_lens[{t}] = {length}: outside [0, seq_len {ctx}] of request {req}")
        row = b.topk[t]
        picked = row[row >= 0]
        if (row < -1).any():
            out.append(f"topk_indices[{t}] holds {int(row[row < -1][0])}: neither -1 nor a position")
        if padded and req < live and picked.numel():
            out.append(f"topk_indices[{t}] = {int(picked[0])}: padded token {t} indexes live request {req}")
        elif picked.numel() and int(picked.max()) >= max(length, 0):
            out.append(f"topk_indices[{t}] = {int(picked.max())}: past its token_seq_lens {length} (not causal)")
        if len(set(picked.tolist())) != picked.numel():
            out.append(f"topk_indices[{t}]: a position picked twice")
    return out
