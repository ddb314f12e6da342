"""The fp32 reference of a GatedDeltaNet layer (DESIGN.md §11), in two forms that must agree:
token by token (the recurrence as written) and chunked (the WY form a chunk kernel computes),
tests/families/test_gdn_reference.py holds them equal. It shares no code with a provider.

Per token: q, k = l2norm(q), l2norm(k); q *= Dk^-0.5; g = -exp(A_log) * softplus(a + dt_bias);
beta = sigmoid(b); S = S * exp(g); delta = (v - S k) * beta; S = S + delta k^T; o = S q, after a
causal conv1d (width K, SiLU) over the request's last K - 1 inputs and its new ones. The layer's
output is rmsnorm(o) * weight * silu(z) per value head.

State layout in and out (backend/attention/gdn.py): each request holds 1 + k columns of (conv
buffer [W, C], recurrent [Hv, Dv, Dk]). StateContext carries every request's columns as the step
finds them (rounded as a correct cache holds them) and gets them back as a correct step leaves
them: the columns a step does not write keep their values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

CHUNK = 64
EPS = 1e-6


@dataclass
class StateContext:
    """One state layer's requests for the reference (full heads, fp32): their columns before the
    step, how the step reads them, and (filled by reference_layer) after."""

    conv: torch.Tensor  # [n, 1 + k, W, C]
    state: torch.Tensor  # [n, 1 + k, Hv, Dv, Dk]
    fresh: tuple[bool, ...]  # no prior state: read zeros (a prompt's first chunk)
    spec: tuple[bool, ...]  # a verify row: reads column accepted - 1, writes column t after token t
    accepted: tuple[int, ...]
    post_conv: torch.Tensor | None = None
    post_state: torch.Tensor | None = None
    forms: list = field(default_factory=list)  # which form each request ran (tests)


def _l2(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + EPS)


def recurrent(
    s: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """s [Hv, Dv, Dk]; q, k [L, Hv, Dk] (normalised, q scaled); v [L, Hv, Dv]; g, beta [L, Hv] ->
    outputs [L, Hv, Dv] and the state after every token."""
    outs, states = [], []
    for t in range(q.shape[0]):
        s = s * torch.exp(g[t])[:, None, None]
        err = v[t] - (s @ k[t][:, :, None])[..., 0]
        s = s + (err * beta[t][:, None])[:, :, None] * k[t][:, None, :]
        outs.append((s @ q[t][:, :, None])[..., 0])
        states.append(s)
    return torch.stack(outs), states


def chunked(
    s: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence a chunk at a time, head by head: with Γ the decay since the chunk's
    start and u the values the state actually adds, u solves a unit lower-triangular system, and
    the outputs and the chunk's final state are sums over it. Returns outputs, final state."""
    outs = []
    for h0 in range(0, q.shape[0], chunk):
        qc, kc, vc = q[h0 : h0 + chunk], k[h0 : h0 + chunk], v[h0 : h0 + chunk]
        gam = torch.cumsum(g[h0 : h0 + chunk], 0)  # [n, Hv] log decay since the chunk's start
        bc = beta[h0 : h0 + chunk]
        n = qc.shape[0]
        heads = []
        new_s = torch.empty_like(s)
        for h in range(s.shape[0]):
            gh = gam[:, h]
            diff = gh[:, None] - gh[None, :]
            tri = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device))
            rel = torch.where(tri, torch.exp(torch.where(tri, diff, torch.zeros_like(diff))), torch.zeros_like(diff))
            kk = kc[:, h] @ kc[:, h].T
            a = torch.tril(bc[:, h][:, None] * rel * kk, diagonal=-1)
            rhs = bc[:, h][:, None] * (vc[:, h] - torch.exp(gh)[:, None] * (kc[:, h] @ s[h].T))
            u = torch.linalg.solve_triangular(
                torch.eye(n, dtype=a.dtype, device=a.device) + a, rhs, upper=False, unitriangular=True
            )
            heads.append(torch.exp(gh)[:, None] * (qc[:, h] @ s[h].T) + (rel * (qc[:, h] @ kc[:, h].T)) @ u)
            new_s[h] = torch.exp(gh[-1]) * s[h] + (u * torch.exp(gh[-1] - gh)[:, None]).T @ kc[:, h]
        outs.append(torch.stack(heads, 1))
        s = new_s
    return torch.cat(outs), s


def gated_rmsnorm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMSNormGated (norm before gate): rmsnorm(o) over Dv per head, times weight, times silu(z)."""
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + EPS)
    return o * weight * F.silu(z)


def reference_layer(weights: dict, h: torch.Tensor, ctx: StateContext, query_lens, shape, rnd) -> torch.Tensor:
    """One GDN layer on the unsharded weights: h [T, hidden] (fp32 of model-dtype values) ->
    [T, Hv, Dv]; fills ctx.post_conv / ctx.post_state. The projections and the core's output are
    rounded to the model dtype (where the model stores them); the conv, the recurrence and the
    norm stay fp32 (the core's output rounded or not is the difference between a 0.5% and a 5%
    worst head after three GDN layers: the gated RMSNorm renormalises each head)."""
    dims = dict(shape.dims)
    hk, dk, kw = dims["num_k_heads"], dims["head_k_dim"], dims["conv_kernel"]
    hv, dv = shape.num_heads, shape.head_size
    c = 2 * hk * dk + hv * dv
    qkvz = rnd(h @ weights["w_qkvz"].t())
    x, z = qkvz[:, :c], qkvz[:, c:].unflatten(-1, (hv, dv))
    ba = rnd(h @ weights["w_ba"].t())
    b, a = ba[:, :hv], ba[:, hv:]
    g = -torch.exp(weights["A_log"]) * F.softplus(a + weights["dt_bias"], threshold=20.0)
    beta = torch.sigmoid(b)
    post_conv, post_state = ctx.conv.clone(), ctx.state.clone()
    outs, start = [], 0
    for r, ql in enumerate(query_lens):
        xs = x[start : start + ql]
        acc = ctx.accepted[r] if ctx.spec[r] else 1
        if ctx.fresh[r]:
            hist = torch.zeros(kw - 1, c, device=h.device)
            s0 = torch.zeros(hv, dv, dk, device=h.device)
        else:
            hist = ctx.conv[r, 0, acc - 1 : acc - 1 + kw - 1]
            s0 = ctx.state[r, acc - 1]
        window = torch.cat([hist, xs])
        conv = F.silu(sum(window[j : j + ql] * weights["conv_w"][:, j] for j in range(kw)))
        q = _l2(conv[:, : hk * dk].unflatten(-1, (hk, dk))) * dk**-0.5
        k = _l2(conv[:, hk * dk : 2 * hk * dk].unflatten(-1, (hk, dk)))
        v = conv[:, 2 * hk * dk :].unflatten(-1, (hv, dv))
        q, k = (t.repeat_interleave(hv // hk, dim=1) for t in (q, k))
        gr, br = g[start : start + ql], beta[start : start + ql]
        if ql > CHUNK:  # long rows: the chunked form (tested equal); the recurrence is O(L) launches
            o, final = chunked(s0, q, k, v, gr, br)
            states = [final]
            ctx.forms.append("chunked")
        else:
            o, states = recurrent(s0, q, k, v, gr, br)
            ctx.forms.append("recurrent")
        if ctx.spec[r]:  # the state after token t in column t; the conv buffer shifted by the accepted
            for t, st in enumerate(states):
                post_state[r, t] = st
            post_conv[r, 0] = torch.cat([ctx.conv[r, 0, acc : acc + kw - 2], xs])
        else:
            post_state[r, 0] = states[-1]
            post_conv[r, 0, : kw - 1] = window[-(kw - 1) :]
        # the core's output is an activation the model stores (vLLM's core_attn_out: model dtype)
        outs.append(gated_rmsnorm(rnd(o), z[start : start + ql], weights["gnorm"]))
        start += ql
    ctx.post_conv, ctx.post_state = post_conv, post_state
    return torch.cat(outs) if outs else h.new_zeros(0, hv, dv)
