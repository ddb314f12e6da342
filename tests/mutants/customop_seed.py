"""Bug class: the seed bug (seed_aiter_fa, vLLM 0.10.2 ROCM_AITER_FA, #22721) inside a
torch.library custom op, the form vLLM ships attention in.

vLLM's attention layer calls one custom op (`unified_attention_with_output`) with its tensors and
its layer name; the op body finds the step's metadata in the forward context, a host global the
model runner sets before every step, outside any graph. Here the builder publishes each step's
metadata in `_FORWARD_CONTEXT` (build and build_for_capture), and the op body runs the seed's
forward on it: a Python branch on host `max_query_len > 1`, and on the prefill branch the
per-step `cu_seq_lens` tensor.

A real graph runs the body once, at capture: every FULL mixed graph (N > 1 tokens, captured with
host max_query_len = N) holds the capture-time `cu_seq_lens`, so its replays get the prefill rows
wrong: red in FULL on mixed batches, exactly where the plain seed is (decode batches replayed
through a mixed graph take the decode kernel and are right); green in NONE/PIECEWISE (attention eager) and in the split modes (decode graphs take the
decode branch on persistent buffers, mixed batches run attention eagerly). An emulation that
recorded the op as one opaque call would re-run the body at replay with the live forward context,
read the step's fresh `cu_seq_lens`, and pass it: a silent green (tests/checker/test_mutants.py
`test_customop_seed_needs_the_body_recorded` shows that with such a recorder).

`ControlBackend` is the correct `torch` impl through the same op and forward context: green
everywhere, so the FULL reds above come from the seed's branch, not from the op path.
"""

from __future__ import annotations

import torch

from backend.providers.torch_backend import TorchBackend, TorchImpl
from tests.mutants.seed_aiter_fa import Backend as SeedBackend
from tests.mutants.seed_aiter_fa import SeedBuilder, SeedImpl

# vLLM's forward context (set per step by the model runner) and static forward context (layer
# name -> layer): what the op body reads instead of taking the metadata as an argument.
_FORWARD_CONTEXT: dict[str, object] = {"metadata": None}
_LAYERS: dict[str, _ViaOp] = {}


@torch.library.custom_op("orch_mutant::attention_via_context", mutates_args=("kv_cache", "output"))
def _attention_via_context(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    output: torch.Tensor,
    layer_name: str,
) -> None:
    impl = _LAYERS[layer_name]
    metadata = _FORWARD_CONTEXT["metadata"]  # host state: frozen by a graph, live for an opaque replay
    impl.body(query, key, value, kv_cache, metadata, k_scale, v_scale, output)


class ForwardContextBuilder(SeedBuilder):
    def build(self, batch, num_padded_tokens=None, num_padded_reqs=None):
        _FORWARD_CONTEXT["metadata"] = md = super().build(batch, num_padded_tokens, num_padded_reqs)
        return md

    def build_for_capture(self, num_tokens, uniform_query_len=0, style="v2"):
        _FORWARD_CONTEXT["metadata"] = md = super().build_for_capture(num_tokens, uniform_query_len, style)
        return md


class _ViaOp:
    """The layer side: passes tensors and its name to the op, not the metadata argument."""

    def __init__(self, config):
        super().__init__(config)
        self.layer_name = f"attention.{type(self).__name__}.{id(self)}"
        _LAYERS[self.layer_name] = self

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        torch.ops.orch_mutant.attention_via_context(
            query, key, value, kv_cache, k_scale, v_scale, output, self.layer_name
        )
        return output


class CustomOpSeedImpl(_ViaOp, SeedImpl):
    def body(self, *args):
        SeedImpl.forward(self, *args)  # the seed's host branch and per-step cu_seq_lens


class ControlImpl(_ViaOp, TorchImpl):
    def body(self, *args):
        TorchImpl.forward(self, *args)


class Backend(SeedBackend):
    name = "mutant-customop-seed"
    builder_cls = ForwardContextBuilder
    impl_cls = CustomOpSeedImpl


class ControlBackend(TorchBackend):
    name = "customop-torch-control"
    builder_cls = ForwardContextBuilder
    impl_cls = ControlImpl
