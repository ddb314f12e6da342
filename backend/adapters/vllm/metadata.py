"""Our step metadata handed to vLLM's builder as its CommonAttentionMetadata, the way each model
runner hands it over, and the layer object vLLM's Impl reads scales from. Shared by both
interfaces.

Our PersistentMetadataBuilder fills the padded device buffers with vLLM's padding rules (DESIGN.md
§4, builder.py); the runners differ in the counts they pass with them:
- V2 (0.33/0.34, `v2_counts`): a FULL step is handed its padded num_reqs and num_actual_tokens.
- V1 (0.10/0.11, `v1_counts`): every step is handed its real num_reqs and num_actual_tokens, and
  views of the persistent buffers that long (gpu_model_runner._prepare_inputs); a FULL graph
  reads the capture batch's views, whose padded tail the buffers' reset keeps at the padding
  values. The capture batch (build_for_cudagraph_capture) is handed its own counts.
Host copies are real copies, also on CPU (where .cpu() would return the device buffer itself)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from backend.attention.interface import AttentionMetadata


@dataclass
class VllmMetadata(AttentionMetadata):
    vllm: Any = None  # what vLLM's builder returned for this step


def wrap(md: AttentionMetadata, built: Any) -> VllmMetadata:
    fields = {f: getattr(md, f) for f in AttentionMetadata.__dataclass_fields__}
    return VllmMetadata(**fields, vllm=built)


def host(t: torch.Tensor) -> torch.Tensor:
    return t.to("cpu", copy=True)


@dataclass(frozen=True)
class Counts:
    """What one runner hands vLLM for a step: request and token counts, and the views that long."""

    num_reqs: int
    num_tokens: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor


def v2_counts(md: AttentionMetadata) -> Counts:
    """V2 model runner: every padded request and token is in the counts."""
    return Counts(
        md.num_padded_reqs, md.num_padded_tokens, md.query_start_loc, md.seq_lens, md.block_table, md.slot_mapping
    )


def v1_counts(md: AttentionMetadata) -> Counts:
    """V1 model runner (0.10/0.11): real counts for a step, the capture batch's own for a capture."""
    n, t = (md.num_padded_reqs, md.num_padded_tokens) if md.for_capture else (md.num_reqs, md.num_actual_tokens)
    return Counts(n, t, md.query_start_loc[: n + 1], md.seq_lens[:n], md.block_table[:n], md.slot_mapping[:t])


class Layer(torch.nn.Module):
    """What vLLM's Impl reads from its Attention layer: the live scale tensors (ours, so graphs
    read their values) and their host copies. `_q_scale`/`_prob_scale` are the layer's defaults
    (vLLM's set_default_quant_scales: 0-d float32 1.0), what an engine without a checkpoint's q
    scale holds; with fp8 they become TRITON_ATTN's q_descale."""

    def __init__(self):
        super().__init__()
        self.layer_name = "model.layers.0.self_attn.attn"
        self._q_scale = torch.tensor(1.0, dtype=torch.float32)
        self._prob_scale = torch.tensor(1.0, dtype=torch.float32)
        self._q_scale_float = self._k_scale_float = self._v_scale_float = 1.0

    def bind(self, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
        self._k_scale, self._v_scale = k_scale, v_scale
        if self._q_scale.device != k_scale.device:
            self._q_scale = self._q_scale.to(k_scale.device)
            self._prob_scale = self._prob_scale.to(k_scale.device)
