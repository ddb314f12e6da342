"""Near-threshold bugs: wrong by an amount the old tolerances and the residual-stream
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

from backend.graphs import is_capturing
from backend.providers.torch_backend import TorchBackend, TorchImpl, paged_causal_attention


class VWithKScaleImpl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        return super().attend(query, kv_cache, metadata, k_scale, k_scale, output)


class VScale125Impl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        return super().attend(query, kv_cache, metadata, k_scale, v_scale * 1.25, output)


class FirstHeadImpl(TorchImpl):
    """The rank's first query head multiplied by `factor` (only in what a graph captured, when
    `captured_only`: the factor taken on the capture path, so eager is right)."""

    factor: float = 0.0
    captured_only: bool = False

    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        out = super().attend(query, kv_cache, metadata, k_scale, v_scale, output)
        if is_capturing() or not self.captured_only:
            head = out[: metadata.num_padded_tokens, 0]
            head.mul_(self.factor) if self.factor else head.zero_()
        return out


class HeadZeroedImpl(FirstHeadImpl):
    factor = 0.0


class NoSelfImpl(TorchImpl):
    def attend(self, query, kv_cache, metadata, k_scale, v_scale, output):
        t = metadata.num_padded_tokens
        out = paged_causal_attention(
            query[:t], kv_cache[0], kv_cache[1], metadata, k_scale, v_scale, self.config.scale, diagonal=-1
        )  # the bug: `<` where `<=` belongs
        output[:t].copy_(out.to(output.dtype))
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


class HeadScaledImpl(FirstHeadImpl):
    """A per-head scale applied to the wrong head: small in the residual stream, a tenth of the
    head's own norm."""

    factor = 0.9


class HeadScaled(TorchBackend):
    name = "mutant-head-scaled-0.9"
    impl_cls = HeadScaledImpl


class HeadScaledCapturedImpl(HeadScaledImpl):
    captured_only = True


class HeadScaledCaptured(TorchBackend):
    name = "mutant-head-scaled-captured"
    impl_cls = HeadScaledCapturedImpl
