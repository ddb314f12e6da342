"""The hybrid_gdn family through vLLM's own GDN backend: `vllm:GDN_ATTN` (current interface,
0.33/0.34; vllm/v1/attention/backends/gdn_attn.py).

What runs as vLLM's:
- GDNAttentionMetadataBuilder, one per state group: its decode / spec / prefill split, its
  persistent buffers sized min(max_num_seqs * (1 + k), max capture size) and their padding (a
  padded request's state index is vLLM's null block 0), its decode-only capture (its assertion),
  handed orch's shared common metadata as the V2 runner hands it (padded counts, the accepted and
  draft counts beside it, is_prefilling for rows without context);
- on a CUDA GPU, the layer's GDN core: QwenGatedDeltaNetAttention._forward_core itself, on a view
  that holds the layer's attributes (the Triton causal_conv1d_update / causal_conv1d_fn,
  fused_sigmoid_gating_delta_rule_update, chunk_gated_delta_rule, their padding rules), on orch's
  state pages (vLLM's MambaSpec page, conv layout SD, the state [Hv, Dv, Dk]).
What is orch's, and every result says so (versions["kernels"], versions["emulated"]): the
attention layers (the family's torch attention), the projections and the gated norm (the family's
layer), and off a CUDA GPU the GDN core (vLLM's is Triton, its CPU ops are compiled C++ a
Python-only wheel lacks): orch's torch kernels (backend/providers/gdn_ops.py) run on vLLM's
metadata with vLLM's padding (an index at or below 0 is padding), so vLLM's builder is under test
on CPU, under the graph emulation.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import types
from dataclasses import dataclass
from typing import Any

import torch

from backend.attention.gdn import GDNDims, GDNImpl, HybridGDNBackend, HybridImpl
from backend.attention.interface import AttentionCGSupport, AttentionConfig
from backend.attention.swa import SWAMetadataBuilder
from backend.providers import gdn_ops
from backend.providers.torch_swa import TorchSWAImpl

NULL_BLOCK_ID = 0  # vllm/v1/attention/backends/utils.py: a padded request's state index
LAYER = "model.layers.0.linear_attn"
KERNELS_GPU = "GDN builder and core (Triton): vLLM's; attention layers, projections, gated norm: orch's"
KERNELS_CPU = "GDN builder: vLLM's; GDN core: orch's torch kernels (vLLM's are Triton); attention: orch's"


@functools.lru_cache(maxsize=1)
def load_gdn():
    """(vLLM's GDN builder class, its Qwen GDN layer class), or (None, why not here)."""
    from backend.adapters.vllm import current_interface, errors, fixups, native

    iface, why = current_interface()
    if iface is None:
        return None, why
    if iface.name != "current":
        return None, "unavailable: vllm:GDN_ATTN is bridged for vLLM's current interface (0.33/0.34) only"
    # The GDN layer module imports the MoE configs, which log an error (not a failure) when a
    # triton_kernels package of another Triton is installed: doctor and bad-input lines stay one line.
    logging.getLogger("vllm.model_executor.layers.fused_moe.config").setLevel(logging.CRITICAL)
    try:
        native.stub_platform_native()
        native.stub_capability_queries()  # the layer's quantization configs ask them at import
        with errors.quiet_vllm_import():
            from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
            from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder
    except Exception as exc:  # noqa: BLE001 - an import that fails for any reason is "unavailable"
        return None, errors.backend_import_failed("GDN_ATTN", exc)
    fixups.pin_memory_off()
    return (GDNAttentionMetadataBuilder, QwenGatedDeltaNetAttention), None


def on_gpu() -> bool:
    return torch.cuda.is_available()


@functools.lru_cache(maxsize=8)
def vllm_context(config: AttentionConfig):
    """The VllmConfig (full graphs, Triton's GDN prefill, the case's k) and the state group's
    MambaSpec for one rank's config."""
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import MambaSpec

    from backend.adapters.vllm.config import full_graphs_config

    vc = full_graphs_config(config, additional_config={"gdn_prefill_backend": "triton"})
    d = GDNDims.of(config)
    spec = MambaSpec(
        block_size=config.block_size,
        shapes=((d.conv_width, d.conv_dim), (d.num_v_heads, d.head_v_dim, d.head_k_dim)),
        dtypes=(config.dtype, config.dtype),
        mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
        num_speculative_blocks=config.spec_tokens,
    )
    return vc, spec


@dataclass
class VllmGDNMetadata:
    """vLLM's GDNAttentionMetadata, with what orch's checks and kernels read beside it."""

    vllm: Any
    num_reqs: int
    num_padded_reqs: int
    pad_slot: int = NULL_BLOCK_ID

    def __getattr__(self, name):  # vLLM's fields (num_decodes, spec_state_indices_tensor, ...)
        return getattr(self.__dict__["vllm"], name)


class VllmGDNBuilder:
    """vLLM's GDN builder for one state group, over orch's common metadata (groups.py)."""

    def __init__(self, config: AttentionConfig):
        from vllm.config import set_current_vllm_config

        loaded, why = load_gdn()
        if loaded is None:
            raise RuntimeError(why)
        self.config = config
        self.vllm_config, spec = vllm_context(config)
        with set_current_vllm_config(self.vllm_config):
            self.vllm_builder = loaded[0](spec, [LAYER], self.vllm_config, config.device)
        # orch's session captures full graphs whatever vLLM's platform resolved its mode to (on a
        # CPU it says NONE): the builder stages its persistent buffers as in an engine with them.
        self.vllm_builder.use_full_cuda_graph = True

    def _common(self, cm, capture: bool):
        from vllm.v1.attention.backend import CommonAttentionMetadata

        n, rows = cm.num_reqs, cm.num_padded_reqs
        q = cm.query_start_loc_cpu[1 : rows + 1] - cm.query_start_loc_cpu[:rows]
        # V2's is_prefilling: only its "no prior state" test reads it (rows without context)
        prefilling = None if capture else (cm.seq_lens_cpu[:rows] <= q) & (torch.arange(rows) < n)
        return CommonAttentionMetadata(
            query_start_loc=cm.query_start_loc,
            query_start_loc_cpu=cm.query_start_loc_cpu,
            seq_lens=cm.seq_lens,
            num_reqs=rows,
            num_actual_tokens=cm.num_padded_tokens,
            max_query_len=cm.max_query_len,
            max_seq_len=cm.max_seq_len,
            block_table_tensor=cm.block_table_tensor,
            slot_mapping=cm.slot_mapping,
            seq_lens_cpu_upper_bound=cm.seq_lens_cpu,
            is_prefilling=prefilling,
        )

    def build(self, cm) -> VllmGDNMetadata:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config):
            md = self.vllm_builder.build(
                0,
                self._common(cm, False),
                num_accepted_tokens=cm.num_accepted_tokens,
                num_decode_draft_tokens_cpu=cm.num_draft_tokens_cpu,
            )
        return VllmGDNMetadata(md, cm.num_reqs, cm.num_padded_reqs)

    def build_for_capture(self, cm) -> VllmGDNMetadata:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config):
            md = self.vllm_builder.build_for_cudagraph_capture(self._common(cm, True))
        return VllmGDNMetadata(md, cm.num_reqs, cm.num_padded_reqs)


def layer_view(layer_cls, config: AttentionConfig, page, layout, weights: dict) -> types.SimpleNamespace:
    """What QwenGatedDeltaNetAttention._forward_core reads of its layer, for one rank (tp 1 in
    vLLM's view: the rank's heads), its methods bound to the view (tests/adapters check every
    `self.` attribute of those methods is here)."""
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import ChunkGatedDeltaRule

    d = GDNDims.of(config)
    view = types.SimpleNamespace(
        prefix=LAYER,
        kv_cache=(layout.conv(page), layout.state(page)),
        conv1d=types.SimpleNamespace(weight=weights["conv_w"].view(d.conv_dim, 1, d.conv_kernel), bias=None),
        activation="silu",
        A_log=weights["A_log"],
        dt_bias=weights["dt_bias"],
        tp_size=1,
        num_k_heads=d.num_k_heads,
        num_v_heads=d.num_v_heads,
        head_k_dim=d.head_k_dim,
        head_v_dim=d.head_v_dim,
        key_dim=d.num_k_heads * d.head_k_dim,
        value_dim=d.num_v_heads * d.head_v_dim,
        gdn_prefill_backend="triton",
        enable_packed_recurrent_decode=False,
        chunk_gated_delta_rule=ChunkGatedDeltaRule(),
    )
    # its methods the core calls on self (the packed decode and FlashInfer's prefill: off here)
    for name in (
        "rearrange_mixed_qkv",
        "_warmup_prefill_kernels",
        "_forward_core_decode_non_spec",
        "_forward_flashinfer_prefill",
    ):
        setattr(view, name, types.MethodType(getattr(layer_cls, name), view))
    return view


def forward_core_attributes(layer_cls) -> set[str]:
    """Every `self.X` that _forward_core and the methods it calls on self read (the source, not a
    run: the kernels need a GPU)."""
    names = set()
    for method in ("_forward_core", "rearrange_mixed_qkv"):
        names |= set(re.findall(r"self\.([A-Za-z_]\w*)", inspect.getsource(getattr(layer_cls, method))))
    return names


class VllmGDNImpl(GDNImpl):
    def __init__(self, config: AttentionConfig):
        super().__init__(config)
        loaded, why = load_gdn()
        if loaded is None:
            raise RuntimeError(why)
        self.layer_cls = loaded[1]
        self.vllm_config, _ = vllm_context(config)
        self.views: dict = {}

    def forward(self, mixed_qkv, b, a, page, layout, md, weights, out):
        if not on_gpu():  # orch's torch kernels on vLLM's metadata (vLLM's padding: at or below 0)
            return gdn_ops.gdn_core(mixed_qkv, b, a, page, layout, md, weights, out, self.dims)
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import set_forward_context

        key = (page.data_ptr(), weights["conv_w"].data_ptr())
        if key not in self.views:
            with set_current_vllm_config(self.vllm_config):
                self.views[key] = layer_view(self.layer_cls, self.config, page, layout, weights)
        view = self.views[key]
        with set_forward_context({LAYER: md.vllm}, self.vllm_config):
            self.layer_cls._forward_core(view, mixed_qkv, b, a, out)
        return out


class VllmHybridImpl(HybridImpl):
    attention_cls = TorchSWAImpl
    gdn_cls = VllmGDNImpl


@functools.lru_cache(maxsize=1)
def make_gdn_backend() -> type[HybridGDNBackend]:
    loaded, why = load_gdn()
    level = getattr(loaded[0], "_cudagraph_support", None) if loaded else None
    support = AttentionCGSupport[level.name] if level is not None else AttentionCGSupport.NEVER

    @classmethod
    def unavailable_reason(klass, device: torch.device) -> str | None:
        if why:
            return why
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            return "unavailable: no CUDA/ROCm device visible"
        return None

    emulated = ("GDN core: orch's torch kernels (vLLM's are Triton: a GPU)",) if not on_gpu() else ()
    attrs = {
        "name": "vllm:GDN_ATTN",
        "cudagraph_support": support,
        "supported_dtypes": (torch.bfloat16, torch.float16),
        "gdn_builder_cls": VllmGDNBuilder,
        "attention_builder_cls": SWAMetadataBuilder,
        "impl_cls": VllmHybridImpl,
        "unavailable_reason": unavailable_reason,
        "kernels": KERNELS_GPU if on_gpu() else KERNELS_CPU,
        "emulated": staticmethod(lambda: emulated + ("attention layers (orch's torch)",)),
        "__doc__": "vLLM's GDN backend run in place for the hybrid_gdn family (backend/adapters/vllm/gdn.py).",
    }
    return types.new_class("Vllm_GDN_ATTN", (HybridGDNBackend,), {}, lambda ns: ns.update(attrs))
