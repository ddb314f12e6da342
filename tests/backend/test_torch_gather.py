"""The torch provider's gather length: the blocks the metadata's host max_seq_len reaches in
eager steps, max_model_len in vLLM's capture batch, so that what a graph freezes covers any replay."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from backend.attention.builder import PersistentMetadataBuilder
from backend.providers.torch_backend import gather_length, paged_causal_attention
from tests.backend.attn_batches import make_config, make_step

CONFIG = make_config(max_model_len=64, block_size=4)  # 16 blocks a request


@pytest.mark.parametrize(
    "query_lens, seq_lens, length",
    [
        ((1, 1), (5, 9), 12),  # the longest request's blocks, whole
        ((1,), (4,), 4),
        ((1, 1), (64, 1), 64),  # a request at max_model_len: every block
        ((3, 1), (3, 2), 4),
    ],
)
def test_eager_gathers_the_blocks_its_batch_reaches(query_lens, seq_lens, length):
    md = PersistentMetadataBuilder(CONFIG).build(make_step(CONFIG, query_lens, seq_lens).batch)
    assert gather_length(md, CONFIG.block_size) == length


@pytest.mark.parametrize("style", ["v1", "v2"])
@pytest.mark.parametrize("tokens, uniform_q", [(4, 1), (8, 0), (6, 3)])
def test_a_capture_batch_gathers_max_model_len(style, tokens, uniform_q):
    md = PersistentMetadataBuilder(CONFIG).build_for_capture(tokens, uniform_q, style)
    assert gather_length(md, CONFIG.block_size) == CONFIG.max_model_len


def test_the_length_is_a_frozen_host_value_that_max_model_len_makes_safe():
    """What a graph captured with a short max_seq_len would do to a longer replay (drop keys), and
    that the capture batch's max_model_len gives eager's answer."""
    step = make_step(CONFIG, (1, 2), (40, 60), seed=3)
    md = PersistentMetadataBuilder(CONFIG).build(step.batch)
    attn = lambda m: paged_causal_attention(
        step.query, step.kv_cache[0], step.kv_cache[1], m, step.k_scale, step.v_scale, CONFIG.scale
    )
    eager = attn(md)
    frozen_short = attn(dataclasses.replace(md, max_seq_len=20))
    frozen_at_capture = attn(dataclasses.replace(md, max_seq_len=CONFIG.max_model_len))
    assert not torch.allclose(frozen_short, eager, atol=1e-3)
    torch.testing.assert_close(frozen_at_capture, eager, atol=1e-6, rtol=1e-6)
