"""Our four roles around one vLLM backend, shared by both interfaces: the builder (our persistent
buffers handed to vLLM's builder), the Impl (vLLM's Impl with a layer object), and the backend class
that states vLLM's own support level, dtypes and kv dtypes. Everything that differs between vLLM
releases is a method of the release's `Interface` (current.py, old.py); everything here is the same
for both."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from backend.adapters.vllm import metadata as meta
from backend.adapters.vllm.native import EMULATED, ensure_cache_ops
from backend.adapters.vllm.query import query_quantizer
from backend.attention.builder import PersistentMetadataBuilder
from backend.attention.interface import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionConfig,
    AttentionImpl,
    AttentionMetadataBuilder,
    BatchDescription,
)

LAYER_NAMES = ["model.layers.0.self_attn.attn"]


@dataclass(frozen=True)
class VllmContext:
    vllm_config: Any
    kv_cache_spec: Any
    layout: Any = None  # KVCacheLayout (current interface); None where vLLM's cache is ours (old)


class Interface:
    """One vLLM backend interface (a range of releases): how a backend is found and what it
    declares, the config and cache it is built with, and how a step is handed to it. Subclasses:
    current.CurrentInterface (0.33/0.34), old.OldInterface (0.10.2-0.11)."""

    name: ClassVar[str] = ""
    range: ClassVar[tuple[str, str]] = ("", "")
    cpu_backends: ClassVar[tuple[str, ...]] = ()  # names whose kernels run on a CPU torch here
    sizes_by_spec_tokens: ClassVar[bool] = False

    def load(self, name: str) -> tuple[Any, str | None]:
        """(vLLM's backend class, None), or (None, why it cannot be used here)."""
        raise NotImplementedError

    def names(self) -> tuple[str, ...] | None:
        """The backend names of this release's registry, as `vllm:NAME` spells them; None when
        the registry does not import here (names.py then checks against the names orch knows)."""
        raise NotImplementedError

    def support(self, name: str, cls) -> tuple[AttentionCGSupport, str | None]:
        """vLLM's own support level for the class, or (NEVER, why it could not be read)."""
        raise NotImplementedError

    def context(self, name: str, config: AttentionConfig) -> VllmContext:
        raise NotImplementedError

    def allocate_kv_cache(self, name: str, config: AttentionConfig) -> torch.Tensor:
        raise NotImplementedError

    def common(self, md) -> Any:
        """Our metadata as vLLM's CommonAttentionMetadata, as this release's model runner hands it."""
        raise NotImplementedError

    def query_declarer(self, cls, impl) -> Any:
        """The object whose `supports_quant_query_input` this release's Attention layer reads."""
        return impl

    def run(self, wrapper: VllmImpl, query, key, value, kv_cache, metadata, output) -> torch.Tensor:
        """One attention call the way this release's layer makes it."""
        raise NotImplementedError

    def kv_dtypes(self, cls) -> tuple[str, ...] | None:
        """vLLM's declared cache dtypes (vLLM's names), or None when the class declares none."""
        return getattr(cls, "supported_kv_cache_dtypes", None) or None

    def dtypes(self, cls) -> tuple[torch.dtype, ...]:
        return tuple(cls.supported_dtypes)

    def unsupported(self, name: str, cls, config: AttentionConfig) -> list[str]:
        return []

    def platform_reason(self, name: str, device: torch.device) -> str | None:
        """Why the backend's kernels cannot run on `device` here (None: they can)."""
        return None

    def kernels(self, name: str) -> str | None:
        """ "emulated" where the kernels that run are orch's stand-ins for vLLM's (results say so)."""
        return None

    def backend_and_context(self, name: str, config: AttentionConfig) -> tuple[Any, VllmContext]:
        cls, why = self.load(name)
        if cls is None:
            raise RuntimeError(why)
        return cls, self.context(name, config)


def interface_of(klass) -> Interface:
    """The class's interface, or the release's (a subclass that only names its backend, like the
    test suite's broken twins, runs on whichever vLLM is importable)."""
    if klass.interface is not None:
        return klass.interface
    from backend.adapters.vllm import current_interface

    iface, why = current_interface()
    if iface is None:
        raise RuntimeError(why)
    return iface


class VllmBuilder(AttentionMetadataBuilder):
    backend_name: ClassVar[str] = ""
    interface: ClassVar[Interface | None] = None

    def __init__(self, config: AttentionConfig):
        super().__init__(config)
        from vllm.config import set_current_vllm_config

        self.iface = interface_of(type(self))
        cls, self.ctx = self.iface.backend_and_context(self.backend_name, config)
        self.common = PersistentMetadataBuilder(config)
        with set_current_vllm_config(self.ctx.vllm_config):
            self.vllm_builder = cls.get_builder_cls()(
                self.ctx.kv_cache_spec, LAYER_NAMES, self.ctx.vllm_config, config.device
            )

    def _wrap(self, md, capture: bool) -> meta.VllmMetadata:
        from vllm.config import set_current_vllm_config

        cm = self.iface.common(md)
        with set_current_vllm_config(self.ctx.vllm_config):
            if capture:
                built = self.vllm_builder.build_for_cudagraph_capture(cm)
            else:
                built = self.vllm_builder.build(common_prefix_len=0, common_attn_metadata=cm)
        return meta.wrap(md, built)

    def build(
        self, batch: BatchDescription, num_padded_tokens: int | None = None, num_padded_reqs: int | None = None
    ) -> meta.VllmMetadata:
        return self._wrap(self.common.build(batch, num_padded_tokens, num_padded_reqs), capture=False)

    def build_for_capture(self, num_tokens: int, uniform_query_len: int = 0, style: str = "v2") -> meta.VllmMetadata:
        return self._wrap(self.common.build_for_capture(num_tokens, uniform_query_len, style), capture=True)


class VllmImpl(AttentionImpl):
    backend_name: ClassVar[str] = ""
    interface: ClassVar[Interface | None] = None

    def __init__(self, config: AttentionConfig):
        super().__init__(config)
        from vllm.config import set_current_vllm_config

        from backend.adapters.vllm.config import KV_DTYPES

        self.iface = interface_of(type(self))
        cls, self.ctx = self.iface.backend_and_context(self.backend_name, config)
        self.backend = cls
        self.emulated_ops = ensure_cache_ops()
        kv = KV_DTYPES[config.kv_cache_dtype]
        with set_current_vllm_config(self.ctx.vllm_config):
            self.impl = cls.get_impl_cls()(
                num_heads=config.num_heads,
                head_size=config.head_size,
                scale=config.scale,
                num_kv_heads=config.num_kv_heads,
                alibi_slopes=None,
                sliding_window=None,
                kv_cache_dtype=kv,
                logits_soft_cap=None,
            )
        self.layer = meta.Layer()
        self.includes_update = bool(getattr(cls, "forward_includes_kv_cache_update", True))
        self.query_quant = query_quantizer(self.iface.query_declarer(cls, self.impl), kv, self.ctx.vllm_config)

    def query_fp8_scale(self) -> float | None:
        """The layer's static q scale when it quantises the query (the checker's reference rounds
        its query the same way), else None. The layer's host copy, as vLLM keeps it: no device read."""
        return self.layer._q_scale_float if self.query_quant is not None else None

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        self.layer.bind(k_scale, v_scale)
        return self.iface.run(self, query, key, value, kv_cache, metadata, output)


def make_backend_class(name: str, iface: Interface | None, load_why: str | None) -> type[AttentionBackend]:
    """Our backend class for vLLM's backend `name` under `iface`. Always a class: when vLLM or the
    backend cannot be used here, unavailable_reason says why (`load_why`, or the interface's)."""
    cls, why = (None, load_why) if iface is None else iface.load(name)
    support = AttentionCGSupport.NEVER
    if cls is not None:
        support, why = iface.support(name, cls)
        if why:
            cls = None
    declared = iface.kv_dtypes(cls) if cls is not None else None
    from backend.adapters.vllm.config import KV_DTYPES

    # Unusable here: every kv dtype, so a case's skip reason is why vLLM is unusable, not a
    # dtype it may well support.
    kv_dtypes = tuple(ours for ours, theirs in KV_DTYPES.items() if declared is None or theirs in declared)
    dtypes = iface.dtypes(cls) if cls is not None else (torch.bfloat16, torch.float16, torch.float32)
    builder = type(f"{name}Builder", (VllmBuilder,), {"backend_name": name, "interface": iface})
    impl = type(f"{name}Impl", (VllmImpl,), {"backend_name": name, "interface": iface})

    @classmethod
    def unavailable_reason(klass, device: torch.device) -> str | None:
        if why:
            return why
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            return "unavailable: no CUDA/ROCm device visible"
        return iface.platform_reason(name, device)

    @classmethod
    def unsupported_reasons(klass, config: AttentionConfig) -> list[str]:
        reasons = AttentionBackend.unsupported_reasons.__func__(klass, config)
        if cls is not None:
            reasons += iface.unsupported(name, cls, config)
        return reasons

    @staticmethod
    def allocate_kv_cache(config: AttentionConfig) -> torch.Tensor:
        return iface.allocate_kv_cache(name, config)

    attrs = {
        "name": f"vllm:{name}",
        "cudagraph_support": support,
        "supported_kv_cache_dtypes": kv_dtypes,
        "supported_dtypes": dtypes,
        "builder_cls": builder,
        "impl_cls": impl,
        "vllm_backend": cls,
        "vllm_interface": iface.name if iface is not None else None,
        "unavailable_reason": unavailable_reason,
        "unsupported_reasons": unsupported_reasons,
        "allocate_kv_cache": allocate_kv_cache,
        # The session's VllmConfig carries the case's speculative_config (current interface).
        "sizes_by_spec_tokens": iface.sizes_by_spec_tokens if iface is not None else False,
        # What runs in place of vLLM's own code in this process (the result's versions say it).
        "emulated": staticmethod(lambda: tuple(EMULATED)),
        "kernels": iface.kernels(name) if cls is not None else None,
        "__doc__": f"vLLM's {name} backend, run in place (backend/adapters/vllm/).",
    }
    return types.new_class(f"Vllm_{name}", (AttentionBackend,), {}, lambda ns: ns.update(attrs))
