"""swa_sinks at op level: the family's fp32 reference against a scalar loop of the definition,
the torch provider's 2-D and 3-D paths against the reference, and the KV-cache groups' builder:
one set of shared tensors, one block table per group, the window group's freed blocks."""

from __future__ import annotations

import math

import pytest
import torch

from backend.attention.interface import AttentionConfig
from backend.families import family
from backend.families.swa_sinks import reference_window_sinks
from backend.harness.steps import make_step_inputs, plan_steps
from backend.providers.torch_swa import combine
from tests.families.conftest import SWA_MIXED, TINY_SWA, swa_model


def scalar_reference(q, k, v, scale, window, sinks):
    """The definition, one (token, head) at a time: key j visible iff j <= i and i - j < W; the
    sink exp(sink_h - m) once in the denominator, unscaled, no value."""
    q_len, s, h = q.shape[0], k.shape[0], q.shape[1]
    rep = h // k.shape[1]
    out = torch.zeros(q_len, h, v.shape[-1], dtype=torch.float64)
    for t in range(q_len):
        i = s - q_len + t
        for hh in range(h):
            js = [j for j in range(s) if j <= i and (window is None or i - j < window)]
            logits = [float(q[t, hh].double() @ k[j, hh // rep].double()) * scale for j in js]
            extra = [float(sinks[hh])] if sinks is not None else []
            m = max(logits + extra)
            den = sum(math.exp(x - m) for x in logits + extra)
            for x, j in zip(logits, js):
                out[t, hh] += math.exp(x - m) / den * v[j, hh // rep].double()
    return out.float()


@pytest.mark.parametrize("window", [None, 1, 5, 8])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_reference_is_the_definition(window, with_sinks):
    g = torch.Generator().manual_seed(window or 0)
    q, k, v = torch.randn(3, 4, 8, generator=g), torch.randn(11, 2, 8, generator=g), torch.randn(11, 2, 8, generator=g)
    sinks = torch.randn(4, generator=g) * 2 if with_sinks else None
    got = reference_window_sinks(q, k, v, 0.3, window, sinks)
    torch.testing.assert_close(got, scalar_reference(q, k, v, 0.3, window, sinks), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 3])
def test_a_batch_of_requests_is_each_request_on_its_own(window):
    """Requests of one shape batched (the family's reference runs them so): each row as alone."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (
        torch.randn(3, 2, 4, 8, generator=g),
        torch.randn(3, 9, 2, 8, generator=g),
        torch.randn(3, 9, 2, 8, generator=g),
    )
    sinks = torch.randn(4, generator=g)
    got = reference_window_sinks(q, k, v, 0.3, window, sinks)
    for n in range(3):
        torch.testing.assert_close(got[n], scalar_reference(q[n], k[n], v[n], 0.3, window, sinks), atol=1e-5, rtol=1e-5)


def test_the_sink_changes_the_answer():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 4, 8, generator=g), torch.randn(9, 2, 8, generator=g), torch.randn(9, 2, 8, generator=g)
    sinks = torch.full((4,), 1.5)
    with_sink, without = (reference_window_sinks(q, k, v, 0.3, 4, s) for s in (sinks, None))
    assert (with_sink - without).abs().max() > 1e-2
    scaled = reference_window_sinks(q, k, v, 0.3, 4, sinks * 0.3)
    assert (with_sink - scaled).abs().max() > 1e-2


@pytest.mark.parametrize("segments", [1, 4, 16])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_two_and_three_d_paths_agree_with_each_other(segments, with_sinks):
    """combine's split-KV merge is the 2-D softmax's, the sink counted once (segment 0)."""
    g = torch.Generator().manual_seed(segments)
    scores = torch.randn(2, 5, 2, 37, generator=g)
    scores[:, 1, :, 20:] = float("-inf")  # a row with a short prefix
    scores[:, 3] = float("-inf")  # a row with no key
    v = torch.randn(2, 5, 37, 8, generator=g)
    sinks = torch.randn(2, 1, 2, 1, generator=g) if with_sinks else None
    two_d = combine(scores, v, sinks, 1)
    torch.testing.assert_close(combine(scores, v, sinks, segments), two_d, atol=1e-5, rtol=1e-5)
    if with_sinks and segments > 1:  # the broken kernel: the sink in every segment
        assert (combine(scores, v, sinks, segments, sink_in_every_segment=True) - two_d).abs().max() > 1e-3
    assert torch.isfinite(two_d).all() and two_d[:, 3].abs().max() == 0


def _config() -> AttentionConfig:
    from backend.harness.model import TPLayout
    from backend.harness.session import attention_config

    return attention_config(TINY_SWA, TPLayout(1, 0, 4, 2, 16), "auto", (1, 2, 4, 8), "cpu")


def test_groups_share_the_common_tensors_and_own_their_tables():
    from backend.attention.registry import get_backend

    cls = get_backend("torch", "swa_sinks")
    builder = family("swa_sinks").make_builder(cls, _config(), TINY_SWA)
    plan = plan_steps(SWA_MIXED, TINY_SWA, (1, 2, 4, 8), 3, 0)[0]
    inputs = make_step_inputs(plan, TINY_SWA, 0, context=False)
    md = builder.build(inputs.batches)
    assert len(md) == 4 and md[0] is md[2] and md[1] is md[3]  # layers 0, 2: window group; 1, 3: full
    window, full = md[0], md[1]
    assert window.query_start_loc is full.query_start_loc and window.seq_lens is full.seq_lens  # shared objects
    assert window.block_table.data_ptr() != full.block_table.data_ptr()  # each group its own table
    assert (window.sliding_window, full.sliding_window) == (32, None)  # the group specs' windows
    # The window group freed the blocks wholly outside every query's window (request 2: seq 70,
    # query 1, context 69: keys from 69 - 32 + 1 = 38 on, so blocks 0 and 1 of 16 are null).
    table = inputs.groups[0].batch.block_table
    assert table[2, :2].tolist() == [0, 0] and (table[2, 2:5] > 0).all()
    assert (inputs.groups[1].batch.block_table[2, :5] > 0).all()  # the full group keeps them
    captured = builder.build_for_capture(8, 1)
    assert captured[0].query_start_loc is captured[1].query_start_loc


def test_merged_layout_is_one_group_carrying_the_first_layers_window():
    merged = swa_model(kv_groups="merged")
    groups = family("swa_sinks").groups(merged)
    assert len(groups) == 1 and groups[0].sliding_window == 32 and not groups[0].frees_outside_window
    plan = plan_steps(SWA_MIXED, merged, (1, 2, 4, 8), 3, 0)[0]
    inputs = make_step_inputs(plan, merged, 0, context=False)
    assert len(inputs.groups) == 1 and inputs.groups[0].ctx_rows is None  # every block kept
