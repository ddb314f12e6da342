"""The backend contract for the MLA family (DESIGN.md §9a): the four roles as vLLM's MLA backends
have them (vllm/model_executor/layers/attention/mla_attention.py: MLACommonBackend, -Metadata,
-MetadataBuilder, -Impl), over our persistent-buffer builder.

Shapes (per tp rank; L = kv_lora_rank, R = qk_rope_head_dim, P = qk_nope_head_dim, V = v_head_dim):
    q [T, Hl, P + R]; kv_c [T, L] (normed latent); k_pe [T, R]
    kv_cache [num_blocks, block_size, L + R]: one row [kv_c | k_pe] per token, no head axis,
      replicated on every tp rank (vLLM's MLAAttentionSpec: num_kv_heads 1, head_size L + R);
      fp8 caches use one per-tensor k_scale for the whole row (V is the latent: vLLM's
      TritonMLA passes layer._k_scale as v_scale too)
    w_uk_t [Hl, P, L], w_uv [Hl, L, V]: the rank's slices of kv_b_proj (W_UK transposed, W_UV)
    output [T, Hl, V]

Graph rules (vLLM): MLA backends declare at most UNIFORM_BATCH (FlashInfer-MLA: ALWAYS). The
builder's capture batch must be decode-only (MLACommonMetadataBuilder.build_for_cudagraph_capture
asserts num_reqs <= num_tokens * threshold and max_query_len <= threshold), so FULL graphs are
uniform decode of q = 1, or 1 + k under spec decode (the reorder threshold is raised to 1 + k,
`_init_reorder_batch_threshold`); mixed batches run PIECEWISE with attention eager. Rows come
decodes first (the V2 runner's sort_batch_req_ids; families/mla.py orders every step so), and
split_decodes_and_prefills finds the boundary: tokens [0, num_decode_tokens) take the decode
(absorbed) path, the rest the prefill (decompressed) path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from backend.attention.builder import PersistentMetadataBuilder
from backend.attention.interface import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionConfig,
    AttentionImpl,
    AttentionMetadata,
)


@dataclass(frozen=True)
class MLADims:
    kv_lora_rank: int  # L
    qk_rope_head_dim: int  # R
    qk_nope_head_dim: int  # P
    v_head_dim: int  # V

    @classmethod
    def of(cls, config_or_shape) -> MLADims:
        d = dict(config_or_shape.dims)
        return cls(d["kv_lora_rank"], d["qk_rope_head_dim"], d["qk_nope_head_dim"], d["v_head_dim"])

    @property
    def row(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


def split_decodes_and_prefills(
    query_lens: Sequence[int], threshold: int, require_uniform: bool = True
) -> tuple[int, int, int, int]:
    """vllm/v1/attention/backends/utils.py split_decodes_and_prefills on host query lens of a
    reordered batch (decodes first): (num_decodes, num_prefills, num_decode_tokens,
    num_prefill_tokens). With `require_uniform` (query_len_support UNIFORM, as TritonMLA and
    AITER MLA declare) the decodes are the leading rows whose query len equals the first's (and
    padded requests of query len 0); a short extend of another length is a prefill."""
    n, tokens = len(query_lens), sum(query_lens)
    if not n:
        return 0, 0, 0, 0
    if max(query_lens) <= threshold and (not require_uniform or threshold <= 1):
        return n, 0, tokens, 0
    if query_lens[0] > threshold:
        return 0, n, 0, tokens
    first = query_lens[0]
    if require_uniform:
        if all(q in (first, 0) for q in query_lens):
            return n, 0, tokens, 0
        is_prefill = [q not in (first, 0) for q in query_lens]
    else:
        is_prefill = [q > threshold for q in query_lens]
    if not any(is_prefill):
        return n, 0, tokens, 0
    d = is_prefill.index(True)
    dt = sum(query_lens[:d])
    return d, n - d, dt, tokens - dt


@dataclass
class MLAMetadata(AttentionMetadata):
    """AttentionMetadata plus the decode/prefill split (host ints, as vLLM's MLACommonMetadata
    carries num_decodes etc.; frozen by a graph, which only ever holds a uniform decode batch)."""

    num_decodes: int = 0
    num_prefills: int = 0
    num_decode_tokens: int = 0
    num_prefill_tokens: int = 0
    reorder_threshold: int = 1


class MLAMetadataBuilder(PersistentMetadataBuilder):
    """The common MLA builder: persistent buffers (PersistentMetadataBuilder), the reorder
    threshold 1 + k, the split, and vLLM's decode-only capture."""

    def __init__(self, config: AttentionConfig):
        super().__init__(config)
        # _init_reorder_batch_threshold: raised to 1 + k under spec decode (query_len_support
        # UNIFORM; MLA backends declare sizes_by_spec_tokens so the config carries k).
        self.reorder_threshold = 1 + config.spec_tokens
        self.dims = MLADims.of(config)

    def _split(self, md: AttentionMetadata, query_lens: Sequence[int]) -> MLAMetadata:
        nd, npf, ndt, npt = split_decodes_and_prefills(list(query_lens), self.reorder_threshold)
        if npf == 0 and md.num_padded_tokens > md.num_actual_tokens:
            # A padded uniform batch (a FULL decode graph's replay): the padded requests (query
            # len 0) and tokens belong to the decode part, as captured (vLLM: "ensures
            # num_decodes matches the captured size").
            nd, ndt = md.num_padded_reqs, md.num_padded_tokens
        return MLAMetadata(
            **vars(md),
            num_decodes=nd,
            num_prefills=npf,
            num_decode_tokens=ndt,
            num_prefill_tokens=npt,
            reorder_threshold=self.reorder_threshold,
        )

    def _write(
        self, query_lens, seq_lens, block_table, slot_mapping, padded_tokens, padded_reqs, for_capture
    ) -> MLAMetadata:
        # Every build (a step's, and the capture batch's) goes through here: the split is computed
        # on the host values the common builder wrote.
        md = super()._write(query_lens, seq_lens, block_table, slot_mapping, padded_tokens, padded_reqs, for_capture)
        return self._split(md, query_lens)

    def build_for_capture(self, num_tokens: int, uniform_query_len: int = 0, style: str = "v2") -> MLAMetadata:
        # MLACommonMetadataBuilder.build_for_cudagraph_capture's assertions, in their words.
        if uniform_query_len <= 0 or uniform_query_len > self.reorder_threshold:
            raise AssertionError(
                "MLA only supports decode-only full CUDAGraph capture. Make sure all "
                f"cudagraph capture sizes <= max_num_seq (a {num_tokens}-token "
                f"{'mixed' if uniform_query_len <= 0 else f'q = {uniform_query_len}'} "
                f"graph, reorder threshold {self.reorder_threshold})"
            )
        return super().build_for_capture(num_tokens, uniform_query_len, style)


class MLAImpl(AttentionImpl):
    def __init__(self, config: AttentionConfig):
        super().__init__(config)
        self.dims = MLADims.of(config)

    def forward(
        self,
        q: torch.Tensor,
        kv_c: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: MLAMetadata,
        k_scale: torch.Tensor,
        output: torch.Tensor,
        w_uk_t: torch.Tensor,
        w_uv: torch.Tensor,
    ) -> torch.Tensor:
        """Write [kv_c | k_pe] at metadata.slot_mapping (skipping -1), then attend: decode tokens
        absorbed, prefill tokens decompressed; write `output` [num_padded_tokens, Hl, V] and return
        it. Rows of padded tokens may hold anything finite."""
        raise NotImplementedError


class MLABackend(AttentionBackend):
    """Static capabilities of an MLA provider (subclass this for one)."""

    family: ClassVar[str] = "mla"
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16, torch.float32)
    builder_cls = MLAMetadataBuilder
    impl_cls = MLAImpl
    # The reorder threshold (1 + k) sizes the builder: sessions per k.
    sizes_by_spec_tokens: ClassVar[bool] = True

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        return (num_blocks, block_size, head_size)  # head_size = L + R; one latent row, no head axis
