"""Step plans: kinds kept, sizes within the graphs, padding and shuffled blocks; seeded."""

from __future__ import annotations

import pytest

from backend.case import BatchSpec
from backend.harness.steps import make_step_inputs, plan_steps
from tests.checker.conftest import CAPTURE_SIZES, DECODE, MIXED, TINY

PREFILL = BatchSpec("prefill", (5, 9), (5, 40))


@pytest.mark.parametrize("batch", [DECODE, MIXED, PREFILL], ids=lambda b: b.name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plans_keep_kind_and_fit_the_graphs(batch, seed):
    plans = plan_steps(batch, TINY, CAPTURE_SIZES, 5, seed)
    assert len(plans) == 5
    assert (plans[0].query_lens, plans[0].seq_lens) == (batch.query_lens, batch.seq_lens)
    assert plans[1].query_lens == batch.query_lens and plans[1].seq_lens != batch.seq_lens
    for p in plans:
        kind = BatchSpec("x", p.query_lens, p.seq_lens).kind
        assert kind == batch.kind
        assert p.num_tokens <= max(CAPTURE_SIZES) and len(p.query_lens) <= TINY.max_num_seqs
        assert all(1 <= q <= s <= TINY.max_model_len for q, s in zip(p.query_lens, p.seq_lens))
    assert plans[2].num_tokens not in CAPTURE_SIZES  # padding exercised
    assert plans == plan_steps(batch, TINY, CAPTURE_SIZES, 5, seed)


def test_step_inputs_slots_and_blocks():
    plans = plan_steps(MIXED, TINY, CAPTURE_SIZES, 2, 0)
    first, second = (make_step_inputs(p, TINY, 0) for p in plans)
    bs = TINY.block_size
    # every slot in its request's blocks, block 0 never used
    for inputs in (first, second):
        d = inputs.batch
        assert d.slot_mapping.numel() == sum(d.query_lens)
        assert (d.slot_mapping >= bs).all()
        start = 0
        for r, (q, s) in enumerate(zip(d.query_lens, d.seq_lens)):
            blocks = set(d.block_table[r, : -(-s // bs)].tolist())
            slots = d.slot_mapping[start : start + q].tolist() + inputs.ctx_slots[r].tolist()
            assert {x // bs for x in slots} <= blocks and len(slots) == s
            start += q
    for inputs in (first, second):  # every step shuffled (step 0 too), not contiguous
        rows = inputs.batch.block_table[0, :3].tolist()
        assert rows != sorted(rows) or rows[-1] - rows[0] != 2, rows


@pytest.mark.parametrize("spec_tokens", [0, 2])
def test_every_step_shuffles_its_blocks(spec_tokens):
    plans = plan_steps(DECODE, TINY, CAPTURE_SIZES, 5, 0, spec_tokens=spec_tokens)
    assert all(p.shuffle_blocks for p in plans)
    tables = [make_step_inputs(p, TINY, 0).batch.block_table for p in plans]
    firsts = {int(t[0, 0]) for t in tables}
    assert len(firsts) > 1 and firsts != {1}  # not the contiguous pool from block 1


@pytest.mark.parametrize("seed", range(6))
def test_plans_fit_a_small_kv_cache_by_shortening_context(seed):
    import dataclasses

    small = dataclasses.replace(TINY, num_blocks=26)  # 25 usable blocks; the spec needs 24
    batch = BatchSpec("d", (1,) * 6, (60,) * 6)  # 24 blocks: fits
    plans = plan_steps(batch, small, CAPTURE_SIZES, 6, seed)
    unbounded = plan_steps(batch, TINY, CAPTURE_SIZES, 6, seed)
    assert plans[0] == unbounded[0]
    for p, u in zip(plans, unbounded):
        need = sum(-(-s // small.block_size) for s in p.seq_lens)
        assert need <= 25 and p.query_lens == u.query_lens
        assert all(q <= s <= su for q, s, su in zip(p.query_lens, p.seq_lens, u.seq_lens))
        inputs = make_step_inputs(p, small, seed)
        assert int(inputs.batch.block_table.max()) < 26 and (inputs.batch.slot_mapping < 26 * small.block_size).all()
    assert any(p != u for p, u in zip(plans, unbounded))  # the budget did bite


def test_the_host_part_is_cached_by_plan_shape_and_seed():
    """Block tables, slots and x are kept across the modes of a batch (steps.HOST_PARTS); a hit
    gives what a fresh draw gives, and another seed or step never gets them."""
    import torch

    from backend.harness import steps

    plans = plan_steps(MIXED, TINY, CAPTURE_SIZES, 3, 0)
    steps.HOST_PARTS.clear()
    fresh = make_step_inputs(plans[1], TINY, 0)
    hit = make_step_inputs(plans[1], TINY, 0)
    assert hit.x is fresh.x  # the cached host part
    steps.HOST_PARTS.clear()
    again = make_step_inputs(plans[1], TINY, 0)
    assert torch.equal(again.x, fresh.x) and torch.equal(again.batch.slot_mapping, fresh.batch.slot_mapping)
    assert torch.equal(torch.cat(again.ctx_slots), torch.cat(fresh.ctx_slots))
    other_seed = make_step_inputs(plans[1], TINY, 1)  # the same plan drawn under another seed
    other_step = make_step_inputs(plans[2], TINY, 0)
    for other in (other_seed, other_step):
        assert not torch.equal(other.x[:1], fresh.x[:1])
