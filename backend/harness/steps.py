"""The steps of one case: which batch each step runs, and its seeded inputs.

Step 0 is the batch spec as written. Every step, step 0 included, takes its blocks from a seeded
shuffle of the cache (a kernel that assumes contiguous or ascending blocks is wrong on
every step, not only on some). Later steps keep the spec's kind
(decode stays pure decode, mixed stays mixed, prefill stays prefill, so the graph a mode uses for
the spec is the graph exercised) and vary, on the case seed:
  step 1: the same query lens, sequence lengths shorter/longer (alternating), shuffled blocks;
  step 2: another decode/prefill mix (mixed: rows permuted, one prefill resized) or request count,
          preferring a token count that is not a capture size (padding); a verify batch (k > 0)
          prefers fewer requests that pad a FULL decode graph, keyed by request count
          (count_ranks: the padded rows are ones a larger step wrote);
  step 3+: random request counts, query and sequence lengths of the same kind.
Tokens stay within the largest capture size when the spec fits in it (so graphs are replayed),
requests within max_num_seqs, sequences within max_model_len, and a step's blocks within the KV
cache (ModelShape.total_blocks: a varied step's contexts are shortened to fit).
Everything is generated on the CPU from the case seed, identically on every tp rank.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from backend.attention.interface import BatchDescription
from backend.case import BatchSpec, ModelShape
from backend.families.contract import family as family_of
from backend.harness.lru import LRU
from backend.harness.modes import decode_graph_requests
from backend.host_copy import to_device


@dataclass(frozen=True)
class StepPlan:
    index: int
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    shuffle_blocks: bool
    # A family's per-request data that continues from step to step (its StepState's: hybrid_gdn's
    # request ids, state slots and accepted counts); opaque to the harness, part of the plan's key.
    carry: object = ()

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def uniform_decode(self) -> bool:
        return all(q == 1 for q in self.query_lens)


def batch_reasons(batch: BatchSpec, shape: ModelShape) -> list[str]:
    """Why a batch cannot run on this model shape (the matrix validates too; a plugin may not)."""
    reasons = []
    if not batch.query_lens or len(batch.query_lens) != len(batch.seq_lens):
        reasons.append(f"batch {batch.name}: query_lens and seq_lens must be non-empty and equally long")
        return reasons
    if batch.num_reqs > shape.max_num_seqs:
        reasons.append(f"batch {batch.name}: {batch.num_reqs} requests > max_num_seqs {shape.max_num_seqs}")
    for q, s in zip(batch.query_lens, batch.seq_lens):
        if not 1 <= q <= s <= shape.max_model_len:
            reasons.append(
                f"batch {batch.name}: need 1 <= query_len {q} <= seq_len {s} <= max_model_len {shape.max_model_len}"
            )
            break
    need = shape.blocks_for(batch.seq_lens)
    if need > shape.total_blocks - 1:
        reasons.append(f"batch {batch.name}: needs {need} blocks, the cache has {shape.total_blocks - 1}")
    return reasons


def _kind(query_lens) -> str:
    if all(q == 1 for q in query_lens):
        return "decode"
    return "prefill" if all(q > 1 for q in query_lens) else "mixed"


def plan_steps(
    batch: BatchSpec, shape: ModelShape, capture_sizes: tuple[int, ...], num_steps: int, seed: int, spec_tokens: int = 0
) -> list[StepPlan]:
    """The case's steps, each step's rows in the order the family's backends get them
    (AttentionFamily.order_rows: MLA's decodes first; gqa's as drawn)."""
    family = family_of(shape.attention)
    state = family.step_state()
    if state is not None:  # requests that continue from step to step: the family plans them
        return state.plan_steps(batch, shape, capture_sizes, num_steps, seed, spec_tokens)
    plans = (
        plan_verify_steps(batch, shape, capture_sizes, num_steps, seed, spec_tokens)
        if spec_tokens > 0
        else _plan_steps(batch, shape, capture_sizes, num_steps, seed)
    )
    return [
        StepPlan(p.index, *family.order_rows(p.query_lens, p.seq_lens, spec_tokens), p.shuffle_blocks) for p in plans
    ]


def _plan_steps(
    batch: BatchSpec, shape: ModelShape, capture_sizes: tuple[int, ...], num_steps: int, seed: int
) -> list[StepPlan]:
    rng = random.Random(f"steps-{seed}-{batch.name}")
    kind = batch.kind
    max_tokens = max(capture_sizes) if capture_sizes and batch.num_tokens <= max(capture_sizes) else None
    sizes = set(capture_sizes)
    plans = [StepPlan(0, tuple(batch.query_lens), tuple(batch.seq_lens), True)]  # shuffled: every step

    def seq_for(q: int, around: int | None = None) -> int:
        lo = q
        if around is None:
            return rng.randint(lo, shape.max_model_len)
        return max(lo, min(shape.max_model_len, around))

    def fits(qs) -> bool:
        n = sum(qs)
        return len(qs) <= shape.max_num_seqs and (max_tokens is None or n <= max_tokens) and _kind(qs) == kind

    def random_query_lens(num_reqs: int) -> list[int] | None:
        for _ in range(50):
            if kind == "decode":
                qs = [1] * num_reqs
            else:
                hi = max(2, min(shape.max_model_len, (max_tokens or 4 * shape.block_size) // max(num_reqs, 1)))
                qs = [rng.randint(2, max(2, hi)) for _ in range(num_reqs)]
                if kind == "mixed":
                    for j in rng.sample(range(num_reqs), rng.randint(1, num_reqs - 1)):
                        qs[j] = 1
            if fits(qs):
                return qs
        return None

    for step in range(1, num_steps):
        qs: list[int] | None = None
        if step == 1:
            qs = list(batch.query_lens)
            seqs = []
            for j, (q, s) in enumerate(zip(batch.query_lens, batch.seq_lens)):
                delta = rng.randint(1, 2 * shape.block_size)
                seqs.append(seq_for(q, s - delta if j % 2 == 0 else s + delta))
            plans.append(StepPlan(step, tuple(qs), tuple(seqs), True))
            continue
        if step == 2:
            qs = _padding_variant(list(batch.query_lens), kind, sizes, fits, rng)
        if qs is None:
            lo = 2 if kind == "mixed" else 1
            hi = max(lo, min(shape.max_num_seqs, max(batch.num_reqs * 2, lo)))
            qs = random_query_lens(rng.randint(lo, hi)) or list(batch.query_lens)
        seqs = [seq_for(q) for q in qs]
        plans.append(StepPlan(step, tuple(qs), tuple(seqs), True))
    budget = shape.total_blocks - 1
    return [p if shape.blocks_for(p.seq_lens) <= budget else _fit_blocks(p, batch, shape) for p in plans]


# ---- speculative decode (k > 0, DESIGN.md §4b) ----------------------------------------------------


def verify_rows(batch: BatchSpec, shape: ModelShape, spec_tokens: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The spec's rows under k speculative tokens: a decode row (query len 1, seq len s, context
    s - 1) becomes a verify row of query len 1 + k over the same context (seq len s + k, the
    context shortened when that passes max_model_len); prefill rows stay."""
    q = 1 + spec_tokens
    qs, ss = [], []
    for ql, sl in zip(batch.query_lens, batch.seq_lens):
        if ql == 1:
            qs.append(q)
            ss.append(min(shape.max_model_len, max(q, sl + spec_tokens)))
        else:
            qs.append(ql)
            ss.append(sl)
    return tuple(qs), tuple(ss)


def plan_verify_steps(
    batch: BatchSpec, shape: ModelShape, capture_sizes: tuple[int, ...], num_steps: int, seed: int, spec_tokens: int
) -> list[StepPlan]:
    """Steps of a verify batch through the same graphs: step 0 the spec's verify rows; every later
    step grows each verify row's seq_len by its accepted length, 1..k+1 drawn per request (the
    bonus token plus the accepted drafts after rejection sampling), so consecutive replays see new
    seq_lens under the same query lens; step 2 also changes the request count (a uniform batch
    by one or two verify rows, a mixed one by a verify row), preferring a token count that is not
    a capture size (padding); a uniform batch prefers fewer requests that pad a FULL decode graph
    (count_ranks). Prefill rows keep their lengths. Blocks are fitted to the cache."""
    rng = random.Random(f"verify-{seed}-{batch.name}-{spec_tokens}")
    q = 1 + spec_tokens
    qs, ss = (list(t) for t in verify_rows(batch, shape, spec_tokens))
    max_tokens = max(capture_sizes) if capture_sizes and sum(qs) <= max(capture_sizes) else None
    sizes = set(capture_sizes)
    plans = [StepPlan(0, tuple(qs), tuple(ss), True)]  # shuffled: every step

    def grow(lens: list[int], rows: list[int]) -> list[int]:
        return [min(shape.max_model_len, s + rng.randint(1, q)) if r == q else s for s, r in zip(lens, rows)]

    for step in range(1, num_steps):
        ss = grow(ss, qs)
        if step == 2:
            verify = [j for j, r in enumerate(qs) if r == q]
            options = []
            for delta in (-1, 1, -2, 2):
                n = len(qs) + delta
                if n < 1 or n > shape.max_num_seqs or not verify or (delta < 0 and len(verify) + delta < 1):
                    continue
                if delta < 0:
                    drop = set(verify[delta:])
                    cq = [r for j, r in enumerate(qs) if j not in drop]
                    cs = [s for j, s in enumerate(ss) if j not in drop]
                else:
                    cq = [q] * delta + qs
                    cs = [min(shape.max_model_len, rng.randint(q, shape.max_model_len)) for _ in range(delta)] + ss
                if max_tokens is None or sum(cq) <= max_tokens:
                    options.append((cq, cs))
            if all(r == q for r in qs):  # a uniform verify batch: FULL decode graphs are keyed by requests
                ranks = count_ranks(
                    [len(o[0]) - len(qs) for o in options], len(qs), q, capture_sizes, shape.max_num_seqs
                )
                options = [o for _, o in sorted(zip(ranks, options), key=lambda ro: ro[0])]
            else:
                options = [o for o in options if sum(o[0]) not in sizes] or options
            if options:
                qs, ss = (list(t) for t in options[0])
        plans.append(StepPlan(step, tuple(qs), tuple(ss), True))
    budget = shape.total_blocks - 1
    spec = BatchSpec(batch.name, *verify_rows(batch, shape, spec_tokens))  # the fallback keeps q = 1 + k
    return [p if shape.blocks_for(p.seq_lens) <= budget else _fit_blocks(p, spec, shape) for p in plans]


def count_ranks(deltas: list[int], num_reqs: int, query_len: int, capture_sizes, max_num_seqs: int) -> list[int]:
    """How much each change of a uniform verify batch's request count is preferred (lower first).
    Split modes key FULL decode graphs by request count (modes.decode_graph_requests), so a step
    that pads a decode graph after a larger step replays padded rows whose per-request buffers
    a larger batch wrote last: a builder that writes only its real rows leaves a stale tail there.
    A token count that is not a capture size pads FULL's token-keyed graphs as well. So: 0, fewer
    requests that pad in both; 1, fewer that pad a decode graph; 2, a token count that pads; 3,
    the rest."""
    keys = decode_graph_requests(capture_sizes, max_num_seqs, query_len)
    sizes = set(capture_sizes)

    def rank(delta: int) -> int:
        n = num_reqs + delta
        pads_requests = delta < 0 and n not in keys and any(r > n for r in keys)
        pads_tokens = n * query_len not in sizes
        return 0 if pads_requests and pads_tokens else 1 if pads_requests else 2 if pads_tokens else 3

    return [rank(d) for d in deltas]


def _fit_blocks(plan: StepPlan, batch: BatchSpec, shape: ModelShape) -> StepPlan:
    """Shorten a varied step's contexts (never its query lens) to fit the KV cache's blocks, as a
    scheduler admits only what the cache holds; if even that cannot fit, the spec's own rows."""
    budget, bs = shape.total_blocks - 1, shape.block_size
    qs, seqs = plan.query_lens, list(plan.seq_lens)
    need = shape.blocks_for(seqs)
    factor = budget / need
    seqs = [max(q, int(s * factor)) for q, s in zip(qs, seqs)]
    while shape.blocks_for(seqs) > budget:
        i = max(range(len(seqs)), key=lambda j: seqs[j] - qs[j])
        if seqs[i] - qs[i] < 1:
            return StepPlan(plan.index, tuple(batch.query_lens), tuple(batch.seq_lens), plan.shuffle_blocks)
        seqs[i] = max(qs[i], seqs[i] - bs)
    return StepPlan(plan.index, qs, tuple(seqs), plan.shuffle_blocks)


def _padding_variant(qs: list[int], kind: str, sizes: set[int], fits, rng: random.Random) -> list[int] | None:
    """Another mix of the same kind, preferring a token count that is not a capture size."""
    candidates: list[list[int]] = []
    if kind == "decode":
        n = len(qs)
        candidates = [[1] * m for m in (n - 1, n + 1, n - 2, n + 2, n + 3) if m >= 1]
    else:
        for _ in range(20):
            c = qs[:]
            rng.shuffle(c)
            prefill = [j for j, q in enumerate(c) if q > 1]
            j = rng.choice(prefill)
            c[j] = max(2, c[j] + rng.choice((-1, 1, 2, -2)))
            candidates.append(c)
    ok = [c for c in candidates if fits(c)]
    padded = [c for c in ok if sum(c) not in sizes]
    best = padded or ok
    return best[0] if best else None


@dataclass(frozen=True)
class GroupInputs:
    """One KV-cache group's share of a step (AttentionFamily.groups): its own block table and slot
    mapping over the step's shared query and sequence lengths, and the context rows its layers'
    caches hold (a sliding-window group whose blocks wholly outside the window are the null block
    holds only the rest)."""

    batch: BatchDescription
    ctx_slots_flat: torch.Tensor  # int64 slots of the context rows this group's caches hold
    ctx_rows: torch.Tensor | None  # which rows of the step's context draw those are (None: all)


@dataclass
class StepInputs:
    """One step's concrete inputs (identical on every rank)."""

    plan: StepPlan
    batch: BatchDescription  # block table + slot mapping of this step's new tokens (group 0)
    x: torch.Tensor  # [T, hidden] model dtype
    ctx_slots: list[torch.Tensor]  # [req] -> [ctx_len] int64 slots of the context tokens (group 0)
    # Every request's context rows, unsplit: [layer][plane] -> [sum ctx_len, *row] fp32 on the
    # device, every head (the family's context_rows: GQA K and V [.., Hkv, D]; MLA the latent
    # row); what the batch's one KV write per layer and plane takes. ctx_lens splits them.
    ctx_flat: list[list[torch.Tensor]]
    ctx_lens: list[int]
    ctx_slots_flat: torch.Tensor
    # Per KV-cache group (one for most families: the batch above), and each layer's group.
    groups: tuple[GroupInputs, ...] = ()
    layer_group: tuple[int, ...] = ()
    # The host tensors a step uses on its device, copied once per device (the inputs are cached and
    # shared by every mode, kv dtype and backend of a batch: one queued copy each, not one host
    # sync per use).
    _on_device: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def batches(self) -> tuple[BatchDescription, ...]:
        """What a session's builder takes: every group's batch, in group order."""
        return tuple(g.batch for g in self.groups) if self.groups else (self.batch,)

    def on(self, device: torch.device) -> DeviceInputs:
        key = str(device)
        got = self._on_device.get(key)
        if got is None:
            groups = tuple(
                DeviceGroup(
                    to_device(g.batch.slot_mapping, device),
                    to_device(g.ctx_slots_flat, device),
                    None if g.ctx_rows is None else to_device(g.ctx_rows, device),
                )
                for g in self.groups
            )
            got = self._on_device[key] = DeviceInputs(
                to_device(self.x, device),
                to_device(self.batch.slot_mapping, device),
                to_device(self.ctx_slots_flat, device),
                groups,
                self.layer_group,
            )
        return got

    @property
    def nbytes(self) -> int:
        tensors = [
            self.x,
            self.batch.block_table,
            self.batch.slot_mapping,
            self.ctx_slots_flat,
            *(t for planes in self.ctx_flat for t in planes),
            *(t for g in self.groups[1:] for t in (g.batch.block_table, g.batch.slot_mapping, g.ctx_slots_flat)),
        ]
        return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class DeviceGroup:
    real_slots: torch.Tensor  # the group's slot_mapping (int64)
    ctx_slots: torch.Tensor  # its ctx_slots_flat (int64)
    ctx_rows: torch.Tensor | None


@dataclass(frozen=True)
class DeviceInputs:
    """StepInputs' host tensors on one device."""

    x: torch.Tensor  # [T, hidden]
    real_slots: torch.Tensor  # the batch's slot_mapping (int64)
    ctx_slots: torch.Tensor  # ctx_slots_flat (int64)
    groups: tuple[DeviceGroup, ...] = ()
    layer_group: tuple[int, ...] = ()

    def group_of(self, layer: int) -> DeviceGroup:
        return (
            self.groups[self.layer_group[layer]] if self.groups else DeviceGroup(self.real_slots, self.ctx_slots, None)
        )

    @property
    def all_ctx_slots(self) -> torch.Tensor:
        """Every slot the context fill writes, over the groups (a superset across layers)."""
        if len(self.groups) <= 1:
            return self.ctx_slots
        return torch.cat([g.ctx_slots for g in self.groups])


def make_step_inputs(
    plan: StepPlan, shape: ModelShape, seed: int, device: torch.device | str = "cpu", *, context: bool = True
) -> StepInputs:
    """Blocks, slots and x on the CPU; context K/V drawn on `device` (GPU shapes hold GBs of
    context: generating it on the host would dominate the step). context=False: no context K/V
    (empty lists; checker.warm_kernels runs steps only for the kernels they launch)."""
    device = torch.device(device)
    kv_gen = torch.Generator(device=device).manual_seed(hash_seed(seed, plan.index, 17))
    family = family_of(shape.attention)
    groups = family.groups(shape)
    layouts, x = _host_part(plan, shape, seed)
    # The first paged group's layout stands for the step (its block table, its context slots).
    desc, ctx_slots_flat, ctx_rows = next((lay for lay, grp in zip(layouts, groups) if grp.kind != "state"), layouts[0])
    ctx_len_t = torch.tensor([s - q for q, s in zip(plan.query_lens, plan.seq_lens)], dtype=torch.int64)
    ctx_slots = list(torch.split(ctx_slots_flat, ctx_len_t.tolist())) if ctx_rows is None else []
    # One draw per layer and cache plane for every request's context (a decode batch of 200
    # requests was 800 small draws per step).
    ctx_lens = ctx_len_t.tolist()
    total = sum(ctx_lens)
    rows = family.context_rows(shape)
    paged = set(family.paged_layers(shape))
    ctx_flat = [
        [torch.randn(total, *row, generator=kv_gen, device=device) for row in rows] if layer in paged else []
        for layer in range(shape.num_layers if context else 0)
    ]
    layer_group = tuple(
        next(g for g, group in enumerate(groups) if layer in group.layers) for layer in range(shape.num_layers)
    )
    return StepInputs(
        plan,
        desc,
        x,
        ctx_slots,
        ctx_flat,
        ctx_lens,
        ctx_slots_flat,
        tuple(GroupInputs(*lay) for lay in layouts),
        layer_group,
    )


def _host_bytes(part) -> int:
    layouts, x = part
    tensors = [x] + [t for desc, slots, rows in layouts for t in (desc.block_table, desc.slot_mapping, slots, rows)]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


# The host part of recent steps' inputs (block tables, slots, x) by (plan, shape, seed): MBs where
# the context is GBs. The step-inputs cache cannot keep a GPU decode_200 step (its context is above
# its largest entry), so every cudagraph mode, kv dtype and backend of it laid it out again.
HOST_PARTS = LRU(256 << 20, size=_host_bytes)


def _host_part(plan: StepPlan, shape: ModelShape, seed: int) -> tuple[list, torch.Tensor]:
    """Each KV-cache group's (batch, context slots, context rows) and the step's x, on the host."""
    key = (plan, shape, seed)
    got = HOST_PARTS.get(key)
    if got is not None:
        return got
    gen = torch.Generator().manual_seed(hash_seed(seed, plan.index))
    family = family_of(shape.attention)
    layouts: list[tuple[Any, torch.Tensor, torch.Tensor | None]] = []
    for g, group in enumerate(family.groups(shape)):
        if group.kind == "state":  # a slot per request: the family's plan says which (no blocks, no context)
            state = family.step_state()
            assert state is not None, f"{shape.attention}: a state group needs the family's StepState"
            layouts.append((state.group_batch(plan, shape, g, group), torch.zeros(0, dtype=torch.int64), None))
        else:
            # Group 0 draws from the step's generator as a single-group step always did (its blocks,
            # then x); every other group gets its own shuffle of the blocks (its layers' caches).
            layouts.append(
                _group_layout(
                    plan,
                    shape,
                    gen if g == 0 else torch.Generator().manual_seed(hash_seed(seed, plan.index, 101 + g)),
                    group.frees_outside_window and group.sliding_window,
                )
            )
        if g == 0:
            dtype = getattr(torch, shape.dtype)
            x = torch.randn(plan.num_tokens, shape.hidden_size, generator=gen).to(dtype)
    got = (layouts, x)
    HOST_PARTS.put(key, got)
    return got


def _group_layout(
    plan: StepPlan, shape: ModelShape, gen: torch.Generator, window: int | bool | None
) -> tuple[BatchDescription, torch.Tensor, torch.Tensor | None]:
    """One KV-cache group's block table over the step's requests, its new tokens' slots, and the
    slots (and draw rows) of the context it holds. `window`: a sliding-window group whose blocks
    wholly outside every query's window are the null block, as vLLM's SlidingWindowManager frees
    them (a query at position i sees keys j > i - W, so request r needs none below
    ctx_r - W + 1); their context rows are not in this group's caches."""
    bs, nb = shape.block_size, shape.max_blocks_per_seq
    needed = [-(-s // bs) for s in plan.seq_lens]
    pool = torch.arange(1, shape.total_blocks)  # block 0 is the null block
    if plan.shuffle_blocks:
        pool = pool[torch.randperm(pool.numel(), generator=gen)]
    # Request r takes the next needed[r] blocks of the pool; vectorised over requests (a Python
    # loop over a GPU batch's requests was a visible part of each step).
    num_reqs = len(plan.query_lens)
    need_t = torch.tensor(needed, dtype=torch.int64)
    first_block = torch.cumsum(need_t, 0) - need_t
    col = torch.arange(nb)[None, :]
    used = col < need_t[:, None]
    seq_t = torch.tensor(plan.seq_lens, dtype=torch.int64)
    ctx_len_t = seq_t - torch.tensor(plan.query_lens, dtype=torch.int64)
    if window:
        first_needed = (ctx_len_t - window + 1).clamp(min=0)
        used &= (col + 1) * bs > first_needed[:, None]  # a block with no needed key is freed
    picks = pool[(first_block[:, None] + col).clamp(max=pool.numel() - 1)]
    block_table = torch.where(used, picks, torch.zeros_like(picks)).to(torch.int32)
    req = torch.repeat_interleave(torch.arange(num_reqs), seq_t)  # every position of every sequence
    pos = torch.arange(int(seq_t.sum())) - torch.repeat_interleave(torch.cumsum(seq_t, 0) - seq_t, seq_t)
    blocks = block_table.to(torch.int64)[req, pos // bs]
    seq_slots = blocks * bs + pos % bs
    is_ctx = pos < ctx_len_t[req]
    desc = BatchDescription(list(plan.query_lens), list(plan.seq_lens), block_table, seq_slots[~is_ctx])
    if not window:
        return desc, seq_slots[is_ctx], None
    kept = blocks[is_ctx] != 0  # context rows in freed blocks are not this group's to hold
    return desc, seq_slots[is_ctx][kept], torch.nonzero(kept).flatten()


def hash_seed(*parts: int) -> int:
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFF)) * 1099511628211) % (1 << 63)
    return h
