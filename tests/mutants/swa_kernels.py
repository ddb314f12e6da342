"""Broken sliding-window / sink kernels (vLLM and ROCm precedents, DESIGN.md §9b):

- SinkEverySegment: the 3-D (split-KV) path adds the sink to every segment's denominator, not
  segment 0's: wrong only for batches small enough for 3-D (few requests, short queries).
- SinkScaled: the sink multiplied by the softmax scale (a sink is a logit, not a q.k).
- SinkTwice: the sink added twice to the softmax denominator.
- SinkNoExp2: a kernel whose softmax runs in exp2 (logits times log2 e) adds exp2(sink), without
  the conversion: the sink counts as sink * ln 2. Both were within the tolerance with sinks near
  N(0, 1); with sinks that carry a real share of a row's mass, red everywhere.
- WindowOffByOne: the window admits i - j <= W, one key too many.
- GroupWindow: the window read from the KV-cache group's spec, not the layer (vLLM #51756): right
  while each group holds one layer kind (hybrid), wrong for the full layers of a merged group.
- PrefillNoSinks: sinks dropped for the rows of requests with more than one query token (ROCm
  ATOM #317: sinks missing in the extend path; vLLM #26325 dropped them in cascade attention).
"""

from __future__ import annotations

import torch

from backend.providers.torch_swa import TorchSWABackend, TorchSWAImpl


class _SinkEverySegmentImpl(TorchSWAImpl):
    sink_in_every_segment = True


class SinkEverySegment(TorchSWABackend):
    name = "mutant-swa-sink-every-segment"
    impl_cls = _SinkEverySegmentImpl


class _SinkScaledImpl(TorchSWAImpl):
    sink_scaled = True


class SinkScaled(TorchSWABackend):
    name = "mutant-swa-sink-scaled"
    impl_cls = _SinkScaledImpl


class _WindowOffByOneImpl(TorchSWAImpl):
    window_off_by_one = True


class _SinkTwiceImpl(TorchSWAImpl):
    sink_twice = True


class SinkTwice(TorchSWABackend):
    name = "mutant-swa-sink-twice"
    impl_cls = _SinkTwiceImpl


class _SinkNoExp2Impl(TorchSWAImpl):
    sink_no_exp2 = True


class SinkNoExp2(TorchSWABackend):
    name = "mutant-swa-sink-no-exp2"
    impl_cls = _SinkNoExp2Impl


class WindowOffByOne(TorchSWABackend):
    name = "mutant-swa-window-off-by-one"
    impl_cls = _WindowOffByOneImpl


class _GroupWindowImpl(TorchSWAImpl):
    def layer_window(self, md, window):
        return md.sliding_window  # the group spec's window, whatever this layer's is


class GroupWindow(TorchSWABackend):
    name = "mutant-swa-group-window"
    impl_cls = _GroupWindowImpl


class _PrefillNoSinksImpl(TorchSWAImpl):
    def attend(self, query, kv_cache, md, k_scale, v_scale, output, window, sinks):
        with_sinks = super().attend(query, kv_cache, md, k_scale, v_scale, output.clone(), window, sinks)
        without = super().attend(query, kv_cache, md, k_scale, v_scale, output, window, None)
        t = md.num_padded_tokens
        from tests.mutants._common import token_query_len

        prefill = (token_query_len(md, t) > 1)[:, None, None]
        output[:t].copy_(torch.where(prefill, without[:t], with_sinks[:t]))
        return output


class PrefillNoSinks(TorchSWABackend):
    name = "mutant-swa-prefill-no-sinks"
    impl_cls = _PrefillNoSinksImpl
