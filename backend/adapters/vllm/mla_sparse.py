"""The mla_sparse family through vLLM's own sparse builders: `vllm:FLASHMLA_SPARSE` (current
interface, 0.33/0.34; vllm/v1/attention/backends/mla/indexer.py and flashmla_sparse.py).

What runs as vLLM's, every step and every capture: DeepseekV32IndexerMetadataBuilder (the DSA
indexer's: its decode/prefill split at 1 + k, its per-token key lengths, the decode path's
persistent buffers and its clamp of padded rows at 0, its prefill chunks' [ks, ke) ranges) and
FlashMLASparseMetadataBuilder (through SparseMLACommonMetadataBuilder: `req_id_per_token`, vLLM's
token_to_req_indices), both handed orch's step metadata as the V2 runner hands it (padded counts;
padded requests of query length 0, as vLLM pads query_start_loc). Their values fill the family's
persistent buffers: `token_seq_lens` is the indexer's per-token length (decode rows from its
decode seq_lens, prefill rows ke - ks of its chunks; 0 where vLLM computes none: a token past
the mapped ones), `req_id_per_token` the sparse builder's. The family's contract checks and the
fp32 reference then judge vLLM's values.

What is orch's, labelled in every result (versions["kernels"], versions["emulated"]): the KV
write, the indexer scores and top-k, and the sparse MLA (the family's torch kernels: FlashMLA's
sparse kernels and DeepGEMM's MQA logits are compiled CUDA); off a GPU, torch stand-ins of the
four calls in vLLM's build paths that launch Triton or ask the platform (sparse_standins.py).
Not bridged: vLLM's sparse prefill backend (the layer's `prefill_backend` is None, so the
builder makes no prefill metadata: orch's torch attends every token absorbed) and vLLM's
`fp8`/`fp8_ds_mla` cache (vLLM's "fp8" here is the 656-byte fp8_ds_mla row, not orch's
per-tensor fp8; its fp8 builder path is FlashMLA's compiled metadata): kv auto only, the other two
skip with the reason (KV_REASONS).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from backend.attention.interface import AttentionCGSupport, AttentionConfig
from backend.attention.mla import MLADims
from backend.attention.mla_sparse import (
    IndexerDims,
    SparseMLABackend,
    SparseMLAMetadata,
    SparseMLAMetadataBuilder,
)
from backend.host_copy import copy_into
from backend.providers.torch_mla_sparse import TorchSparseMLAImpl

NAME = "FLASHMLA_SPARSE"
# Why the quantised caches skip: vLLM's builder takes its fp8 path for either name, and that path
# is compiled CUDA orch cannot run in place or stand in for.
KV_REASONS = {
    "fp8_ds_mla": (
        "kv_cache_dtype fp8_ds_mla not bridged for vllm:FLASHMLA_SPARSE: with an fp8 cache its builder "
        "builds FlashMLA's scheduler metadata (get_mla_metadata: flash_mla's compiled CUDA) and its "
        "decode and prefill run the fp8 FlashMLA kernels on vLLM's pages; orch's byte rows are the same "
        "656 bytes, but no vLLM code would read them (docs/VLLM.md)"
    ),
    "fp8": (
        "kv_cache_dtype fp8 not supported by vllm:FLASHMLA_SPARSE: vLLM's 'fp8' there is the fp8_ds_mla "
        "row (orch's fp8_ds_mla), not orch's per-tensor fp8"
    ),
}
LAYER = "model.layers.0.self_attn.attn"
INDEXER_LAYER = "model.layers.0.self_attn.indexer.k_cache"
KERNELS = (
    "indexer and sparse MLA builders: vLLM's; KV write, indexer scores, top-k and sparse MLA: "
    "orch's torch (FlashMLA's sparse kernels and DeepGEMM are compiled CUDA)"
)
ROCM_REASON = (
    "unavailable: vllm:ROCM_AITER_MLA_SPARSE is not bridged: its builder's constructor imports "
    "aiter.get_mla_metadata_info_v1 (a ROCm JIT module) and its build calls aiter.get_mla_metadata_v1 "
    "(compiled HIP) and generate_sparse_seqlen_triton (Triton); docs/VLLM.md"
)


def on_gpu() -> bool:
    return torch.cuda.is_available()


@functools.lru_cache(maxsize=1)
def load_sparse() -> tuple[tuple[type, type] | None, str | None]:
    """((vLLM's indexer builder, its FlashMLA sparse builder), None), or (None, why not here)."""
    from backend.adapters.vllm import current_interface, errors, fixups, native

    iface, why = current_interface()
    if iface is None:
        return None, why
    if iface.name != "current":
        return None, f"unavailable: vllm:{NAME} is bridged for vLLM's current interface (0.33/0.34) only"
    try:
        native.stub_platform_native()
        with errors.quiet_vllm_import():
            import vllm.v1.attention.ops.metadata  # noqa: F401 - the stand-ins replace its function
            from vllm.v1.attention.backends.mla.flashmla_sparse import (
                FlashMLASparseMetadataBuilder,
            )
            from vllm.v1.attention.backends.mla.indexer import (
                DeepseekV32IndexerMetadataBuilder,
            )
    except Exception as exc:  # noqa: BLE001 - an import that fails for any reason is "unavailable"
        return None, errors.backend_import_failed(NAME, exc)
    fixups.pin_memory_off()
    from backend.adapters.vllm import sparse_standins

    sparse_standins.install()
    return (DeepseekV32IndexerMetadataBuilder, FlashMLASparseMetadataBuilder), None


def model_dir(config: AttentionConfig) -> str:
    """A config.json of DeepSeek V3.2's kind (model_type deepseek_v32: vLLM reads index_topk and
    the MLA dims from it) for one rank's heads and the family's dims."""
    from backend.adapters.vllm.config import TEST_ARCH

    m, ix = MLADims.of(config), IndexerDims.of(config)
    doc = {
        "architectures": [TEST_ARCH],
        "model_type": "deepseek_v32",
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_heads,
        "hidden_size": config.num_heads * m.v_head_dim,
        "num_hidden_layers": 1,
        "intermediate_size": 2 * config.num_heads * m.v_head_dim,
        "vocab_size": 256,
        "max_position_embeddings": config.max_model_len,
        "torch_dtype": str(config.dtype).removeprefix("torch."),
        "kv_lora_rank": m.kv_lora_rank,
        "qk_rope_head_dim": m.qk_rope_head_dim,
        "qk_nope_head_dim": m.qk_nope_head_dim,
        "v_head_dim": m.v_head_dim,
        "q_lora_rank": None,
        "index_n_heads": ix.index_n_heads,
        "index_head_dim": ix.index_head_dim,
        "index_topk": ix.index_topk,
    }
    key = "orch-vllm-dsv32-" + "-".join(str(v) for k, v in sorted(doc.items()) if k != "architectures")
    path = os.path.join(tempfile.gettempdir(), key)
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, "config.json")
    tmp = f"{target}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, target)
    return path


@functools.lru_cache(maxsize=8)
def vllm_context(config: AttentionConfig) -> Any:
    """The VllmConfig (full graphs, the case's k) with the attention layer its sparse builder reads
    from the static forward context: no prefill backend, no ShardQ."""
    from backend.adapters.vllm.config import full_graphs_config

    vc = full_graphs_config(config, model_path=model_dir(config))
    layer = types.SimpleNamespace(prefill_backend=None, use_shardq=False, impl=types.SimpleNamespace())
    vc.compilation_config.static_forward_context[LAYER] = layer
    return vc


def indexer_token_lens(built: Any, query_start_loc_cpu: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Per token, the keys vLLM's indexer lets it select; 0 where it computes none (a token past
    the requests' query ranges). int32 [num_tokens] on the builder's device.

    Decode tokens from its decode seq_lens: flattened, one row a token; native, one row a decode
    request of max_decode_len columns, token j of a request of q tokens in column
    max_decode_len - q + j (seq_len - max_decode_len + 1 + column: its own formula, so the
    column of the request's last token holds seq_len). Prefill tokens: each chunk's ke - ks."""
    out = torch.zeros(num_tokens, dtype=torch.int32, device=built.seq_lens.device)
    decode = built.decode
    if decode is not None and built.num_decode_tokens:
        seq = decode.seq_lens.reshape(decode.seq_lens.shape[0], -1)
        qsl = query_start_loc_cpu.tolist()
        if seq.shape[0] == built.num_decodes:  # native: a row a request
            cols = seq.shape[1]
            pairs = [
                (qsl[r] + j, r * cols + cols - (qsl[r + 1] - qsl[r]) + j)
                for r in range(built.num_decodes)
                for j in range(qsl[r + 1] - qsl[r])
            ]
        else:  # flattened: a row a token
            pairs = [(t, t) for t in range(seq.shape[0])]
        pairs = [(t, i) for t, i in pairs if t < num_tokens]
        if pairs:
            tokens, index = (torch.tensor(v, dtype=torch.int64, device=out.device) for v in zip(*pairs))
            out[tokens] = seq.reshape(-1)[index].to(torch.int32)
    if built.prefill is not None:
        for chunk in built.prefill.chunks:
            out[chunk.token_start : chunk.token_end].copy_(chunk.cu_seqlen_ke - chunk.cu_seqlen_ks)
    return out


@dataclass
class VllmSparseMLAMetadata(SparseMLAMetadata):
    vllm: Any = None  # (the indexer's metadata, the sparse MLA builder's) for this step


class VllmSparseMLABuilder(SparseMLAMetadataBuilder):
    """orch's persistent buffers and split (the harness's), their per-token values vLLM's."""

    def __init__(self, config: AttentionConfig):
        from vllm.config import set_current_vllm_config
        from vllm.v1.kv_cache_interface import MLAAttentionSpec

        super().__init__(config)
        loaded, why = load_sparse()
        if loaded is None:
            raise RuntimeError(why)
        self.vllm_config = vllm_context(config)
        m = MLADims.of(config)
        device = torch.device(config.device)
        mla_spec = MLAAttentionSpec(block_size=config.block_size, num_kv_heads=1, head_size=m.row, dtype=config.dtype)
        index_spec = MLAAttentionSpec(
            block_size=config.block_size, num_kv_heads=1, head_size=self.index.index_head_dim, dtype=config.dtype
        )
        with set_current_vllm_config(self.vllm_config):
            self.vllm_indexer = loaded[0](
                index_spec, [INDEXER_LAYER], self.vllm_config, device, block_table_width=config.max_blocks_per_seq
            )
            self.vllm_sparse = loaded[1](mla_spec, [LAYER], self.vllm_config, device)

    def _common(self, md: SparseMLAMetadata) -> Any:
        from vllm.v1.attention.backend import CommonAttentionMetadata

        rows = md.num_padded_reqs
        return CommonAttentionMetadata(
            query_start_loc=md.query_start_loc,
            query_start_loc_cpu=md.query_start_loc.to("cpu", copy=True),
            seq_lens=md.seq_lens,
            num_reqs=rows,
            num_actual_tokens=md.num_padded_tokens,
            max_query_len=md.max_query_len,
            max_seq_len=md.max_seq_len,
            block_table_tensor=md.block_table,
            slot_mapping=md.slot_mapping,
            seq_lens_cpu_upper_bound=md.seq_lens.to("cpu", copy=True),
        )

    def _write(
        self,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        block_table: torch.Tensor,
        slot_mapping: torch.Tensor,
        padded_tokens: int,
        padded_reqs: int,
        for_capture: bool,
    ) -> VllmSparseMLAMetadata:
        from vllm.config import set_current_vllm_config

        md = super()._write(query_lens, seq_lens, block_table, slot_mapping, padded_tokens, padded_reqs, for_capture)
        common = self._common(md)
        with set_current_vllm_config(self.vllm_config):
            if for_capture:
                indexed = self.vllm_indexer.build_for_cudagraph_capture(common)
                sparse = self.vllm_sparse.build_for_cudagraph_capture(common)
            else:
                indexed = self.vllm_indexer.build(0, common)
                sparse = self.vllm_sparse.build(0, common)
        n = md.num_padded_tokens
        copy_into(self.token_seq_lens[:n], indexer_token_lens(indexed, common.query_start_loc_cpu, n))
        copy_into(self.req_id_per_token[:n], sparse.req_id_per_token[:n])
        out = VllmSparseMLAMetadata(**vars(md), vllm=(indexed, sparse))
        self.last = out
        return out


def emulated() -> tuple[str, ...]:
    from backend.adapters.vllm import sparse_standins

    kernels = ("indexer scores, top-k, sparse MLA (orch's torch)",)
    if on_gpu():
        return kernels
    return (
        sparse_standins.TOKEN_TO_REQ,
        sparse_standins.PREFILL_CHUNK,
        sparse_standins.UNIFORM_DECODE,
        sparse_standins.COMPUTE_UNITS,
    ) + kernels


@functools.lru_cache(maxsize=1)
def make_sparse_backend() -> type[SparseMLABackend]:
    loaded, why = load_sparse()
    level = getattr(loaded[1], "_cudagraph_support", None) if loaded else None
    support = AttentionCGSupport[level.name] if level is not None else AttentionCGSupport.NEVER

    @classmethod  # type: ignore[misc]
    def unavailable_reason(klass: type, device: torch.device) -> str | None:
        if why:
            return why
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            return "unavailable: no CUDA/ROCm device visible"
        return None

    @classmethod  # type: ignore[misc]
    def unsupported_reasons(klass: type, config: AttentionConfig) -> list[str]:
        reasons = SparseMLABackend.unsupported_reasons.__func__(klass, config)  # type: ignore[attr-defined]
        return [KV_REASONS.get(config.kv_cache_dtype, r) if r.startswith("kv_cache_dtype") else r for r in reasons]

    attrs = {
        "name": f"vllm:{NAME}",
        "cudagraph_support": support,
        "supported_dtypes": (torch.bfloat16,),  # FlashMLASparseBackend.supported_dtypes
        "supported_kv_cache_dtypes": ("auto",),
        "unsupported_reasons": unsupported_reasons,
        "builder_cls": VllmSparseMLABuilder,
        "impl_cls": TorchSparseMLAImpl,
        "unavailable_reason": unavailable_reason,
        "kernels": KERNELS,
        "emulated": staticmethod(emulated),
        "__doc__": "vLLM's sparse builders run in place for the mla_sparse family (backend/adapters/vllm/mla_sparse.py).",
    }
    return types.new_class(f"Vllm_{NAME}", (SparseMLABackend,), {}, lambda ns: ns.update(attrs))


@functools.lru_cache(maxsize=1)
def make_rocm_sparse_backend() -> type[SparseMLABackend]:
    """vllm:ROCM_AITER_MLA_SPARSE: a class whose every case skips with the reason it cannot run."""
    attrs = {
        "name": "vllm:ROCM_AITER_MLA_SPARSE",
        "cudagraph_support": AttentionCGSupport.UNIFORM_BATCH,
        "unavailable_reason": classmethod(lambda klass, device: ROCM_REASON),
    }
    return types.new_class("Vllm_ROCM_AITER_MLA_SPARSE", (SparseMLABackend,), {}, lambda ns: ns.update(attrs))
