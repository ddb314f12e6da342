"""The swa_sinks family through vLLM's own backends (current interface, 0.33/0.34): `vllm:TRITON_ATTN`
(gpt-oss on NVIDIA) and `vllm:ROCM_AITER_UNIFIED_ATTN` (gpt-oss on MI355X) run in place, each KV-cache
group's metadata built by vLLM's own builder from orch's shared common metadata
(backend/attention/groups.py), as vLLM's runner does: the group's spec (a SlidingWindowSpec for the
hybrid window group; a FullAttentionSpec carrying the first layer's window for a merged group),
`build` / `build_for_cudagraph_capture` on a CommonAttentionMetadata whose query_start_loc(_cpu)
and seq_lens are the shared tensors themselves (so vLLM's own capture-time seq_lens.fill_(1)
happens to what every later group reads, as in vLLM). Each layer gets vLLM's Impl built with its
own window and sinks (vLLM builds one Impl per Attention layer); the KV write, query quantisation
and the call go as for the gqa family (current.py).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from backend.adapters.vllm import current
from backend.adapters.vllm.cache import as_vllm_view
from backend.adapters.vllm.config import KV_DTYPES
from backend.adapters.vllm.metadata import Layer
from backend.adapters.vllm.native import EMULATED, ensure_cache_ops
from backend.adapters.vllm.query import quantize_query, query_quantizer
from backend.adapters.vllm.roles import LAYER_NAMES
from backend.attention.interface import AttentionCGSupport, AttentionConfig
from backend.attention.kv_cache import kv_cache_torch_dtype
from backend.attention.swa import SWABackend, SWAImpl


@dataclass
class VllmSWAMetadata:
    """What the harness reads of a group's metadata, and what vLLM's builder returned."""

    num_padded_tokens: int
    num_padded_reqs: int
    slot_mapping: torch.Tensor
    vllm: Any


def _spec(config: AttentionConfig):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    common = dict(
        block_size=config.block_size,
        num_kv_heads=config.num_kv_heads,
        head_size=config.head_size,
        dtype=kv_cache_torch_dtype(config),
    )
    if config.sliding_window and config.kv_spec == "sliding_window":
        return SlidingWindowSpec(**common, sliding_window=config.sliding_window)
    return FullAttentionSpec(**common, sliding_window=config.sliding_window)


class VllmSWABuilder:
    backend_name: ClassVar[str] = ""

    def __init__(self, config: AttentionConfig):
        from vllm.config import set_current_vllm_config

        self.config = config
        cls, why = current.load(self.backend_name)
        if cls is None:
            raise RuntimeError(why)
        self.ctx = current.vllm_context(self.backend_name, dataclasses.replace(config, sliding_window=None))
        with set_current_vllm_config(self.ctx.vllm_config):
            self.vllm_builder = cls.get_builder_cls()(_spec(config), LAYER_NAMES, self.ctx.vllm_config, config.device)

    def _build(self, cm, capture: bool) -> VllmSWAMetadata:
        from vllm.config import set_current_vllm_config
        from vllm.v1.attention.backend import CommonAttentionMetadata

        # The V2 runner's counts (a FULL step: padded), the shared tensors as they are.
        vcm = CommonAttentionMetadata(
            query_start_loc=cm.query_start_loc,
            query_start_loc_cpu=cm.query_start_loc_cpu,
            seq_lens=cm.seq_lens,
            num_reqs=cm.num_padded_reqs,
            num_actual_tokens=cm.num_padded_tokens,
            max_query_len=cm.max_query_len,
            max_seq_len=cm.max_seq_len,
            block_table_tensor=cm.block_table_tensor,
            slot_mapping=cm.slot_mapping,
            seq_lens_cpu_upper_bound=cm.seq_lens_cpu,
        )
        with set_current_vllm_config(self.ctx.vllm_config):
            built = (
                self.vllm_builder.build_for_cudagraph_capture(vcm)
                if capture
                else self.vllm_builder.build(common_prefix_len=0, common_attn_metadata=vcm)
            )
        return VllmSWAMetadata(cm.num_padded_tokens, cm.num_padded_reqs, cm.slot_mapping, built)

    def build(self, cm) -> VllmSWAMetadata:
        return self._build(cm, capture=False)

    def build_for_capture(self, cm) -> VllmSWAMetadata:
        return self._build(cm, capture=True)


class VllmSWAImpl(SWAImpl):
    backend_name: ClassVar[str] = ""

    def __init__(self, config: AttentionConfig):
        super().__init__(config)
        cls, why = current.load(self.backend_name)
        if cls is None:
            raise RuntimeError(why)
        self.backend = cls
        self.ctx = current.vllm_context(self.backend_name, dataclasses.replace(config, sliding_window=None))
        self.kv = KV_DTYPES[config.kv_cache_dtype]
        self.emulated_ops = ensure_cache_ops()
        self.layer = Layer()
        self.impls: dict[tuple, Any] = {}
        self.includes_update = bool(getattr(cls, "forward_includes_kv_cache_update", True))
        self.query_quant = query_quantizer(self._impl(None, None), self.kv, self.ctx.vllm_config)

    def _impl(self, window: int | None, sinks: torch.Tensor | None):
        """vLLM's Impl for one layer kind (its window and sinks tensor), built once."""
        key = (window, None if sinks is None else sinks.data_ptr())
        if key not in self.impls:
            from vllm.config import set_current_vllm_config

            c = self.config
            with set_current_vllm_config(self.ctx.vllm_config):
                self.impls[key] = self.backend.get_impl_cls()(
                    num_heads=c.num_heads,
                    head_size=c.head_size,
                    scale=c.scale,
                    num_kv_heads=c.num_kv_heads,
                    alibi_slopes=None,
                    sliding_window=window,
                    kv_cache_dtype=self.kv,
                    logits_soft_cap=None,
                    sinks=sinks,
                )
        return self.impls[key]

    def query_fp8_scale(self) -> float | None:
        return self.layer._q_scale_float if self.query_quant is not None else None

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output, window=None, sinks=None):
        impl = self._impl(window, sinks)
        self.layer.bind(k_scale, v_scale)
        cache = as_vllm_view(kv_cache)
        t = metadata.num_padded_tokens
        if not self.includes_update:
            impl.do_kv_cache_update(self.layer, key[:t], value[:t], cache, metadata.slot_mapping)
        q = query[:t]
        if self.query_quant is not None:
            q = quantize_query(self.query_quant, q, self.layer._q_scale)
        impl.forward(self.layer, q, key[:t], value[:t], cache, metadata.vllm, output[:t])
        return output


@functools.cache
def make_swa_backend(name: str) -> type[SWABackend]:
    """Our swa_sinks backend class for vLLM's backend `name` (always a class; unavailable_reason
    says why when it cannot be used here)."""
    cls, why = current.load(name)
    support = current.support_level(cls, None) if cls is not None else AttentionCGSupport.NEVER
    # Without vLLM's class (no vllm here, or it cannot be loaded) its sinks are unknown, not absent:
    # its cases skip with unavailable_reason's line, and a matrix asking for sinks is no mistake.
    # Read as absent, `orch plan matrices/vllm-families.yaml` exited 2 on a machine without vllm.
    sinks = cls is None or bool(getattr(cls, "supports_sink", lambda: False)())
    builder = type(f"{name}SWABuilder", (VllmSWABuilder,), {"backend_name": name})
    impl = type(f"{name}SWAImpl", (VllmSWAImpl,), {"backend_name": name})

    @classmethod
    def unavailable_reason(klass, device: torch.device) -> str | None:
        from backend.adapters.vllm import current_interface

        iface, iwhy = current_interface()
        if iwhy or why:
            return iwhy or why
        if iface is not current.CURRENT:
            return f"unavailable: vllm:{name} for swa_sinks is bridged for vLLM {current.SUPPORTED_RANGE} only"
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            return "unavailable: no CUDA/ROCm device visible"
        return current.CURRENT.platform_reason(name, device)

    @staticmethod
    def allocate_kv_cache(config: AttentionConfig) -> torch.Tensor:
        from backend.adapters.vllm import cache as caches

        return caches.allocate_in_layout(
            config, current.vllm_context(name, dataclasses.replace(config, sliding_window=None)).layout
        )

    attrs = {
        "name": f"vllm:{name}",
        "cudagraph_support": support,
        "features": ("sinks",) if sinks else (),
        "supported_dtypes": tuple(cls.supported_dtypes) if cls is not None else (torch.bfloat16, torch.float16),
        "builder_cls": builder,
        "impl_cls": impl,
        "vllm_backend": cls,
        "unavailable_reason": unavailable_reason,
        "allocate_kv_cache": allocate_kv_cache,
        "sizes_by_spec_tokens": True,
        "emulated": staticmethod(lambda: tuple(EMULATED)),
        "__doc__": f"vLLM's {name} backend for the swa_sinks family (backend/adapters/vllm/swa.py).",
    }
    return types.new_class(f"Vllm_{name}_swa", (SWABackend,), {}, lambda ns: ns.update(attrs))
