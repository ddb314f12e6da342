"""Near-threshold bugs (issue #17): wrong by an amount the old tolerances and the residual-stream
comparison let through at the GPU shape (measured on the H200). Each is the `torch` provider with
one thing off, identically in eager and graphs, so only the reference check can see it:

  VWithKScale   V dequantised with K's scale (fp8 only: kv auto has both scales 1.0)
  VScale125     V read back 1.25x too large (every kv dtype)
  HeadZeroed    the rank's first query head outputs 0 (one of 32 at the GPU shape)
  NoSelf        a token cannot attend its own position (strict causal mask); a fresh
                prefill's first token attends nothing and outputs 0
  HeadScaled    the rank's first query head 10% low: inside the residual-stream tolerance even on
                the 4-head test shape; only the per-head attention check (attn_reference) sees it
  HeadScaledCaptured  the same, only in what a graph captured (the scale taken on the capture
                path): eager is right, so only attn_replay sees it, wherever a FULL graph runs
"""

from __future__ import annotations

import torch

from backend.attention.torch_backend import TorchBackend, TorchImpl
from backend.graphs import is_capturing
from backend.attention.torch_ops import gather_paged, masked_attention, token_chunks, token_to_request


class VWithKScaleImpl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        return super().attend(query, kv_cache, metadata, k_scale, k_scale, output)


class VScale125Impl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        return super().attend(query, kv_cache, metadata, k_scale, v_scale * 1.25, output)


class HeadZeroedImpl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        out = super().attend(query, kv_cache, metadata, k_scale, v_scale, output)
        out[:metadata.num_padded_tokens, 0].zero_()
        return out


class NoSelfImpl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        t = metadata.num_padded_tokens
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        length = metadata.block_table.shape[1] * k_cache.shape[1]
        req, pos = token_to_request(metadata.query_start_loc, t)
        seq = metadata.seq_lens.to(torch.int64)[req]
        limit = seq - metadata.query_lens.to(torch.int64)[req] + pos
        real = pos < metadata.query_lens.to(torch.int64)[req]
        keys = torch.arange(length, device=query.device)
        per_token = length * k_cache.shape[2] * k_cache.shape[3] * 8 + query.shape[1] * length * 12
        for chunk in token_chunks(t, per_token):
            rows = metadata.block_table[req[chunk]]
            k = gather_paged(k_cache, rows, length, k_scale)
            v = gather_paged(v_cache, rows, length, v_scale)
            mask = (keys[None, :] < limit[chunk, None]) & real[chunk, None]  # `<`: the bug (should be <=)
            output[chunk] = masked_attention(query[chunk], k, v, mask, self.config.scale).to(output.dtype)
        return output


class VWithKScale(TorchBackend):
    name = "mutant-v-with-k-scale"
    impl_cls = VWithKScaleImpl


class VScale125(TorchBackend):
    name = "mutant-v-scale-1.25"
    impl_cls = VScale125Impl


class HeadZeroed(TorchBackend):
    name = "mutant-head-zeroed"
    impl_cls = HeadZeroedImpl


class NoSelf(TorchBackend):
    name = "mutant-no-self"
    impl_cls = NoSelfImpl


class HeadScaledImpl(TorchImpl):
    """The rank's first query head 10% low (a per-head scale applied to the wrong head): small
    in the residual stream, a tenth of the head's own norm."""

    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        out = super().attend(query, kv_cache, metadata, k_scale, v_scale, output)
        out[:metadata.num_padded_tokens, 0].mul_(0.9)
        return out


class HeadScaled(TorchBackend):
    name = "mutant-head-scaled-0.9"
    impl_cls = HeadScaledImpl


class HeadScaledCapturedImpl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        out = super().attend(query, kv_cache, metadata, k_scale, v_scale, output)
        if is_capturing():
            out[:metadata.num_padded_tokens, 0].mul_(0.9)
        return out


class HeadScaledCaptured(TorchBackend):
    name = "mutant-head-scaled-captured"
    impl_cls = HeadScaledCapturedImpl
