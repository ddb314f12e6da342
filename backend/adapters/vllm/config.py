"""vLLM's config for one rank's AttentionConfig, built offline the way vLLM's own
tests/v1/attention/utils.py builds it, shared by both interfaces: a config.json for a Llama-shaped
model of our heads (no hub, no tokenizer), a registered test architecture, and the VllmConfig
around them. tp = 1 in vLLM's view: our config already holds one rank's heads (the tp split, the
all-reduce and the gang are the test model's, DESIGN.md §5). Building one takes ~10 s once per
process and shape; the interfaces cache it."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from typing import Any

import torch

from backend.attention.interface import AttentionConfig

# Our kv dtype names -> vLLM's CacheDType.
KV_DTYPES = {"auto": "auto", "fp8": "fp8"}

# The architecture named in config.json. vLLM inspects a lazily registered model class (its Llama)
# in a *subprocess* (`_run_in_subprocess`), which on a CUDA machine with the Python-only wheel
# does not have our vllm._C_stable_libtorch stub and fails ("Model architectures
# ['LlamaForCausalLM'] failed to be inspected", seen on the H200). A class registered as a class is
# inspected in this process; nothing builds it (the test model is ours), it only answers vLLM's
# interface checks (a text-generation model: vllm_config kw, embed_input_ids (0.33+) /
# get_input_embeddings (0.10/0.11), forward with input_ids and positions, compute_logits).
TEST_ARCH = "OrchAttentionTestForCausalLM"


def model_dir(config: AttentionConfig) -> str:
    """A directory with a config.json for a Llama-shaped model of our (per-rank) heads: what
    ModelConfig reads instead of the hub. Written once per shape."""
    heads, kv_heads, d = config.num_heads, config.num_kv_heads, config.head_size
    key = (
        f"orch-vllm-model-h{heads}-kv{kv_heads}-d{d}-l{config.max_model_len}-{str(config.dtype).removeprefix('torch.')}"
    )
    path = os.path.join(tempfile.gettempdir(), key)
    os.makedirs(path, exist_ok=True)
    doc = {
        "architectures": [TEST_ARCH],
        "model_type": "llama",
        "hidden_size": heads * d,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": d,
        "num_hidden_layers": 1,
        "intermediate_size": 2 * heads * d,
        "vocab_size": 256,
        "max_position_embeddings": config.max_model_len,
        "torch_dtype": str(config.dtype).removeprefix("torch."),
    }
    target = os.path.join(path, "config.json")
    tmp = f"{target}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, target)
    return path


@functools.lru_cache(maxsize=1)
def register_test_arch() -> None:
    from vllm.model_executor.models import ModelRegistry

    class OrchAttentionTestForCausalLM(torch.nn.Module):
        def __init__(self, *, vllm_config=None, prefix: str = ""):
            super().__init__()

        def embed_input_ids(self, input_ids):  # 0.33/0.34
            raise NotImplementedError("orch's test model is not built by vLLM")

        def get_input_embeddings(self, input_ids):  # 0.10/0.11
            raise NotImplementedError("orch's test model is not built by vLLM")

        def forward(self, input_ids, positions, **kwargs):
            raise NotImplementedError("orch's test model is not built by vLLM")

        def compute_logits(self, hidden_states):
            raise NotImplementedError("orch's test model is not built by vLLM")

    ModelRegistry.register_model(TEST_ARCH, OrchAttentionTestForCausalLM)


def speculative_config(k: int, model, parallel):
    """The case's k as vLLM's speculative_config: what its builders size by (TRITON_ATTN's 3D
    split-KV scratch holds max_num_seqs x (1 + k) query rows; spec-as-decode builders set their
    reorder threshold to max_decode_query_len = 1 + k). n-gram drafting: the method that needs
    no draft model, and adds no drafting slots. None for k = 0, as in an engine without it."""
    if k <= 0:
        return None
    from vllm.config import SpeculativeConfig

    return SpeculativeConfig(
        method="ngram",
        num_speculative_tokens=k,
        prompt_lookup_max=k + 1,
        prompt_lookup_min=1,
        target_model_config=model,
        target_parallel_config=parallel,
    )


def full_graphs_config(config: AttentionConfig, **kwargs: Any) -> Any:
    """build_vllm_config for a builder that stages persistent buffers only under full graphs (GDN's,
    the sparse MLA ones): FULL_AND_PIECEWISE up to the case's largest capture size, its k, a
    decoder-only scheduler; `kwargs` as build_vllm_config takes them."""
    return build_vllm_config(
        config,
        scheduler_kwargs={"is_encoder_decoder": False},
        spec_tokens=config.spec_tokens,
        compilation_kwargs={
            "cudagraph_mode": "FULL_AND_PIECEWISE",
            "max_cudagraph_capture_size": config.max_capture_size or None,
        },
        **kwargs,
    )


def build_vllm_config(
    config: AttentionConfig,
    *,
    model_kwargs: dict[str, Any] | None = None,
    scheduler_kwargs: dict[str, Any] | None = None,
    spec_tokens: int = 0,
    compilation_kwargs: dict[str, Any] | None = None,
    additional_config: dict[str, Any] | None = None,
    model_path: str | None = None,
) -> Any:
    """The VllmConfig vLLM's builder and Impl read for one rank's config. `model_kwargs` and
    `scheduler_kwargs` are what one interface's release needs beyond the common ones;
    `compilation_kwargs` replace the cudagraph_mode NONE default (GDN's builder stages its
    persistent buffers only when the engine has full graphs); `additional_config` is vLLM's;
    `model_path` a directory with another family's config.json (default: model_dir's Llama)."""
    from vllm.config import (
        CacheConfig,
        CompilationConfig,
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    register_test_arch()
    d = model_path or model_dir(config)
    model = ModelConfig(
        model=d,
        tokenizer=d,
        skip_tokenizer_init=True,
        dtype=config.dtype,
        seed=0,
        max_model_len=config.max_model_len,
        **(model_kwargs or {}),
    )
    cache = CacheConfig(block_size=config.block_size, cache_dtype=KV_DTYPES[config.kv_cache_dtype])
    cache.num_gpu_blocks = config.num_blocks
    cache.num_cpu_blocks = 0
    scheduler = SchedulerConfig(
        max_num_seqs=config.max_num_seqs,
        max_model_len=config.max_model_len,
        max_num_batched_tokens=max(config.max_num_tokens, config.max_model_len),
        **(scheduler_kwargs or {}),
    )
    parallel = ParallelConfig(tensor_parallel_size=1)
    # cudagraph_mode NONE: vLLM's engine would capture; here our session captures (the mode is a
    # case axis, not a builder setting). Builders read it only for custom mask mods / sliding
    # windows, which our model does not use.
    return VllmConfig(
        model_config=model,
        cache_config=cache,
        parallel_config=parallel,
        scheduler_config=scheduler,
        device_config=DeviceConfig(device=config.device.type),
        compilation_config=CompilationConfig(**(compilation_kwargs or {"cudagraph_mode": "NONE"})),
        speculative_config=speculative_config(spec_tokens, model, parallel),
        **({"additional_config": additional_config} if additional_config else {}),
    )
