"""The four roles of a paged attention backend, as in vLLM's v1 backends (DESIGN.md §3).

- AttentionBackend: static capabilities (name, cudagraph support level, kv dtypes, availability).
- AttentionMetadata: a dataclass of tensors (+ a few host ints) for one step.
- AttentionMetadataBuilder: turns a BatchDescription (host-side) into metadata, writing into
  persistent device buffers so that captured graphs read the new values on replay.
- AttentionImpl.forward: kernel launches only; it may not look at host values that change between
  steps unless the backend declares a support level that keeps them fixed within a graph.

Shapes (per tp rank): query [T, H, D], key/value [T, Hkv, D], output [T, H, D];
kv_cache [2, num_blocks, block_size, Hkv, D] (NHD; index 0 = K, 1 = V; block 0 = null block).
fp8 caches hold float8 values (e4m3fn, or e4m3fnuz on gfx942) and are dequantised with the
per-tensor k_scale/v_scale device tensors (shape [1], float32) inside the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

# Re-exported: the support level lives in a torch-free module so that the matrix and modes can
# use it without importing torch (start-up).
from backend.attention.support import AttentionCGSupport
from backend.case import BatchLengths


@dataclass(frozen=True)
class AttentionConfig:
    """What a builder/impl needs to size buffers and launch kernels, for one tp rank."""

    num_heads: int  # local (per rank) query heads
    num_kv_heads: int  # local kv heads
    head_size: int
    block_size: int
    num_blocks: int
    max_model_len: int
    max_num_seqs: int
    max_num_tokens: int  # largest batch in tokens (max capture size or largest eager batch)
    dtype: torch.dtype  # model dtype
    kv_cache_dtype: str  # "auto" | "fp8" | "fp8_ds_mla" (mla_sparse's byte rows: backend/attention/ds_mla.py)
    device: torch.device
    scale: float  # softmax scale, 1/sqrt(head_size)
    # The case's speculative tokens k (verify rows of 1 + k), for a backend that declares
    # `sizes_by_spec_tokens` (vLLM's builders size scratch and split decode by their
    # speculative_config); 0 for every other backend, whose sessions k > 0 cases share.
    spec_tokens: int = 0
    # The attention family (backend/families/) and its own dims as sorted (name, value) pairs:
    # e.g. an MLA provider reads kv_lora_rank here. num_kv_heads/head_size describe the cache
    # (MLA: 1 latent row of kv_lora_rank + qk_rope_head_dim).
    attention: str = "gqa"
    dims: tuple = ()
    # The sliding window of the KV-cache group spec this builder serves (vLLM's
    # kv_cache_spec.sliding_window), None for full attention. A layer's own window reaches its
    # Impl per call (swa_sinks): a backend that reads it from here instead is wrong for every full
    # layer of a merged group (vLLM #51756).
    sliding_window: int | None = None
    # The kind of that group spec: "sliding_window" (vLLM's SlidingWindowSpec: blocks wholly
    # outside the window are freed) or "full" (FullAttentionSpec, which records the window of a
    # merged group's first layer when the hybrid manager is off).
    kv_spec: str = "full"
    # The largest cudagraph capture size (vLLM's max_cudagraph_capture_size; 0: none): GDN's
    # persistent per-request buffers are min(max_num_seqs * (1 + k), this) long.
    max_capture_size: int = 0

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    def dim(self, name: str):
        return dict(self.dims)[name]


@dataclass
class BatchDescription(BatchLengths):
    """Host-side description of one step's batch (vLLM's CommonAttentionMetadata, on CPU).

    Only real requests/tokens: padding is the builder's job.
    """

    query_lens: list[int]
    seq_lens: list[int]  # context + new, per request
    block_table: torch.Tensor  # [num_reqs, max_blocks_per_seq] int32, CPU; unused entries 0
    slot_mapping: torch.Tensor  # [num_tokens] int64, CPU; slot = block * block_size + offset
    # Spec decode, for builders that read them (GDN): each request's accepted-token count from its
    # previous verify step and its draft count (-1: not a verify row). None: not given (k = 0).
    num_accepted_tokens: list[int] | None = None
    num_draft_tokens: list[int] | None = None


@dataclass
class AttentionMetadata:
    """One step's metadata. Tensors are views of the builder's persistent buffers, sized to the
    padded request/token counts; host ints describe the real batch (graph code must not rely on
    them unless the support level guarantees they are the same within a captured graph)."""

    num_actual_tokens: int  # real tokens (host)
    num_reqs: int  # real requests (host)
    num_padded_tokens: int  # tokens the step runs with (capture size, or num_actual_tokens)
    num_padded_reqs: int
    max_query_len: int  # host
    max_seq_len: int  # host
    query_start_loc: torch.Tensor  # [num_padded_reqs + 1] int32; padded reqs repeat the last value
    seq_lens: torch.Tensor  # [num_padded_reqs] int32; padded reqs have 0
    block_table: torch.Tensor  # [num_padded_reqs, max_blocks_per_seq] int32; padded rows = null block 0
    slot_mapping: torch.Tensor  # [num_padded_tokens] int64; padded tokens have -1 (write nothing)
    query_lens: torch.Tensor  # [num_padded_reqs] int32 (device); padded reqs have 0
    for_capture: bool = False  # built by build_for_capture (dummy batch)


class AttentionMetadataBuilder:
    """Builds metadata into persistent buffers (allocated once in __init__, sized for
    max_num_seqs requests and max_num_tokens tokens), written [:n] with the tail reset to the
    padding values, so a graph captured on these buffers sees every later step's values."""

    # The seq_len and block-table value a FULL graph's padded requests get (vLLM's
    # AttentionMetadataBuilder.cg_pad_seq_lens / cg_pad_block_table, with its defaults): a builder
    # whose kernels read padded requests declares safe ones (vLLM's FlashMLA with an fp8 cache, 1
    # and 0: seq_len 0 made it index block_table[-1], #33664), class-wide or per instance. The
    # runner pads with the maximum of each over its builders (backend/attention/padding.py);
    # `cg_padding` is what it applied, the pair this builder's writes pad with.
    cg_pad_seq_lens: ClassVar[int] = 0
    cg_pad_block_table: ClassVar[int] = -1

    def __init__(self, config: AttentionConfig):
        self.config = config
        self.cg_padding = (self.cg_pad_seq_lens, self.cg_pad_block_table)

    def build(
        self, batch: BatchDescription, num_padded_tokens: int | None = None, num_padded_reqs: int | None = None
    ) -> AttentionMetadata:
        raise NotImplementedError

    def build_for_capture(self, num_tokens: int, uniform_query_len: int = 0, style: str = "v2") -> AttentionMetadata:
        """The dummy batch vLLM captures with (DESIGN.md §4a): a uniform-decode graph gets
        cdiv(num_tokens, q) requests of q = uniform_query_len tokens and host max_query_len q; a
        mixed graph (uniform_query_len 0) spreads num_tokens over min(num_tokens, max_num_seqs)
        requests with host max_query_len = num_tokens. Host max_seq_len = max_model_len; device
        seq_lens are max_model_len (style "v1") or each request's query len (style "v2")."""
        raise NotImplementedError


class AttentionImpl:
    def __init__(self, config: AttentionConfig):
        self.config = config

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        k_scale: torch.Tensor,
        v_scale: torch.Tensor,
        output: torch.Tensor,
    ) -> torch.Tensor:
        """Write this step's K/V into kv_cache at metadata.slot_mapping (skipping -1), then
        attend; write into `output` [num_padded_tokens, H, D] and return it. Rows of padded
        tokens may hold anything finite."""
        raise NotImplementedError


class AttentionBackend:
    """Static capabilities. Subclasses set the ClassVars; user plugins subclass this too."""

    name: ClassVar[str] = "base"
    # The attention family this class implements (backend/families/): its Impl.forward takes
    # that family's inputs (gqa: q, k, v; mla: backend/attention/mla.py).
    family: ClassVar[str] = "gqa"
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto", "fp8")
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16, torch.float32)
    builder_cls: ClassVar[type[AttentionMetadataBuilder]] = AttentionMetadataBuilder
    impl_cls: ClassVar[type[AttentionImpl]] = AttentionImpl
    # True: the session's AttentionConfig carries the case's spec_tokens (and k > 0 cases get
    # sessions of their own). Ours size nothing by k: their sessions are shared across k.
    sizes_by_spec_tokens: ClassVar[bool] = False
    # The tp communicator's in-place all-reduce used by the test model's row-parallel projection,
    # for a backend that brings its own (a custom all-reduce, or a mutant); None = torch.distributed.
    tp_all_reduce: ClassVar[Callable[[torch.Tensor], torch.Tensor] | None] = None
    # True: the backend JIT-compiles kernels (Triton) on first use, so `orch run` warms its disk
    # cache in helper processes at the start of a GPU run (backend/harness/precompile.py).
    jit_kernels: ClassVar[bool] = False

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        """None if this backend can run on `device` here; else why not (platform, arch, import)."""
        return None

    @classmethod
    def unsupported_reasons(cls, config: AttentionConfig) -> list[str]:
        """Every reason `config` is unsupported (not just the first); empty if supported."""
        reasons = []
        if config.kv_cache_dtype not in cls.supported_kv_cache_dtypes:
            reasons.append(f"kv_cache_dtype {config.kv_cache_dtype} not supported by {cls.name}")
        if config.dtype not in cls.supported_dtypes:
            reasons.append(f"dtype {config.dtype} not supported by {cls.name}")
        if config.num_heads % max(config.num_kv_heads, 1):
            reasons.append("num_heads not a multiple of num_kv_heads")
        return reasons

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_size)
