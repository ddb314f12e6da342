"""The hybrid_gdn family's fp32 reference (backend/families/gdn_reference.py): its two forms of the
gated delta rule agree (token by token, and chunked as a chunk kernel computes it), they can
disagree, and a step reads and leaves the state layout as the contract says (backend/attention/gdn.py)."""

from __future__ import annotations

import pytest
import torch

from backend.families.gdn_reference import StateContext, chunked, recurrent, reference_layer
from backend.harness.model import make_weights
from tests.families.conftest import TINY_GDN

H, DK, DV = 4, 16, 16


def _inputs(seed: int, length: int, with_state: bool = True):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(length, H, DK, generator=g), dim=-1) * DK**-0.5
    k = torch.nn.functional.normalize(torch.randn(length, H, DK, generator=g), dim=-1)
    v = torch.randn(length, H, DV, generator=g)
    gate = -torch.rand(length, H, generator=g) * 0.2  # log decay
    beta = torch.rand(length, H, generator=g)
    s0 = 0.5 * torch.randn(H, DV, DK, generator=g) if with_state else torch.zeros(H, DV, DK)
    return s0, q, k, v, gate, beta


# (scenario, length, chunk): within one chunk, chunks that end mid-row, several chunks, one token
LENGTHS = {
    "one chunk": (40, 64),
    "a partial last chunk": (150, 64),
    "chunk 128": (300, 128),
    "one token": (1, 64),
    "exactly two chunks": (128, 64),
}


@pytest.mark.parametrize("name", LENGTHS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_by_token_and_chunked_forms_agree(name, seed):
    length, chunk = LENGTHS[name]
    s0, q, k, v, g, beta = _inputs(seed, length)
    o1, states = recurrent(s0, q, k, v, g, beta)
    o2, final = chunked(s0, q, k, v, g, beta, chunk=chunk)
    torch.testing.assert_close(o2, o1, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, states[-1], atol=1e-4, rtol=1e-4)


def test_the_forms_can_disagree():
    """The agreement can fail: the chunked form started from a zero state instead of the row's
    is far from the recurrence (the comparison above is not vacuous)."""
    s0, q, k, v, g, beta = _inputs(0, 70)
    o1, _ = recurrent(s0, q, k, v, g, beta)
    o2, _ = chunked(torch.zeros_like(s0), q, k, v, g, beta)  # the initial state dropped
    assert (o1 - o2).abs().max() > 1e-1


def _context(n_cols: int, fresh, spec, accepted, seed: int = 0):
    dims = dict(TINY_GDN.dims)
    c = 2 * dims["num_k_heads"] * dims["head_k_dim"] + TINY_GDN.num_heads * TINY_GDN.head_size
    width = dims["conv_kernel"] - 1 + n_cols - 1
    g = torch.Generator().manual_seed(seed)
    n = len(fresh)
    conv = torch.randn(n, n_cols, width, c, generator=g)
    state = torch.randn(n, n_cols, TINY_GDN.num_heads, TINY_GDN.head_size, dims["head_k_dim"], generator=g)
    return StateContext(conv, state, tuple(fresh), tuple(spec), tuple(accepted))


def _run(ctx: StateContext, query_lens):
    weights = make_weights(TINY_GDN)[0].attn  # layer 0: a GDN layer
    h = torch.randn(sum(query_lens), TINY_GDN.hidden_size, generator=torch.Generator().manual_seed(5))
    return reference_layer(weights, h, ctx, query_lens, TINY_GDN, lambda t: t.to(torch.bfloat16).float())


def test_a_verify_row_reads_its_accepted_column_and_writes_one_per_token():
    """k = 2, accepted 2: the state is read from column 1 and the conv window at offset 1; after
    token t the state sits in column t; the conv buffer is [W[2:4], x_0, x_1, x_2]."""
    ctx = _context(3, [False], [True], [2])
    before_conv, before_state = ctx.conv.clone(), ctx.state.clone()
    _run(ctx, [3])
    assert not torch.equal(ctx.post_state[0, 0], before_state[0, 0])  # every column written
    assert not torch.equal(ctx.post_state[0, 2], before_state[0, 2])
    assert torch.equal(ctx.post_conv[0, 0, :2], before_conv[0, 0, 2:4])  # the history shifted by 2
    reads_column_0 = _context(3, [False], [True], [1])
    reads_column_0.conv, reads_column_0.state = before_conv.clone(), before_state.clone()
    _run(reads_column_0, [3])
    assert not torch.allclose(reads_column_0.post_state[0, 2], ctx.post_state[0, 2])  # another start


def test_a_fresh_prompt_reads_zeros_and_leaves_the_other_columns():
    """A prompt's first chunk reads no state (its recycled slot's leftover is ignored), writes
    column 0 and the conv window W[0:K-1], and leaves the spec columns and W[K-1:] as they were."""
    ctx = _context(3, [True], [False], [1], seed=1)
    leftover = _context(3, [True], [False], [1], seed=2)
    leftover.conv[:, :, 3:] = ctx.conv[:, :, 3:]
    leftover.state[:, 1:] = ctx.state[:, 1:]
    out_a, out_b = _run(ctx, [5]), _run(leftover, [5])
    assert torch.equal(out_a, out_b)  # the leftover is not read
    assert torch.equal(ctx.post_state[0, 1:], ctx.state[0, 1:])
    assert torch.equal(ctx.post_conv[0, 0, 3:], ctx.conv[0, 0, 3:])
    assert ctx.forms == ["recurrent"]
    long = _context(1, [True], [False], [1])
    _run(long, [70])
    assert long.forms == ["chunked"]  # rows longer than a chunk take the chunked form
