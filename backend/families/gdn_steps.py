"""The steps of a hybrid_gdn case: requests that continue from step to step (DESIGN.md §11).

Step 0 is the batch spec (decode rows as verify rows of 1 + k under spec decode). Each later step
continues every request: a decode or verify row stays one, its seq_len grown by its accepted
length (1..k + 1, drawn: rejection sampling; 1 at k = 0); a prefill row (a prompt's first chunk,
or a chunk over context) becomes a decode row, except that a chunk over context keeps chunking in
a prefill-only batch. Every request keeps its state slots (1 + k per state group) for its life.
The spec's kind is kept (so the graph a mode uses for the spec is the one exercised):
  decode:  step 2 changes the request count (a request finishes, or one joins), preferring a
           token count that is not a capture size (padding), and under spec decode fewer requests
           that pad a FULL decode graph after the larger step;
  mixed:   each step the oldest decode finishes and a new prompt takes its slots (a recycled slot,
           holding the finished request's leftover state), its query len cycling over the spec's
           fresh prompts (the one-token prompt among them);
  prefill: chunks continue, fresh prompts continue as chunks.
Rows come decodes first (vLLM's reorder for GDN), then the prefills by query len.
Everything is drawn on the CPU from the case seed, identically on every tp rank.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from backend.case import BatchSpec, ModelShape
from backend.harness.steps import StepPlan, count_ranks


@dataclass(frozen=True)
class Carry:
    """One step's requests as the state groups see them (StepPlan.carry), row by row."""

    ids: tuple[int, ...]
    fresh: tuple[bool, ...]  # no prior state (seq_len == query_len)
    recycled: tuple[bool, ...]  # its slots held another request's state (its first step only)
    accepted: tuple[int, ...]  # num_accepted_tokens: the previous verify step's accepted length, else 1
    drafts: tuple[int, ...]  # k for a verify row, -1 for the rest
    slots: tuple[tuple[tuple[int, ...], ...], ...]  # per state group, per row: its 1 + k slots


@dataclass
class _Req:
    rid: int
    q: int
    s: int
    fresh: bool
    accepted: int
    slots: list[tuple[int, ...]]
    recycled: bool = False


def plan_steps(
    batch: BatchSpec,
    shape: ModelShape,
    capture_sizes,
    num_steps: int,
    seed: int,
    spec_tokens: int,
    state_groups: int,
    num_slots: int,
) -> list[StepPlan]:
    rng = random.Random(f"gdn-steps-{seed}-{batch.name}-{spec_tokens}")
    cols, dq = 1 + spec_tokens, 1 + spec_tokens
    pools = []
    for g in range(state_groups):  # slot 0 is the null slot; a seeded order per group
        free = list(range(1, num_slots))
        random.Random(f"gdn-slots-{seed}-{g}").shuffle(free)
        pools.append(free)
    # Under spec decode a decode row (one token over context) verifies 1 + k; a prompt stays as it is.
    qs, ss = zip(
        *[
            (dq, min(shape.max_model_len, s + spec_tokens)) if q == 1 and s > 1 else (q, s)
            for q, s in zip(batch.query_lens, batch.seq_lens)
        ]
    )
    fresh_lens = [q for q, s in zip(qs, ss) if q == s] or [1]
    next_id = [0]

    def take() -> list[tuple[int, ...]]:
        return [tuple(pool.pop(0) for _ in range(cols)) for pool in pools]

    def new(q: int, s: int) -> _Req:
        fresh = q == s
        acc = rng.randint(1, dq) if (spec_tokens and q == dq and not fresh) else 1
        r = _Req(next_id[0], q, s, fresh, acc, take(), recycled=fresh)
        next_id[0] += 1
        return r

    def finish(r: _Req) -> None:  # its slots go back first in line: the next prompt recycles them
        for pool, slots in zip(pools, r.slots):
            pool[:0] = list(slots)

    reqs = [new(q, s) for q, s in zip(qs, ss)]
    plans = [_plan(0, reqs, spec_tokens)]
    max_tokens = max(capture_sizes) if capture_sizes and sum(qs) <= max(capture_sizes) else None
    for step in range(1, num_steps):
        nxt = []
        for r in reqs:
            if r.q == dq and not r.fresh:  # a decode / verify row: grows by its accepted length
                grown = rng.randint(1, dq) if spec_tokens else 1
                s = r.s + grown
                nxt.append(_Req(r.rid, dq, s, False, grown, r.slots))
            elif batch.kind == "prefill" and r.s + r.q <= shape.max_model_len:  # the prompt's next chunk
                nxt.append(_Req(r.rid, r.q, r.s + r.q, False, 1, r.slots))
            else:  # a prompt done: its next step verifies (or decodes) the sampled token (+ k drafts)
                nxt.append(_Req(r.rid, dq, r.s + dq, False, 1, r.slots))
        if batch.kind == "mixed":
            decodes = [r for r in nxt if r.q == dq]
            if decodes:
                gone = decodes[0]
                nxt.remove(gone)
                finish(gone)
            q = fresh_lens[(step - 1) % len(fresh_lens)]
            nxt.append(new(q, q))
            # keep the batch near the spec's size: the oldest decodes finish
            while len(nxt) > len(qs) and any(r.q == dq for r in nxt):
                gone = next(r for r in nxt if r.q == dq)
                nxt.remove(gone)
                finish(gone)
        elif batch.kind == "decode" and step == 2:
            _vary_count(nxt, qs, capture_sizes, shape, max_tokens, dq, rng, new, finish)
        nxt = [r for r in nxt if r.s <= shape.max_model_len] or nxt[:1]
        for r in nxt:
            r.s = min(r.s, shape.max_model_len)
        reqs = nxt
        plans.append(_plan(step, reqs, spec_tokens))
    return plans


def _vary_count(reqs, qs, capture_sizes, shape, max_tokens, dq, rng, new, finish) -> None:
    """Step 2 of a decode batch: one or two requests fewer or more, preferring a token count that is
    not a capture size, and under spec decode fewer requests that pad a FULL decode graph (whose
    padded rows a larger step wrote last). A joining request is a decode already: its prior state
    is drawn."""
    sizes = set(capture_sizes)
    options = []
    for delta in (-1, 1, -2, 2, 3):
        n = len(reqs) + delta
        if n < 1 or n > shape.max_num_seqs or (max_tokens is not None and n * dq > max_tokens):
            continue
        options.append(delta)
    if dq > 1:  # verify rows: fewer requests that pad a FULL decode graph first (steps.count_ranks)
        ranks = count_ranks(options, len(reqs), dq, capture_sizes, shape.max_num_seqs)
        options = [d for _, d in sorted(zip(ranks, options), key=lambda rd: rd[0])]
    else:
        options = [d for d in options if (len(reqs) + d) * dq not in sizes] or options
    delta = (options or [0])[0]
    for _ in range(-delta):
        finish(reqs.pop())
    for _ in range(max(delta, 0)):
        s = rng.randint(dq + 1, max(dq + 1, min(shape.max_model_len, 2 * max(qs) + 64)))
        reqs.append(new(dq, s))


def _plan(index: int, reqs: list[_Req], spec_tokens: int) -> StepPlan:
    dq = 1 + spec_tokens
    order = sorted(range(len(reqs)), key=lambda i: (not (reqs[i].q == dq and not reqs[i].fresh), reqs[i].q))
    rows = [reqs[i] for i in order]
    carry = Carry(
        ids=tuple(r.rid for r in rows),
        fresh=tuple(r.fresh for r in rows),
        recycled=tuple(r.recycled and r.fresh for r in rows),
        accepted=tuple(r.accepted for r in rows),
        drafts=tuple(spec_tokens if (spec_tokens and r.q == dq and not r.fresh) else -1 for r in rows),
        slots=tuple(tuple(r.slots[g] for r in rows) for g in range(len(rows[0].slots) if rows else 0)),
    )
    return StepPlan(index, tuple(r.q for r in rows), tuple(r.s for r in rows), True, carry)
