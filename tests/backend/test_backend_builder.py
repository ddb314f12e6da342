"""Persistent metadata buffers, padding values, the capture dummy batch, and the graph-safe KV write."""

from __future__ import annotations

import pytest
import torch

from backend.attention.builder import PersistentMetadataBuilder
from backend.attention.kv_cache import allocate_kv_cache, fp8_dtype, quantize_fp8, write_kv
from tests.backend.attn_batches import make_config, make_step


def test_build_pads_tail_and_reuses_buffers():
    config = make_config()
    builder = PersistentMetadataBuilder(config)
    big = make_step(config, [1, 5, 1, 3], [9, 12, 30, 3]).batch
    md1 = builder.build(big, num_padded_tokens=16, num_padded_reqs=6)
    small = make_step(config, [2, 1], [4, 7], seed=3).batch
    md2 = builder.build(small, num_padded_tokens=8, num_padded_reqs=5)
    # Same storage: a graph captured on md1's tensors sees md2's values.
    for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping", "query_lens"):
        assert getattr(md1, name).data_ptr() == getattr(md2, name).data_ptr(), name
    assert md2.query_start_loc.tolist() == [0, 2, 3, 3, 3, 3]
    assert md2.seq_lens.tolist() == [4, 7, 0, 0, 0]
    assert md2.query_lens.tolist() == [2, 1, 0, 0, 0]
    assert (md2.block_table[2:] == 0).all() and (builder.block_table[2:] == 0).all()
    assert md2.slot_mapping[3:].tolist() == [-1] * 5 and (builder.slot_mapping[3:] == -1).all()
    assert md2.block_table[0, :1].tolist() == small.block_table[0, :1].tolist()
    assert (md2.num_actual_tokens, md2.num_reqs, md2.max_query_len, md2.max_seq_len) == (3, 2, 2, 7)
    assert md2.slot_mapping[:3].tolist() == small.slot_mapping.tolist()


def test_build_for_capture_is_vllms_dummy_batch():
    config = make_config(max_num_seqs=8, max_model_len=64)
    builder = PersistentMetadataBuilder(config)
    md = builder.build_for_capture(4, style="v1")  # mixed graph: 4 tokens over 4 requests
    assert md.for_capture and md.max_query_len == 4 and md.num_reqs == 4  # host max_query_len = N
    assert md.seq_lens.tolist() == [64] * 4
    md = builder.build_for_capture(20, style="v1")  # 20 tokens over min(20, 8) requests
    assert md.num_reqs == 8 and md.num_padded_tokens == 20
    assert md.query_lens.tolist() == [2] * 7 + [6]
    assert (md.block_table >= 1).all() and (md.block_table < config.num_blocks).all()
    assert (md.slot_mapping == -1).all()


def test_kv_write_skips_pad_slots_and_leaves_the_rest():
    config = make_config()
    cache = allocate_kv_cache(config).normal_()
    before = cache.clone()
    key = torch.randn(4, config.num_kv_heads, config.head_size).to(config.dtype)
    slots = torch.tensor([9, -1, 17, -1])
    one = torch.ones(1)
    write_kv(cache, key, key * 2, slots, one, one)
    flat_k, flat_v = cache[0].flatten(0, 1), cache[1].flatten(0, 1)
    assert torch.equal(flat_k[9], key[0]) and torch.equal(flat_v[17], key[2] * 2)
    changed = (cache != before).flatten(3).any(-1).flatten(1, 2)  # [2, slots]
    assert sorted(changed.any(0).nonzero().flatten().tolist()) == [9, 17]
    assert torch.equal(cache[:, 0], before[:, 0]), "null block untouched"


def test_kv_write_fp8_round_trip_with_scales():
    config = make_config(kv_cache_dtype="fp8")
    cache = allocate_kv_cache(config)
    assert cache.dtype == fp8_dtype(torch.device("cpu")) == torch.float8_e4m3fn
    key = torch.randn(3, config.num_kv_heads, config.head_size) * 4
    k_scale, v_scale = torch.tensor([0.05]), torch.tensor([2.0])
    write_kv(cache, key, key, torch.tensor([5, 6, 7]), k_scale, v_scale)
    k_back = cache[0].flatten(0, 1)[5:8].float() * k_scale
    v_back = cache[1].flatten(0, 1)[5:8].float() * v_scale
    torch.testing.assert_close(k_back, key, atol=0.05 * 30, rtol=0.13)  # saturates at 448 * scale
    torch.testing.assert_close(v_back, key, atol=0.2, rtol=0.13)
    # The scale is applied, not ignored: the raw fp8 values are key / scale.
    torch.testing.assert_close(cache[1].flatten(0, 1)[5:8].float(), key / 2.0, atol=0.1, rtol=0.13)


def _select_per_row_write(cache, key, value, slot_mapping, k_scale, v_scale):
    """The KV write as it was before it became one pass: every redirected row read back and
    selected per row. Its bytes are the contract."""
    for c, x, scale in ((cache[0], key, k_scale), (cache[1], value, v_scale)):
        raw = c.flatten(0, 1).view(torch.uint8 if c.element_size() == 1 else torch.int16)
        x = x[: slot_mapping.shape[0]]
        new = quantize_fp8(x, scale, c.dtype) if c.element_size() == 1 else x.to(c.dtype)
        new = new.view(raw.dtype)
        index = slot_mapping.clamp(min=0)
        raw.index_copy_(0, index, torch.where((slot_mapping >= 0)[:, None, None], new, raw.index_select(0, index)))


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("pads", [0, 1, 5], ids=lambda n: f"{n}_pads")
def test_kv_write_leaves_the_bytes_the_per_row_select_left(kv_cache_dtype, pads):
    """Context fills (thousands of real slots), decode writes and padded graph writes: the same
    cache bytes as the three-pass write, from a strided rank slice of a wider draw too."""
    config = make_config(kv_cache_dtype=kv_cache_dtype)
    gen = torch.Generator().manual_seed(11 + pads)
    start = allocate_kv_cache(config)
    noise = torch.randint(0, 256, start.view(torch.uint8).shape, generator=gen, dtype=torch.uint8)
    start.view(torch.uint8).copy_(noise)
    num_slots = config.num_blocks * config.block_size
    for n in (3, num_slots // 2):
        slots = torch.randperm(num_slots - config.block_size, generator=gen)[:n] + config.block_size
        slots[torch.randperm(n, generator=gen)[:pads]] = -1
        draw = torch.randn(n + 2, 2 * config.num_kv_heads, config.head_size, generator=gen) * 3
        key, value = draw[:, ::2], draw[:, 1::2]  # strided, and longer than the slot mapping
        scales = torch.tensor([0.03]), torch.tensor([0.02])
        ours, theirs = start.clone(), start.clone()
        write_kv(ours, key, value, slots, *scales)
        _select_per_row_write(theirs, key, value, slots, *scales)
        assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8)), n
        assert torch.equal(ours[:, 0].view(torch.uint8), start[:, 0].view(torch.uint8)), "null block as it was"
        wrote = not torch.equal(ours.view(torch.uint8), start.view(torch.uint8))
        assert wrote == (pads < n), "real slots written, and only those of an all-padded batch not"


def test_step_helper_writes_only_real_slots():
    config = make_config()
    step = make_step(config, [1, 3], [5, 3])
    assert step.batch.slot_mapping.shape[0] == 4
    assert (step.batch.slot_mapping >= config.block_size).all(), "no real slot in the null block"
