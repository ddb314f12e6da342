"""Torch kernels of GatedDeltaNet's core over a state page (backend/attention/gdn.py has the
contract), with the structure of vLLM's GDN path: decode and verify rows vectorised (what a FULL
graph holds: no host syncs, shapes from tensor shapes and host ints), prefill rows eagerly, one by
one, in the chunked form (chunk 64, as FLA's chunk_gated_delta_rule), decodes first.

Shapes (one rank): T tokens, C = 2 Hk Dk + Hv Dv conv channels [q | k | v], K conv width,
W = K - 1 + k the conv buffer, S the recurrent state [Hv, Dv, Dk] (S k is a value vector).
Per token, fp32: q, k = l2norm(q), l2norm(k); q *= Dk^-0.5; g = -exp(A_log) softplus(a + dt_bias),
beta = sigmoid(b); S = S exp(g); delta = (v - S k) beta; S += delta k^T; o = S q. A value head h
reads key head h // (Hv / Hk).

A slot index at or below the metadata's pad_slot (orch: -1; vLLM: its null block 0) is padding:
read as zeros, written nothing (a read-modify-write that puts back what the slot held, so no slot
is special-cased).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from backend.attention.gdn import GDNDims, StatePage

CHUNK = 64  # FLA's chunk size
SOFTPLUS_THRESHOLD = 20.0  # vLLM's fused gating: softplus(x) = x above it


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def split_qkv(conv_out: torch.Tensor, d: GDNDims) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[..., C] -> q, k [..., Hk, Dk], v [..., Hv, Dv] (fp32)."""
    a, b = d.num_k_heads * d.head_k_dim, 2 * d.num_k_heads * d.head_k_dim
    x = conv_out.float()
    return (
        x[..., :a].unflatten(-1, (d.num_k_heads, d.head_k_dim)),
        x[..., a:b].unflatten(-1, (d.num_k_heads, d.head_k_dim)),
        x[..., b:].unflatten(-1, (d.num_v_heads, d.head_v_dim)),
    )


def gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """g (log decay, <= 0) and beta, fp32, [..., Hv]."""
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float(), threshold=SOFTPLUS_THRESHOLD)
    return g, torch.sigmoid(b.float())


def conv_window(window: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """window [N, K - 1 + L, C] (history, then L new inputs), weight [C, K] -> silu(conv) [N, L, C] fp32."""
    kw = weight.shape[1]
    length = window.shape[1] - kw + 1
    w = weight.float()
    out = sum(window[:, j : j + length].float() * w[:, j] for j in range(kw))
    return F.silu(out)


def _valid(idx: torch.Tensor, pad_slot: int) -> torch.Tensor:
    return idx > pad_slot


def read_slots(plane: torch.Tensor, idx: torch.Tensor, pad_slot: int) -> torch.Tensor:
    """plane [slots, ...] at idx [N] -> [N, ...] fp32; padding reads zeros."""
    valid = _valid(idx, pad_slot)
    got = plane.index_select(0, idx.clamp(min=0).long()).float()
    return torch.where(valid.view(-1, *[1] * (got.dim() - 1)), got, torch.zeros_like(got))


def write_slots(plane: torch.Tensor, idx: torch.Tensor, values: torch.Tensor, pad_slot: int) -> None:
    """plane[idx] = values for the valid rows; a padded row puts back what its (clamped) slot held."""
    safe = idx.clamp(min=0).long()
    held = plane.index_select(0, safe)
    valid = _valid(idx, pad_slot).view(-1, *[1] * (held.dim() - 1))
    plane.index_copy_(0, safe, torch.where(valid, values.to(plane.dtype), held))


def delta_rule(
    s0: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token over L (small: a decode's 1, a verify row's 1 + k), vectorised over N rows.
    s0 [N, Hv, Dv, Dk]; q, k [N, L, Hk, Dk]; v [N, L, Hv, Dv]; g, beta [N, L, Hv] -> outputs
    [N, L, Hv, Dv] and the state after each token [N, L, Hv, Dv, Dk]."""
    rep = v.shape[2] // q.shape[2]
    q = (l2norm(q) * scale).repeat_interleave(rep, dim=2)
    k = l2norm(k).repeat_interleave(rep, dim=2)
    s, outs, states = s0, [], []
    for t in range(q.shape[1]):
        s = s * torch.exp(g[:, t])[..., None, None]
        delta = (v[:, t] - torch.einsum("nhvk,nhk->nhv", s, k[:, t])) * beta[:, t][..., None]
        s = s + delta[..., :, None] * k[:, t][..., None, :]
        outs.append(torch.einsum("nhvk,nhk->nhv", s, q[:, t]))
        states.append(s)
    return torch.stack(outs, 1), torch.stack(states, 1)


def chunked_delta_rule(
    s0: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence in chunks (the WY form FLA's chunk kernel computes): s0 [Hv, Dv, Dk]; q, k [L, Hk, Dk];
    v [L, Hv, Dv]; g, beta [L, Hv] -> outputs [L, Hv, Dv] and the final state [Hv, Dv, Dk].
    Within a chunk, with G the cumulative log decay and U the corrected values:
        (I + tril_strict(beta_t e^(G_t - G_s) k_t.k_s)) U = beta (V - e^G K S0^T)
        O = e^G Q S0^T + tril(e^(G_t - G_s) q_t.k_s) U;   S = e^(G_L) S0 + U^T e^(G_L - G) K."""
    rep = v.shape[1] // q.shape[1]
    q = (l2norm(q) * scale).repeat_interleave(rep, dim=1).transpose(0, 1)  # [H, L, Dk]
    k = l2norm(k).repeat_interleave(rep, dim=1).transpose(0, 1)
    v, g, beta = v.transpose(0, 1), g.transpose(0, 1), beta.transpose(0, 1)  # [H, L, Dv], [H, L]
    s, outs = s0, []
    for start in range(0, q.shape[1], chunk):
        qc, kc, vc = q[:, start : start + chunk], k[:, start : start + chunk], v[:, start : start + chunk]
        gc, bc = g[:, start : start + chunk].cumsum(-1), beta[:, start : start + chunk]
        n = qc.shape[1]
        lower = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        decay = torch.exp((gc[:, :, None] - gc[:, None, :]).masked_fill(~lower, float("-inf")))  # [H, t, s]
        a = (bc[:, :, None] * decay * (kc @ kc.transpose(-1, -2))).masked_fill(
            lower.logical_not().logical_or(torch.eye(n, dtype=torch.bool, device=q.device)), 0.0
        )
        rhs = bc[..., None] * (vc - torch.exp(gc)[..., None] * (kc @ s.transpose(-1, -2)))
        eye = torch.eye(n, device=q.device).expand_as(a)
        u = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        outs.append(torch.exp(gc)[..., None] * (qc @ s.transpose(-1, -2)) + (decay * (qc @ kc.transpose(-1, -2))) @ u)
        last = gc[:, -1:]
        s = torch.exp(last)[..., None] * s + (u * torch.exp(last - gc)[..., None]).transpose(-1, -2) @ kc
    return torch.cat(outs, 1).transpose(0, 1), s


def gdn_core(
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    page: torch.Tensor,
    layout: StatePage,
    md,
    weights: dict[str, torch.Tensor],
    out: torch.Tensor,
    d: GDNDims,
    padded_conv_unwritten: bool = False,
) -> torch.Tensor:
    """The GDN core of one layer over the step (module docstring): out [T, Hv, Dv].
    padded_conv_unwritten: the mutation suite's broken kernel (sglang #30974), whose conv output
    rows of padded requests are never written: NaN there (what a capture's fresh memory holds
    under the CPU emulation; on a GPU whatever the graph pool held), fed to the recurrence."""
    conv_plane, state_plane = layout.conv(page), layout.state(page)  # [slots, W, C], [slots, Hv, Dv, Dk]
    w, A_log, dt_bias = weights["conv_w"], weights["A_log"], weights["dt_bias"]
    scale, pad, km1 = d.head_k_dim**-0.5, md.pad_slot, d.conv_kernel - 1
    if padded_conv_unwritten:

        def conv_window_(window, weight, idx):  # the broken kernel's conv
            cx = conv_window(window, weight)
            return torch.where(_valid(idx, pad).view(-1, 1, 1), cx, torch.full_like(cx, float("nan")))
    else:

        def conv_window_(window, weight, idx):
            return conv_window(window, weight)

    res = torch.zeros(out.shape[0], d.num_v_heads, d.head_v_dim, dtype=torch.float32, device=out.device)
    lead = 0  # tokens of the decode / verify rows
    if md.num_spec_decodes and md.spec_state_indices_tensor is not None:
        lead = _verify(
            mixed_qkv, b, a, conv_plane, state_plane, md, w, A_log, dt_bias, res, d, scale, pad, conv_window_
        )
    elif md.num_decodes and md.non_spec_state_indices_tensor is not None:
        lead = _decode(
            mixed_qkv, b, a, conv_plane, state_plane, md, w, A_log, dt_bias, res, d, scale, pad, km1, conv_window_
        )
    if md.num_prefills:
        _prefills(mixed_qkv, b, a, conv_plane, state_plane, md, w, A_log, dt_bias, res, d, scale, pad, km1, lead)
    out[: res.shape[0]].copy_(res.to(out.dtype))
    return out


def _decode(x, b, a, conv, state, md, w, A_log, dt_bias, res, d, scale, pad, km1, conv_fn) -> int:
    """Non-spec decodes (one token a row, k = 0): every padded row of a FULL graph too."""
    n = md.num_actual_tokens if md.num_prefills == 0 else md.num_decode_tokens
    idx = md.non_spec_state_indices_tensor[:n]
    hist = read_slots(conv, idx, pad)[:, :km1]  # [n, K - 1, C]
    window = torch.cat([hist, x[:n, None].float()], 1)
    cx = conv_fn(window, w, idx)  # [n, 1, C]
    new_conv = read_slots(conv, idx, pad)
    new_conv[:, :km1] = window[:, 1:]
    write_slots(conv, idx, new_conv, pad)
    q, k, v = split_qkv(cx, d)
    g, beta = gating(a[:n, None], b[:n, None], A_log, dt_bias)
    o, states = delta_rule(read_slots(state, idx, pad), q, k, v, g, beta, scale)
    write_slots(state, idx, states[:, -1], pad)
    res[:n] = o[:, 0]
    return n


def _verify(x, b, a, conv, state, md, w, A_log, dt_bias, res, d, scale, pad, conv_fn) -> int:
    """Spec rows of 1 + k tokens: initial state column a - 1, conv window at offset a - 1; the state
    after token t to column t; the conv buffer shifted to [W[a : a+K-2], x_0 .. x_k]."""
    cols = d.columns
    # rows from the tokens (a FULL graph's padded requests included), not from a buffer's length
    rows = md.num_actual_tokens // cols if md.num_prefills == 0 else md.num_spec_decodes
    n = rows * cols
    idx = md.spec_state_indices_tensor[:rows]  # [R, 1 + k]
    acc = md.num_accepted_tokens[:rows].long()
    first = idx[:, 0]
    buf = read_slots(conv, first, pad)  # [R, W, C]
    xs = x[:n].float().view(rows, cols, -1)
    off = (acc - 1).clamp(min=0)[:, None] + torch.arange(d.conv_kernel - 1, device=x.device)[None, :]
    hist = buf.gather(1, off[..., None].expand(-1, -1, buf.shape[-1]))  # [R, K - 1, C]
    window = torch.cat([hist, xs], 1)
    cx = conv_fn(window, w, first)  # [R, 1 + k, C]
    keep = d.conv_kernel - 2
    shift = acc[:, None] + torch.arange(keep, device=x.device)[None, :]
    new_conv = torch.cat([buf.gather(1, shift[..., None].expand(-1, -1, buf.shape[-1])), xs], 1)
    write_slots(conv, first, new_conv, pad)
    q, k, v = split_qkv(cx, d)
    g, beta = gating(a[:n].view(rows, cols, -1), b[:n].view(rows, cols, -1), A_log, dt_bias)
    start = idx.gather(1, (acc - 1).clamp(min=0)[:, None])[:, 0]
    o, states = delta_rule(read_slots(state, start, pad), q, k, v, g, beta, scale)
    for t in range(cols):
        write_slots(state, idx[:, t], states[:, t], pad)
    res[:n] = o.reshape(n, *o.shape[2:])
    return n


def _prefills(x, b, a, conv, state, md, w, A_log, dt_bias, res, d, scale, pad, km1, lead) -> None:
    """Prefill rows one by one (eager: host offsets), chunked; column 0 and W[0:K-1] read (when the
    row has context) and written."""
    qsl = md.non_spec_query_start_loc.tolist()
    idx_all = md.non_spec_state_indices_tensor
    init = md.has_initial_state
    first_row = len(qsl) - 1 - md.num_prefills  # k = 0: the decodes lead the non-spec rows
    for r in range(first_row, len(qsl) - 1):
        lo, hi = lead - qsl[first_row] + qsl[r], lead - qsl[first_row] + qsl[r + 1]
        if hi <= lo:
            continue
        idx = idx_all[r : r + 1]
        buf = read_slots(conv, idx, pad)
        has = init[r : r + 1].view(1, 1, 1)
        hist = torch.where(has, buf[:, :km1], torch.zeros_like(buf[:, :km1]))
        window = torch.cat([hist, x[lo:hi][None].float()], 1)
        cx = conv_window(window, w)[0]
        buf[:, :km1] = window[:, -km1:]
        write_slots(conv, idx, buf, pad)
        q, k, v = split_qkv(cx, d)
        g, beta = gating(a[lo:hi], b[lo:hi], A_log, dt_bias)
        s0 = torch.where(
            has.view(1, 1, 1, 1), read_slots(state, idx, pad), torch.zeros(1, *state.shape[1:], device=x.device)
        )[0]
        o, s = chunked_delta_rule(s0, q, k, v, g, beta, scale)
        write_slots(state, idx, s[None], pad)
        res[lo:hi] = o
