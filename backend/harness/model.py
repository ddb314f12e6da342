"""The tensor-parallel test model (DESIGN.md §5) and its unsharded fp32 reference.

Per layer, on one tp rank (T tokens, hidden = num_heads * head_size, Dv = the family's output
head size):
    h = rmsnorm(x)                                   # [T, hidden]
    inputs = family.project(h)                       # e.g. GQA: q, k, v; MLA: q, kv_c, k_pe
    a = family.attend(impl, inputs, kv_cache[layer]) # the backend's Impl, local heads: [T, Hl, Dv]
    x = x + all_reduce(a.flat @ W_o[:, shard].T)     # row-parallel + sum over the tp gang
    x = x + W_2 silu(W_1 rmsnorm(x))                 # replicated MLP: dense work for PIECEWISE

The attention family (backend/families/) owns the op and its projections; everything else here is
the same for every family. The forward is split at each attention call into num_layers + 1 dense
pieces (piece i = post-attention of layer i-1, then pre-attention of layer i), so PIECEWISE can
capture pieces and run attention eagerly between them, while FULL captures `forward` whole.

Weights: generated in full, fp32, on the CPU from MODEL_SEED on every rank identically, rounded to
the model dtype, then sharded. So the sharded model equals the unsharded one and the reference
(fp32 on the same rounded weights) shares nothing with a rank but the numbers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from backend.case import ModelShape
from backend.families.contract import family as family_of
from backend.families.contract import layer_metadata, spec
from backend.graphs.provenance import host_scope
from backend.harness.distributed import all_reduce_

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
    """Every reason `shape` cannot be sharded over tp ranks (empty if it can): its family's rules."""
    return spec(shape.attention).layout_reasons(shape, tp)


def _head_cols(heads: range, head_size: int) -> torch.Tensor:
    return torch.arange(heads.start * head_size, heads.stop * head_size)


@dataclass(frozen=True)
class LayerWeights:
    norm1: torch.Tensor  # [hidden]
    attn: dict  # the family's attention weights (AttentionFamily.draw), full
    wo: torch.Tensor  # [hidden, H*Dv]
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
    fam = family_of(shape.attention)
    hid, inter = shape.hidden_size, MLP_MULT * shape.hidden_size
    attn_out = shape.num_heads * fam.out_head_size(shape)

    def w(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=gen, device=dev) / cols**0.5).to(dtype).float()

    def norm(n: int = hid) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(n, generator=gen, device=dev)).to(dtype).float()

    # Draw order per layer: norm1, the family's weights, wo, norm2, w1, w2 (fixed: weights follow
    # from the seed, and gqa's are the ones every verdict before families was taken on).
    layers: list[LayerWeights] = []
    for _ in range(shape.num_layers):
        norm1 = norm()
        attn = fam.draw(w, norm, shape, len(layers))
        layers.append(LayerWeights(norm1, attn, w(hid, attn_out), norm(), w(inter, hid), w(hid, inter)))
    return layers


def _shard_layers(
    weights: Sequence[LayerWeights], layout: TPLayout, shape: ModelShape, device: torch.device
) -> list[dict[str, torch.Tensor]]:
    dtype = getattr(torch, shape.dtype)
    fam = family_of(shape.attention)
    out_cols = _head_cols(layout.q_heads, fam.out_head_size(shape))

    def dev(t):  # tensors to the rank's device and dtype; a family's host values (a window) as they are
        return t.to(device=device, dtype=dtype).contiguous() if isinstance(t, torch.Tensor) else t

    return [
        {
            "norm1": dev(lw.norm1),
            "norm2": dev(lw.norm2),
            **{k: dev(v) for k, v in fam.shard(lw.attn, layout, shape).items()},
            "wo": dev(lw.wo[:, out_cols]),  # row-parallel shard: [hidden, Hl*Dv]
            "w1": dev(lw.w1),
            "w2": dev(lw.w2),
        }
        for lw in weights
    ]


@functools.lru_cache(maxsize=2)
def _device_layers(shape: ModelShape, layout: TPLayout, device: str) -> tuple[dict[str, torch.Tensor], ...]:
    """A rank's shard of the default weights on `device`, shared by every session of the process
    (backends and kv dtypes differ between sessions, weights do not; copying GBs per session was
    most of a session's build time on the H200)."""
    return tuple(_shard_layers(make_weights(shape, device=device), layout, shape, torch.device(device)))


def clear_weights() -> None:
    """Forget the process's cached weights (the next session draws them again, the same values).
    At full.yaml's GPU shape one model's fp32 weights and its rank's shard are 1.3 GB on the device:
    a worker that ran out of memory and dropped its sessions and caches still held 4-8 GiB, over
    the limit past which it is recycled (memory.UNRELEASED_LIMIT)."""
    _make_weights_cached.cache_clear()
    _device_layers.cache_clear()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + _EPS) * weight.float()).to(x.dtype)


class TPModel:
    """One rank's shard of the test model, on `device` in the model dtype. Attention goes through
    `impl` (the backend under test) with per-layer paged caches and k/v scale tensors owned here,
    so graphs captured over them read live contents (never rebind them: copy values in)."""

    def __init__(
        self,
        shape: ModelShape,
        layout: TPLayout,
        impl,
        kv_caches: Sequence[torch.Tensor],
        device: torch.device,
        weights: list[LayerWeights] | None = None,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.shape, self.layout, self.impl = shape, layout, impl
        self.family = family_of(shape.attention)
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

    def pre_attention(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The attention op's inputs of layer i (the family's projections of rmsnorm(x))."""
        lw = self.layers[i]
        return self.family.project(lw, rmsnorm(x, lw["norm1"]), self.layout, self.shape)

    def post_attention(self, i: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        lw = self.layers[i]
        o = attn.reshape(attn.shape[0], -1) @ lw["wo"].t()
        self.all_reduce(o)  # inside the captured graph in FULL and PIECEWISE, as in vLLM
        x = x + o
        h = rmsnorm(x, lw["norm2"])
        return x + F.silu(h @ lw["w1"].t()) @ lw["w2"].t()

    def piece(self, i: int, x: torch.Tensor, attn: torch.Tensor | None):
        """Dense piece i: (*attention inputs, x) for i < num_layers, the model output for the last."""
        if i > 0:
            assert attn is not None, "every piece after the first takes the previous layer's attention"
            x = self.post_attention(i - 1, x, attn)
        if i < self.shape.num_layers:
            return (*self.pre_attention(i, x), x)
        return x

    def attention(self, i: int, inputs: Sequence[torch.Tensor], metadata, out: torch.Tensor) -> torch.Tensor:
        # The CPU emulation classifies host memory wherever the backend runs, eager calls too: a
        # host buffer an Impl makes on its first (eager) call is read by a later capture.
        with host_scope(self.device):
            return self.family.attend(
                self.impl, self.layers[i], inputs, self.kv_caches[i], metadata, self.k_scales[i], self.v_scales[i], out
            )

    def forward(self, x: torch.Tensor, metadata, attn_bufs: torch.Tensor, attn_out: list | None = None) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]; attn_bufs [num_layers, T, Hl, Dv] are the output buffers
        handed to attention. `attn_out`, when given, receives each layer's attention result [T, Hl, Dv]
        (the tensor the backend returned, which the next piece reads: the checker compares it per
        head, since one head's error is diluted in the residual stream)."""
        attn = None
        for i in range(self.num_pieces):
            out = self.piece(i, x, attn)
            if i == self.shape.num_layers:
                return out
            *inputs, x = out
            attn = self.attention(i, inputs, layer_metadata(metadata, i), attn_bufs[i])
            if attn_out is not None:
                attn_out.append(attn)
        raise AssertionError("unreachable")


def reference_forward(
    weights: Sequence[LayerWeights],
    shape: ModelShape,
    x: torch.Tensor,
    context: Sequence[Sequence[Sequence[torch.Tensor]]],
    query_lens: Sequence[int],
    kv_round,
    attn_out: list | None = None,
    q_round=None,
) -> torch.Tensor:
    """The unsharded model in fp32 with the family's reference attention.

    x [T, hidden] (the model-dtype input). context[layer][plane][req] [ctx_len, *row] fp32: the
    dequantised context already in the cache. kv_round(layer, plane, t) -> t rounds this step's
    new rows the way the cache stores them (model dtype, or fp8 with the plane's scale), so the
    reference attends to what a correct kernel reads back. `attn_out`, when given, receives each
    layer's attention output [T, H, Dv] (all heads; fp32 holding model-dtype values).
    `q_round(layer, q)`, when given, rounds the query as the backend's layer does before attention
    (vLLM's fp8 query quantisation with a static scale): the reference attends with what a correct
    kernel is handed.

    Activations are rounded to the model dtype wherever the model stores them (a bf16 residual
    stream alone drifts by ~1e-2 over two layers, as much as the tolerance); every product,
    softmax and sum is fp32, and the attention math is the family's own reference.
    """
    dtype = getattr(torch, shape.dtype)
    fam = family_of(shape.attention)

    def rnd(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).float()

    x = x.float()
    t = x.shape[0]
    for i, lw in enumerate(weights):
        h = rnd(rmsnorm(x, lw.norm1))
        attn = rnd(
            fam.reference(
                lw.attn,
                h,
                context[i],
                query_lens,
                functools.partial(kv_round, i),
                None if q_round is None else functools.partial(q_round, i),
                shape,
                rnd,
            )
        )
        if attn_out is not None:
            attn_out.append(attn)
        x = rnd(x + rnd(attn.reshape(t, -1) @ lw.wo.t()))
        h = rnd(rmsnorm(x, lw.norm2))
        x = rnd(x + rnd(rnd(F.silu(rnd(h @ lw.w1.t()))) @ lw.w2.t()))
    return x
