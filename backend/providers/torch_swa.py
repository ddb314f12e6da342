"""`torch` provider of the swa_sinks family: paged attention with a sliding window and sinks, in
plain torch, with the structure of vLLM's Triton unified attention (TRITON_ATTN, the gpt-oss
path on NVIDIA): a 2-D launch (one softmax over every key) or a 3-D one (split-KV: the keys in
NUM_SEGMENTS segments, each with its own max and sum, merged by their log-sum-exp), chosen on
host values (vllm/v1/attention/ops/triton_unified_attention.py):

    3-D iff not (max_seqlen_q > 1 and max_seqlen_q > MAX_3D_QUERY_LEN)
            and num_seqs * cdiv(max_seqlen_q, BLOCK_Q) <= seq_threshold_3D,
    seq_threshold_3D = 128 // num_kv_heads, BLOCK_Q = BLOCK_M // (H / Hkv), BLOCK_M = 16

with num_seqs the metadata's (padded) request count: a graph freezes its capture's choice. The
sink is one logit per query head in the softmax denominator, in segment 0 only on the 3-D path.
Both paths are exact up to rounding, so graph and eager agree within tolerance whichever ran.

Graph-safe: shapes from tensor shapes and host metadata ints, no host syncs. Rows past the
builder's num_actual_tokens (padded tokens) are 0. Support ALWAYS, as vLLM's TRITON_ATTN.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from backend.attention.kv_cache import write_kv
from backend.attention.swa import SWABackend, SWAImpl, SWAMetadata
from backend.providers.torch_backend import gather_length
from backend.providers.torch_ops import gather_paged, token_chunks, token_to_request

NUM_SEGMENTS = 16  # vLLM's num_par_softmax_segments
MAX_3D_QUERY_LEN = 8
MIN_LAUNCH_GRID_SIZE_2D = 128


def use_3d(md: SWAMetadata, num_heads: int, num_kv_heads: int) -> bool:
    """The 2-D/3-D choice on the metadata's host values (module docstring)."""
    qpkv = num_heads // num_kv_heads
    block_m = 16 if qpkv <= 16 else 1 << (qpkv - 1).bit_length()
    block_q = max(block_m // qpkv, 1)
    max_q = max(int(md.max_query_len), 1)
    if max_q > 1 and max_q > MAX_3D_QUERY_LEN:
        return False
    return md.num_padded_reqs * -(-max_q // block_q) <= MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads


def combine(
    scores: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor | None,
    segments: int,
    sink_in_every_segment: bool = False,
    sink_count: int = 1,
) -> torch.Tensor:
    """softmax(scores + sink) @ v, fp32: scores [Hkv, C, G, L] (-inf where masked), v [Hkv, C, L, D],
    sinks [Hkv, 1, G, 1] or None -> [Hkv, C, G, D]. segments 1: the 2-D path; > 1: the 3-D path
    (per-segment max and sum, merged by log-sum-exp; the sink in segment 0 only, or in every
    segment for the mutation suite's broken kernel, which may also add it `sink_count` times).
    A row with no key and no sink is 0."""
    neg = scores.new_full((), float("-inf"))  # a device fill (torch.tensor(x, device=...) is a blocking copy)
    if segments <= 1:
        m = scores.amax(dim=-1, keepdim=True)
        if sinks is not None:
            m = torch.maximum(m, sinks)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        e = torch.exp(scores - m)
        den = e.sum(dim=-1, keepdim=True) + (sink_count * torch.exp(sinks - m) if sinks is not None else 0.0)
        return torch.matmul(e, v) / torch.where(den > 0, den, torch.ones_like(den))
    length = scores.shape[-1]
    seg = -(-length // segments)
    pad = seg * segments - length
    if pad:
        scores = torch.nn.functional.pad(scores, (0, pad), value=float("-inf"))
        v = torch.nn.functional.pad(v, (0, 0, 0, pad))
    s = scores.unflatten(-1, (segments, seg))  # [Hkv, C, G, S, seg]
    vs = v.unflatten(-2, (segments, seg))  # [Hkv, C, S, seg, D]
    m = s.amax(dim=-1)  # [Hkv, C, G, S]
    if sinks is not None:
        with_sink = (
            torch.maximum(m, sinks[..., 0:1].expand_as(m))
            if sink_in_every_segment
            else torch.cat([torch.maximum(m[..., :1], sinks), m[..., 1:]], dim=-1)
        )
        m = with_sink
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m_safe[..., None])
    den = e.sum(dim=-1)  # [Hkv, C, G, S]
    if sinks is not None:
        sink_term = sink_count * torch.exp(sinks - m_safe)  # [Hkv, C, G, S]
        if not sink_in_every_segment:
            sink_term = torch.cat([sink_term[..., :1], torch.zeros_like(sink_term[..., 1:])], dim=-1)
        den = den + sink_term
    num = torch.einsum("hcgsl,hcsld->hcgsd", e, vs)  # per-segment unnormalised outputs
    big = torch.where(torch.isinf(m), neg.expand_as(m), m).amax(dim=-1, keepdim=True)  # merge (LSE)
    big = torch.where(torch.isinf(big), torch.zeros_like(big), big)
    w = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(m_safe - big))
    total = (den * w).sum(dim=-1, keepdim=True)
    out = (num * w[..., None]).sum(dim=-2)
    return out / torch.where(total > 0, total, torch.ones_like(total))


def swa_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: SWAMetadata,
    k_scale,
    v_scale,
    scale: float,
    window: int | None,
    sinks: torch.Tensor | None,
    segments: int,
    window_off_by_one: bool = False,
    sink_scaled: bool = False,
    sink_in_every_segment: bool = False,
    sink_twice: bool = False,
    sink_no_exp2: bool = False,
) -> torch.Tensor:
    """query [T, H, D] -> fp32 [T, H, D] over the paged cache (the keyword flags are the mutation
    suite's broken kernels: the window one key too wide, the sink times the softmax scale, the sink
    in the denominator twice, the sink taken as a base-2 logit: a kernel that runs its softmax in
    exp2 and adds exp2(sink) without the log2(e) every other logit gets, e^(sink ln 2))."""
    t, h, d = query.shape
    block_size, hkv = k_cache.shape[1], k_cache.shape[2]
    length = gather_length(md, block_size)
    req, pos = token_to_request(md.query_start_loc, t)
    seq = md.seq_lens.to(torch.int64)[req]
    qlen = md.query_lens.to(torch.int64)[req]
    i = seq - qlen + pos  # the token's absolute position
    real = (pos < qlen) & (torch.arange(t, device=query.device) < md.num_actual_tokens)
    keys = torch.arange(length, device=query.device)
    g = h // hkv
    sink = None
    if sinks is not None:
        sink = (
            sinks.float().view(hkv, 1, g, 1) * (scale if sink_scaled else 1.0) * (math.log(2) if sink_no_exp2 else 1.0)
        )
    out = torch.zeros(t, h, d, dtype=torch.float32, device=query.device)
    per_token = length * hkv * d * 4 * 2 + h * length * 4 * 4
    for chunk in token_chunks(t, per_token):
        rows = md.block_table[req[chunk]]
        k = gather_paged(k_cache, rows, length, k_scale)  # [C, L, Hkv, D]
        v = gather_paged(v_cache, rows, length, v_scale)
        j, ic = keys[None, :], i[chunk, None]
        mask = (j <= ic) & (j < seq[chunk, None]) & real[chunk, None]
        if window is not None:
            mask &= (ic - j <= window) if window_off_by_one else (ic - j < window)
        # Keys outside the mask are read as 0 (a kernel stops at them): 0 x a stale NaN is NaN.
        v = v.masked_fill(~mask[:, :, None, None], 0.0)
        qh = (query[chunk].float().view(-1, hkv, g, d) * scale).transpose(0, 1)  # [Hkv, C, G, D]
        kh = k.float().permute(2, 0, 1, 3)  # [Hkv, C, L, D]
        scores = torch.matmul(qh, kh.transpose(-1, -2)).masked_fill(~mask[None, :, None, :], float("-inf"))
        o = combine(
            scores, v.float().permute(2, 0, 1, 3), sink, segments, sink_in_every_segment, 2 if sink_twice else 1
        )
        out[chunk] = torch.where(real[chunk, None, None], o.transpose(0, 1).reshape(-1, h, d), 0.0)
    return out


class TorchSWAImpl(SWAImpl):
    # The mutation suite's broken kernels set these on subclasses.
    window_off_by_one: ClassVar[bool] = False
    sink_scaled: ClassVar[bool] = False
    sink_in_every_segment: ClassVar[bool] = False
    sink_twice: ClassVar[bool] = False
    sink_no_exp2: ClassVar[bool] = False

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output, window=None, sinks=None):
        write_kv(kv_cache, key, value, metadata.slot_mapping, k_scale, v_scale)
        return self.attend(query, kv_cache, metadata, k_scale, v_scale, output, window, sinks)

    def attend(self, query, kv_cache, md, k_scale, v_scale, output, window, sinks):
        t = md.num_padded_tokens
        segments = NUM_SEGMENTS if use_3d(md, self.config.num_heads, self.config.num_kv_heads) else 1
        out = swa_attention(
            query[:t],
            kv_cache[0],
            kv_cache[1],
            md,
            k_scale,
            v_scale,
            self.config.scale,
            self.layer_window(md, window),
            sinks,
            segments,
            self.window_off_by_one,
            self.sink_scaled,
            self.sink_in_every_segment,
            self.sink_twice,
            self.sink_no_exp2,
        )
        output[:t].copy_(out.to(output.dtype))
        return output

    def layer_window(self, md: SWAMetadata, window: int | None) -> int | None:
        """The window this layer attends with: the layer's own (vLLM PR #51756's fix)."""
        return window


class TorchSWABackend(SWABackend):
    name: ClassVar[str] = "torch"
    impl_cls = TorchSWAImpl

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        from backend.attention.capabilities import device_class, torch_unavailable

        return torch_unavailable(device_class(device))
