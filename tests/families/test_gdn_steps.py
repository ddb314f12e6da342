"""hybrid_gdn's steps (backend/families/gdn_steps.py): requests continue from step to step with
their state slots, grow by their accepted length, and finished requests' slots go to new prompts."""

from __future__ import annotations

import itertools

import pytest

from backend.case import BatchSpec
from backend.families import family
from tests.families.conftest import GDN_DECODE, GDN_MIXED, TINY_GDN

SIZES = (1, 2, 4, 8, 16, 32)


def plans(batch: BatchSpec, k: int, steps: int = 4, seed: int = 0):
    return family("hybrid_gdn").step_state().plan_steps(batch, TINY_GDN, SIZES, steps, seed, k)


def rows(plan):
    c = plan.carry
    return {
        rid: (q, s, c.fresh[i], c.accepted[i], tuple(g[i] for g in c.slots))
        for i, (rid, q, s) in enumerate(zip(c.ids, plan.query_lens, plan.seq_lens))
    }


@pytest.mark.parametrize("k", [0, 2])
@pytest.mark.parametrize("batch", [GDN_DECODE, GDN_MIXED], ids=["decode", "mixed"])
def test_requests_continue_with_their_slots_and_grow_by_their_accepted_length(batch, k):
    steps = plans(batch, k)
    for before, after in itertools.pairwise(steps):
        a, b = rows(before), rows(after)
        continued = set(a) & set(b)
        assert continued, "no request continued"
        for rid in continued:
            q0, s0, fresh0, _, slots0 = a[rid]
            q1, s1, fresh1, acc1, slots1 = b[rid]
            assert slots1 == slots0 and not fresh1  # its slots for life; it has state now
            assert s1 - s0 == (acc1 if q0 == 1 + k and not fresh0 else q1)  # seq grows by what was kept


def test_decodes_lead_and_spec_rows_carry_their_drafts():
    for k in (0, 2):
        for plan in plans(GDN_MIXED, k):
            c = plan.carry
            decode = [q == 1 + k and not f for q, f in zip(plan.query_lens, c.fresh)]
            assert decode == sorted(decode, reverse=True), plan  # decodes first
            assert [d >= 0 for d in c.drafts] == (decode if k else [False] * len(decode))


def test_a_finished_requests_slots_go_to_the_next_prompt():
    """The mixed batch: each later step one decode finishes and a new prompt takes its slots
    (a recycled slot, its leftover state to be read as zeros), the one-token prompt among them."""
    steps = plans(GDN_MIXED, 0, steps=5)
    seen_one_token = False
    for before, after in itertools.pairwise(steps):
        a, b = rows(before), rows(after)
        gone = set(a) - set(b)
        new = [rid for rid in b if rid not in a]
        assert gone and new
        assert all(b[rid][2] for rid in new)  # new requests are prompts
        freed = {slot for rid in gone for slot in a[rid][4]}
        assert any(set(b[rid][4]) & freed for rid in new), "no recycled slot"
        seen_one_token |= any(b[rid][0] == 1 and b[rid][1] == 1 for rid in new)
        assert all(before.carry.recycled[i] == before.carry.fresh[i] for i in range(len(before.query_lens)))
    assert seen_one_token


def test_no_two_requests_share_a_slot_and_slot_0_is_nobodys():
    for k in (0, 2):
        for batch in (GDN_DECODE, GDN_MIXED):
            for plan in plans(batch, k, steps=6):
                for group in plan.carry.slots:
                    flat = [s for row in group for s in row]
                    assert len(flat) == len(set(flat)) and 0 not in flat
