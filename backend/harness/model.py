"""The tensor-parallel test model (DESIGN.md §5) and its unsharded fp32 reference.

Per layer, on one tp rank (T tokens, hidden = num_heads * head_size):
    h = rmsnorm(x)                                   # [T, hidden]
    q, k, v = h @ W_qkv[rank shard].T                # column-parallel: [T, Hl, D], [T, Hkvl, D] x2
    a = attention(q, k, v, kv_cache[layer])          # the backend's Impl, local heads only
    x = x + all_reduce(a.flat @ W_o[:, shard].T)     # row-parallel + sum over the tp gang
    x = x + W_2 silu(W_1 rmsnorm(x))                 # replicated MLP: dense work for PIECEWISE

The forward is split at each attention call into num_layers + 1 dense pieces
(piece i = post-attention of layer i-1, then pre-attention of layer i), so PIECEWISE can capture
pieces and run attention eagerly between them, while FULL captures `forward` whole.

Weights: generated in full, fp32, on the CPU from MODEL_SEED on every rank identically, rounded to
the model dtype, then sharded. So the sharded model equals the unsharded one and the reference
(fp32 on the same rounded weights) shares nothing with a rank but the numbers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from backend.case import ModelShape
from backend.harness.distributed import all_reduce_
from backend.harness.reference import reference_attention

MODEL_SEED = 1234  # weights do not depend on the case seed: sessions are shared across seeds
MLP_MULT = 2
_EPS = 1e-6


@dataclass(frozen=True)
class TPLayout:
    """Which global heads a rank holds. kv heads are split by tp, or replicated (vLLM) when
    tp > num_kv_heads: ranks r*tp/Hkv .. share kv head r // (tp // Hkv)."""

    tp: int
    rank: int
    num_heads: int
    num_kv_heads: int
    head_size: int

    @property
    def local_heads(self) -> int:
        return self.num_heads // self.tp

    @property
    def local_kv_heads(self) -> int:
        return max(self.num_kv_heads // self.tp, 1)

    @property
    def q_heads(self) -> range:
        return range(self.rank * self.local_heads, (self.rank + 1) * self.local_heads)

    @property
    def kv_heads(self) -> range:
        if self.tp <= self.num_kv_heads:
            return range(self.rank * self.local_kv_heads, (self.rank + 1) * self.local_kv_heads)
        first = self.rank // (self.tp // self.num_kv_heads)
        return range(first, first + 1)


def layout_reasons(shape: ModelShape, tp: int) -> list[str]:
    """Every reason `shape` cannot be sharded over tp ranks (empty if it can)."""
    reasons = []
    if tp < 1:
        reasons.append(f"tp {tp} < 1")
        return reasons
    if shape.num_heads % tp:
        reasons.append(f"num_heads {shape.num_heads} not divisible by tp {tp}")
    if shape.num_kv_heads <= 0 or shape.num_heads % shape.num_kv_heads:
        reasons.append(f"num_heads {shape.num_heads} not a multiple of num_kv_heads {shape.num_kv_heads}")
    elif tp <= shape.num_kv_heads and shape.num_kv_heads % tp:
        reasons.append(f"num_kv_heads {shape.num_kv_heads} not divisible by tp {tp}")
    elif tp > shape.num_kv_heads and tp % shape.num_kv_heads:
        reasons.append(f"tp {tp} not a multiple of num_kv_heads {shape.num_kv_heads} (kv heads cannot be replicated)")
    return reasons


def _head_cols(heads: range, head_size: int) -> torch.Tensor:
    return torch.arange(heads.start * head_size, heads.stop * head_size)


@dataclass(frozen=True)
class LayerWeights:
    norm1: torch.Tensor  # [hidden]
    wq: torch.Tensor  # [H*D, hidden]
    wk: torch.Tensor  # [Hkv*D, hidden]
    wv: torch.Tensor  # [Hkv*D, hidden]
    wo: torch.Tensor  # [hidden, H*D]
    norm2: torch.Tensor  # [hidden]
    w1: torch.Tensor  # [MLP_MULT*hidden, hidden]
    w2: torch.Tensor  # [hidden, MLP_MULT*hidden]


def make_weights(shape: ModelShape, seed: int = MODEL_SEED, device: str = "cpu") -> list[LayerWeights]:
    """Full (unsharded) fp32 weights, already rounded to the model dtype, drawn on `device` from
    its generator (so a GPU worker does not spend seconds drawing GBs on the host; the values
    depend on the device type, and every rank of a gang uses the same type). Cached per process:
    every session of a worker uses the same weights. Callers must not modify them."""
    return _make_weights_cached(shape, seed, str(device))


@functools.lru_cache(maxsize=2)
def _make_weights_cached(shape: ModelShape, seed: int, device: str) -> list[LayerWeights]:
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(seed)
    dtype = getattr(torch, shape.dtype)
    hid, hd, kvd, inter = shape.hidden_size, shape.num_heads * shape.head_size, \
        shape.num_kv_heads * shape.head_size, MLP_MULT * shape.hidden_size

    def w(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=gen, device=dev) / cols**0.5).to(dtype).float()

    def norm() -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(hid, generator=gen, device=dev)).to(dtype).float()

    return [LayerWeights(norm(), w(hd, hid), w(kvd, hid), w(kvd, hid), w(hid, hd), norm(), w(inter, hid), w(hid, inter))
            for _ in range(shape.num_layers)]


def _shard_layers(weights: Sequence[LayerWeights], layout: "TPLayout", shape: ModelShape,
                  device: torch.device) -> list[dict[str, torch.Tensor]]:
    dtype = getattr(torch, shape.dtype)
    q_cols = _head_cols(layout.q_heads, shape.head_size)
    kv_cols = _head_cols(layout.kv_heads, shape.head_size)

    def dev(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype).contiguous()

    return [{
        "norm1": dev(lw.norm1), "norm2": dev(lw.norm2),
        # fused column-parallel QKV shard: [Hl*D + 2*Hkvl*D, hidden]
        "wqkv": dev(torch.cat([lw.wq[q_cols], lw.wk[kv_cols], lw.wv[kv_cols]])),
        "wo": dev(lw.wo[:, q_cols]),  # row-parallel shard: [hidden, Hl*D]
        "w1": dev(lw.w1), "w2": dev(lw.w2),
    } for lw in weights]


@functools.lru_cache(maxsize=2)
def _device_layers(shape: ModelShape, layout: "TPLayout", device: str) -> tuple[dict[str, torch.Tensor], ...]:
    """A rank's shard of the default weights on `device`, shared by every session of the process
    (backends and kv dtypes differ between sessions, weights do not; copying GBs per session was
    most of a session's build time on the H200)."""
    return tuple(_shard_layers(make_weights(shape, device=device), layout, shape,
                               torch.device(device)))



def rmsnorm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + _EPS) * weight.float()).to(x.dtype)


class TPModel:
    """One rank's shard of the test model, on `device` in the model dtype. Attention goes through
    `impl` (the backend under test) with per-layer paged caches and k/v scale tensors owned here,
    so graphs captured over them read live contents (never rebind them: copy values in)."""

    def __init__(self, shape: ModelShape, layout: TPLayout, impl, kv_caches: Sequence[torch.Tensor],
                 device: torch.device, weights: list[LayerWeights] | None = None,
                 all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.shape, self.layout, self.impl = shape, layout, impl
        self.all_reduce = all_reduce or all_reduce_
        self.device = torch.device(device)
        self.dtype = getattr(torch, shape.dtype)
        self.kv_caches = list(kv_caches)
        n = shape.num_layers
        self.k_scales = [torch.ones(1, dtype=torch.float32, device=self.device) for _ in range(n)]
        self.v_scales = [torch.ones(1, dtype=torch.float32, device=self.device) for _ in range(n)]
        if weights is None:  # the shared shard of make_weights(shape, device): read-only
            self.layers = list(_device_layers(shape, layout, str(self.device)))
        else:
            self.layers = _shard_layers(weights, layout, shape, self.device)

    @property
    def num_pieces(self) -> int:
        return self.shape.num_layers + 1

    def pre_attention(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lw, lay, d = self.layers[i], self.layout, self.shape.head_size
        t = x.shape[0]
        qkv = rmsnorm(x, lw["norm1"]) @ lw["wqkv"].t()
        a, b = lay.local_heads * d, lay.local_kv_heads * d
        q = qkv[:, :a].reshape(t, lay.local_heads, d).contiguous()
        k = qkv[:, a:a + b].reshape(t, lay.local_kv_heads, d).contiguous()
        v = qkv[:, a + b:].reshape(t, lay.local_kv_heads, d).contiguous()
        return q, k, v

    def post_attention(self, i: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        lw = self.layers[i]
        o = attn.reshape(attn.shape[0], -1) @ lw["wo"].t()
        self.all_reduce(o)  # inside the captured graph in FULL and PIECEWISE, as in vLLM
        x = x + o
        h = rmsnorm(x, lw["norm2"])
        return x + F.silu(h @ lw["w1"].t()) @ lw["w2"].t()

    def piece(self, i: int, x: torch.Tensor, attn: torch.Tensor | None):
        """Dense piece i: (q, k, v, x) for i < num_layers, the model output for the last one."""
        if i > 0:
            x = self.post_attention(i - 1, x, attn)
        if i < self.shape.num_layers:
            return (*self.pre_attention(i, x), x)
        return x

    def attention(self, i: int, q, k, v, metadata, out: torch.Tensor) -> torch.Tensor:
        return self.impl.forward(q, k, v, self.kv_caches[i], metadata, self.k_scales[i], self.v_scales[i], out)

    def forward(self, x: torch.Tensor, metadata, attn_bufs: torch.Tensor,
                attn_out: list | None = None) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]; attn_bufs [num_layers, T, Hl, D] are the output buffers
        handed to attention. `attn_out`, when given, receives each layer's attention result [T, Hl, D]
        (the tensor the backend returned, which the next piece reads: the checker compares it per
        head, since one head's error is diluted in the residual stream)."""
        attn = None
        for i in range(self.num_pieces):
            out = self.piece(i, x, attn)
            if i == self.shape.num_layers:
                return out
            q, k, v, x = out
            attn = self.attention(i, q, k, v, metadata, attn_bufs[i])
            if attn_out is not None:
                attn_out.append(attn)
        raise AssertionError("unreachable")


def reference_forward(weights: list[LayerWeights], shape: ModelShape, x: torch.Tensor,
                      ctx_k: Sequence[Sequence[torch.Tensor]], ctx_v: Sequence[Sequence[torch.Tensor]],
                      query_lens: Sequence[int], kv_round, attn_out: list | None = None,
                      q_round=None) -> torch.Tensor:
    """The unsharded model in fp32 with backend.harness.reference attention.

    x [T, hidden] (the model-dtype input). ctx_k[layer][req] [ctx_len, Hkv, D] fp32: the
    dequantised context already in the cache. kv_round(layer, "k"|"v", t) -> t rounds this step's
    new K/V the way the cache stores them (model dtype, or fp8 with the layer's scale), so the
    reference attends to what a correct kernel reads back. `attn_out`, when given, receives each
    layer's attention output [T, H, D] (all heads; fp32 holding model-dtype values).
    `q_round(layer, q)`, when given, rounds the query as the backend's layer does before attention
    (vLLM's fp8 query quantisation with a static scale): the reference attends with what a correct
    kernel is handed.

    Activations are rounded to the model dtype wherever the model stores them (a bf16 residual
    stream alone drifts by ~1e-2 over two layers, as much as the tolerance); every product,
    softmax and sum is fp32, and the attention math is backend.harness.reference's own.
    """
    d, hq, hkv = shape.head_size, shape.num_heads, shape.num_kv_heads
    dtype = getattr(torch, shape.dtype)

    def rnd(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).float()

    x = x.float()
    t = x.shape[0]
    starts = [sum(query_lens[:r]) for r in range(len(query_lens))]
    for i, lw in enumerate(weights):
        h = rnd(rmsnorm(x, lw.norm1))
        q = rnd(h @ lw.wq.t()).view(t, hq, d)
        if q_round is not None:
            q = q_round(i, q)
        k = kv_round(i, "k", rnd(h @ lw.wk.t()).view(t, hkv, d))
        v = kv_round(i, "v", rnd(h @ lw.wv.t()).view(t, hkv, d))
        ks = [torch.cat([ctx_k[i][r], k[s:s + ql]]) for r, (s, ql) in enumerate(zip(starts, query_lens))]
        vs = [torch.cat([ctx_v[i][r], v[s:s + ql]]) for r, (s, ql) in enumerate(zip(starts, query_lens))]
        attn = rnd(reference_attention(q, ks, vs, query_lens, d**-0.5))
        if attn_out is not None:
            attn_out.append(attn)
        x = rnd(x + rnd(attn.reshape(t, hq * d) @ lw.wo.t()))
        h = rnd(rmsnorm(x, lw.norm2))
        x = rnd(x + rnd(rnd(F.silu(rnd(h @ lw.w1.t()))) @ lw.w2.t()))
    return x
