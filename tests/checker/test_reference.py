"""The fp32 reference (backend/harness/reference.py): requests of one shape run as one batch, and
each still attends only to its own K/V, as one request at a time would."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backend.harness import reference
from backend.harness.reference import reference_attention


def one_at_a_time(query, ks, vs, query_lens, scale):
    """The reference's definition, request by request (what batching must not change)."""
    out, start = torch.zeros(query.shape), 0
    for q_len, k, v in zip(query_lens, ks, vs):
        s, rep = k.shape[0], query.shape[1] // k.shape[1]
        q = query[start : start + q_len].float().transpose(0, 1)
        k32 = k.float().repeat_interleave(rep, dim=1).transpose(0, 1)
        v32 = v.float().repeat_interleave(rep, dim=1).transpose(0, 1)
        mask = torch.arange(s)[None, :] <= torch.arange(q_len)[:, None] + (s - q_len)
        out[start : start + q_len] = F.scaled_dot_product_attention(q, k32, v32, attn_mask=mask, scale=scale).transpose(
            0, 1
        )
        start += q_len
    return out


@pytest.mark.parametrize(
    ("query_lens", "seq_lens", "group_bytes"),
    [
        ([1] * 6, [40] * 6, 1 << 30),  # a decode batch: one call
        ([1] * 6, [40] * 6, 2 * 40 * 2 * 16 * 4 * 2),  # two requests a call (K and V, fp32, 2 kv heads)
        ([1, 1, 5, 1, 9], [17, 17, 5, 30, 40], 1 << 30),  # shapes change: five calls
        ([3, 3, 3], [3, 10, 10], 1 << 30),
    ],
)
def test_batched_requests_match_one_at_a_time(query_lens, seq_lens, group_bytes, monkeypatch):
    monkeypatch.setattr(reference, "GROUP_BYTES", group_bytes)
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, d = 8, 2, 16
    query = torch.randn(sum(query_lens), heads, d, generator=gen).bfloat16()
    ks = [torch.randn(s, kv_heads, d, generator=gen).bfloat16() for s in seq_lens]
    vs = [torch.randn(s, kv_heads, d, generator=gen).bfloat16() for s in seq_lens]
    got = reference_attention(query, iter(ks), iter(vs), query_lens, 0.25)
    torch.testing.assert_close(got, one_at_a_time(query, ks, vs, query_lens, 0.25), atol=1e-6, rtol=1e-5)


def test_a_request_sees_only_its_own_keys():
    """Two decode requests batched together: changing the second's K/V leaves the first's row."""
    gen = torch.Generator().manual_seed(1)
    query = torch.randn(2, 4, 8, generator=gen)
    ks = [torch.randn(12, 4, 8, generator=gen) for _ in range(2)]
    vs = [torch.randn(12, 4, 8, generator=gen) for _ in range(2)]
    before = reference_attention(query, ks, vs, [1, 1], 0.3)
    after = reference_attention(query, [ks[0], ks[1] * 3], [vs[0], vs[1] + 1], [1, 1], 0.3)
    assert torch.equal(before[0], after[0])
    assert not torch.allclose(before[1], after[1])


@pytest.mark.parametrize("chunk_bytes", [1, 3 * 4 * 4, 1 << 20])
def test_the_rounded_context_rounds_runs_of_requests_as_each_alone(chunk_bytes, monkeypatch):
    """step_data.RoundedContext rounds neighbouring requests together (at most CHUNK_BYTES, at
    least one): every request's rows as rounding it alone gives, in any order of access."""
    from backend.harness.reference import fp8_round
    from backend.harness.step_data import RoundedContext

    monkeypatch.setattr(RoundedContext, "CHUNK_BYTES", chunk_bytes)
    lens = [3, 0, 5, 1, 4]
    values = torch.randn(sum(lens), 4, generator=torch.Generator().manual_seed(3)) * 300
    calls = []

    def rounding(t):
        calls.append(t.shape[0])
        return fp8_round(t, 0.5, torch.float8_e4m3fn)

    ctx = RoundedContext(values, rounding, lens)
    alone = [fp8_round(part, 0.5, torch.float8_e4m3fn) for part in torch.split(values, lens)]
    for i in [0, 1, 2, 3, 4, 2, 0, -1]:
        assert torch.equal(ctx[i], alone[i])
    assert [torch.equal(a, b) for a, b in zip(ctx[1:4], alone[1:4])] == [True] * 3
    if chunk_bytes >= 1 << 20:
        assert calls == [sum(lens)]  # one rounding of every row, not one per request
