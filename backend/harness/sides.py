"""One step's two sides: the eager side (twice, for determinism; the reference check), shared by
every cudagraph mode of a (batch, seed), and the graph side as a mode dispatches it (replay vs
eager, finite and padded rows, the KV cache's integrity), with what each step adds to the checks."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from backend.case import Case
from backend.harness import step_data
from backend.harness.checks import (
    CheckAccumulator,
    Comparison,
    HeadComparison,
    all_finite,
    compare,
    compare_heads,
    equal_many,
    kv_integrity,
    max_abs_diff,
    raw,
    real_slot_values,
    rows_by_request,
)
from backend.harness.churn import poison_free_memory, poison_outputs
from backend.harness.modes import Dispatch
from backend.harness.scratch import mark_scratch
from backend.harness.session import GraphKey, Session
from backend.harness.steps import StepInputs, hash_seed
from backend.harness.timing import Clock, Span
from backend.result import (
    CHECK_ATTN_REFERENCE,
    CHECK_ATTN_REPLAY,
    CHECK_DETERMINISM,
    CHECK_FINITE,
    CHECK_KV_INTEGRITY,
    CHECK_PADDED_FINITE,
    CHECK_REFERENCE,
    CHECK_REPLAY,
    CHECK_STATE_INTEGRITY,
)


@dataclass
class EagerStep:
    """One step's eager side, shared by every cudagraph mode of a (batch, seed): modes share a
    session, and the eager output, the reference check and determinism do not depend on the mode
    (dispatch only decides how the graph side runs). Kept in Session.eager_memo."""

    out: torch.Tensor  # eager output [T, hidden]
    attention: torch.Tensor  # eager attention outputs [layers, T, Hl, D]
    reference: Comparison  # eager vs the fp32 reference
    attn_reference: HeadComparison  # eager attention vs the reference's, per head
    finite: Comparison
    deterministic: bool
    jitter: float  # max |eager - eager again| on the output (0 when bitwise equal; inf for NaN)
    attn_jitter: float  # the same on the attention outputs
    kv_jitter: bool  # the two eager runs left different real-slot bytes
    real_kv: list[torch.Tensor | None]  # per paged layer: the cache at the step's real slots after eager
    eager_s: Span  # the first eager run (float() gives seconds)
    # A family with state across steps (StepState): what eager left in the slots the step's
    # requests own, and its check against the reference's state ((ok, detail, max_abs)); None else.
    state: object = None
    state_check: tuple | None = None
    # The graph sides compared with this eager side, by (runtime mode, graph key): they go when it
    # goes (an eager side evicted and computed again starts with none).
    graph_sides: dict = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class GraphStep:
    """One step's graph side as the checks saw it (outcomes only, no tensors), shared by the
    cudagraph modes that dispatch the step to the same runtime path: FULL, FULL_DECODE_ONLY and
    FULL_AND_PIECEWISE replay one FULL graph for a uniform decode step; FULL_DECODE_ONLY runs a
    mixed step eagerly as NONE does, FULL_AND_PIECEWISE through the piecewise graphs as PIECEWISE
    does. Same session (caches, builder, graphs), same inputs, same path: the same outcome, so a
    later mode reuses it (kept on the step's EagerStep) as every mode reuses the eager side."""

    replay: Comparison  # graph output vs eager
    attn_replay: HeadComparison
    finite: Comparison  # of the graph output
    padded: Comparison | None  # the FULL graph's padded rows, when it had some
    padded_detail: str
    detail: str  # "FULL graph of 8 tokens for 7"
    used: int  # the graph's size (0: eager)
    replay_s: Span
    kv_ok: bool
    kv_detail: str
    state_check: tuple | None = None  # StepState.graph_check's (ok, detail, max_abs), or None


# The runtime path of eager dispatch (NONE, and the steps other modes run eagerly), as
# EagerStep.graph_sides keys the graph sides: (runtime mode, graph key).
EAGER_PATH = ("NONE", None)


def eager_side(
    case: Case,
    session: Session,
    plan,
    inputs: StepInputs,
    snapshot: list[torch.Tensor],
    context,
    clock: Clock,
    phases: dict[str, list],
    ref_key: tuple,
    prepared=None,
) -> EagerStep:
    """Eager twice from the caches' state `snapshot` (determinism), the reference, and what eager
    wrote; leaves the caches as `snapshot` again. `prepared`: the family StepState's view of the
    step (the state its requests start from), for families whose requests keep state.

    The second run is eager dispatch from the snapshot on the step's inputs: exactly what a mode
    that runs the step eagerly (NONE, a mixed step of FULL_DECODE_ONLY) would run as its graph
    side. Where the caches allow it (second_run_as_eager_path) it is judged as that graph side
    and kept in graph_sides[EAGER_PATH]: those modes replay nothing and run no third eager step,
    and the kv check that judges it tells whether the restore may copy back only the real slots."""
    t0 = clock.now()  # eager_s: the inputs' move to the device included
    caches = session.kv_caches
    on_device = inputs.on(session.device)
    x = on_device.x
    paged = session.family.paged_layers(session.shape)
    real_slots = {layer: on_device.group_of(layer).real_slots for layer in paged}
    state = session.family.step_state() if prepared is not None else None
    t1 = clock.now()
    first = session.run_eager_step(x, inputs.batches)
    out_e = first.out
    t2 = clock.now()
    real_kv = [
        real_slot_values(session.family.slot_rows(c), real_slots[i]) if i in real_slots else None
        for i, c in enumerate(caches)
    ]
    owned = state.owned(session, prepared) if state is not None else None
    for c, s in zip(caches, snapshot):
        c.copy_(s)
    t_second = clock.now()
    second = session.run_eager_step(x, inputs.batches)
    t_second_end = clock.now()
    same_out, same_attn, *same_kv = equal_many(
        [
            (raw(out_e), raw(second.out)),
            (raw(first.attention), raw(second.attention)),
            *(
                (raw(real_slot_values(session.family.slot_rows(caches[i]), real_slots[i])), raw(kv))
                for i in paged
                if (kv := real_kv[i]) is not None
            ),
        ]
    )
    same_out = same_out and same_attn
    kv_jitter = not all(same_kv)
    if state is not None:
        kv_jitter = kv_jitter or not state.same(owned, state.owned(session, prepared))
    jitter, attn_jitter = (
        (0.0, 0.0) if same_out else (max_abs_diff(out_e, second.out), max_abs_diff(first.attention, second.attention))
    )
    deterministic = same_out and not kv_jitter
    as_path = second_run_as_eager_path(session, state)
    if not as_path:
        for c, s in zip(caches, snapshot):
            c.copy_(s)
    t3 = clock.now()
    ref = step_data.REFERENCES.get(ref_key)
    if ref is None:
        ref = step_data.compute_reference(case, session, inputs, context)
        step_data.REFERENCES.put(ref_key, ref)
    ref_out, ref_attn = ref
    reference = compare(out_e, ref_out, case.tolerance, case.model.head_size, row_scaled_atol=True)
    heads = session.layout.q_heads
    attn_reference = compare_heads(
        first.attention, ref_attn[:, :, heads.start : heads.stop], case.tolerance, head_offset=heads.start
    )
    state_check = state.eager_check(case, session, prepared, owned) if state is not None else None
    t4 = clock.now()
    phases["eager_s"].append(Span(t0, t3))
    phases["reference_s"].append(Span(t3, t4))
    eager = EagerStep(
        out_e,
        first.attention,
        reference,
        attn_reference,
        all_finite(out_e, case.model.head_size),
        deterministic,
        jitter,
        attn_jitter,
        kv_jitter,
        real_kv,
        Span(t1, t2),
        state=owned,
        state_check=state_check,
    )
    if as_path:
        # What kv_integrity writes into the scratch's real slots is put back after it.
        before_real = {i: real_slot_values(session.family.slot_rows(snapshot[i]), real_slots[i]) for i in real_slots}
        eager.graph_sides[EAGER_PATH] = judge(
            case,
            session,
            plan,
            Dispatch("NONE", plan.num_tokens),
            None,
            on_device,
            snapshot,
            eager,
            second,
            None,
            Span(t_second, t_second_end),
            clock,
            phases,
        )
        restore_real_slots(session, snapshot, real_slots, before_real, eager.graph_sides[EAGER_PATH].kv_ok)
    return eager


def second_run_as_eager_path(session: Session, state) -> bool:
    """Whether eager's second run can stand for the eager path's graph side: a family without
    step state (its slots are restored by a whole copy) whose caches are all paged and contiguous
    (the real slots are written back through slot_rows views)."""
    caches = session.kv_caches
    return (
        state is None
        and len(session.family.paged_layers(session.shape)) == len(caches)
        and all(c.is_contiguous() for c in caches)
    )


def restore_real_slots(
    session: Session,
    snapshot: list[torch.Tensor],
    real_slots: dict[int, torch.Tensor],
    before_real: dict[int, torch.Tensor],
    kv_ok: bool,
) -> None:
    """Caches and scratch back to the step's snapshot after a run judged by kv_integrity, which
    wrote the run's real slots into the scratch: the real slots from `before_real`, and, unless
    the kv check passed (then nothing outside the real slots changed), the whole cache."""
    rows = session.family.slot_rows
    for i, values in before_real.items():
        rows(snapshot[i])[:, real_slots[i]] = values
        if kv_ok:
            rows(session.kv_caches[i])[:, real_slots[i]] = values
    if not kv_ok:
        for c, s in zip(session.kv_caches, snapshot):
            c.copy_(s)


def graph_side(
    case: Case,
    session: Session,
    plan,
    d,
    graph_key,
    inputs: StepInputs,
    snapshot: list[torch.Tensor],
    eager: EagerStep,
    clock: Clock,
    phases: dict[str, list],
    prepared=None,
) -> GraphStep:
    """Run the step as the mode dispatches it (eager for NONE, else replay `graph_key`) from the
    caches' state `snapshot` and check it against the eager side."""
    t0 = clock.now()  # replay_s: the inputs' move to the device and the poisoning included
    mark_scratch(None)  # the run may write anywhere: in sync again only once judge() has compared
    on_device = inputs.on(session.device)
    x = on_device.x
    t1 = clock.now()
    padded = None
    if d.runtime_mode == "NONE":
        run = session.run_eager_step(x, inputs.batches)
    else:
        # What a busy engine does between capture and replay (churn.py): real rows the graph leaves
        # unwritten read NaN, freed memory it still reads holds the poison pattern.
        poison_outputs(session, x.shape[0])
        poison_free_memory(session.device, session.outside_reads([graph_key]))
        run = session.run_graph_step(graph_key, x, inputs.batches, pad_seed=pad_seed(case, plan.index, session))
        padded = padded_rows(session, graph_key, x.shape[0])
    t2 = clock.now()
    phases["replay_s"].append(Span(t0, t2))
    return judge(
        case,
        session,
        plan,
        d,
        graph_key,
        on_device,
        snapshot,
        eager,
        run,
        padded,
        Span(t1, t2),
        clock,
        phases,
        prepared,
    )


def judge(
    case: Case,
    session: Session,
    plan,
    d,
    graph_key,
    on_device,
    snapshot: list[torch.Tensor],
    eager: EagerStep,
    run,
    padded: torch.Tensor | None,
    replay_s: Span,
    clock: Clock,
    phases: dict[str, list],
    prepared=None,
) -> GraphStep:
    """A step's run down the path `d` dispatched it to (`run`: its StepOutput; `padded`: a FULL
    graph's padded output rows) against the eager side: replay, finite and padded rows, the KV
    cache's integrity from `snapshot`, the family's state."""
    t2 = clock.now()
    shape, tol = case.model, case.tolerance
    caches = session.kv_caches
    x = on_device.x
    used = 0 if d.runtime_mode == "NONE" else d.padded_tokens
    out_g = run.out
    replay = compare(out_g, eager.out, tol, shape.head_size, row_scaled_atol=True)
    # The emulation saw the replay read memory nothing kept alive: a failure whatever it read.
    freed = session.freed_reads([graph_key]) if graph_key is not None else ()
    if freed:
        replay = dataclasses.replace(replay, ok=False)
    attn_replay = compare_heads(run.attention, eager.attention, tol, head_offset=session.layout.q_heads.start)
    finite = all_finite(out_g, shape.head_size)
    fp = all_finite(padded, shape.head_size) if padded is not None and padded.shape[0] else None
    kv_ok, kv_detail, outside_ok = True, "", True
    family = session.family
    for layer in family.paged_layers(shape):
        after, before, eager_real = caches[layer], snapshot[layer], eager.real_kv[layer]
        assert eager_real is not None, "eager keeps the real slots of every paged layer"
        real_slots = on_device.group_of(layer).real_slots
        k = kv_integrity(
            family.slot_rows(after),
            family.slot_rows(before),
            eager_real,
            real_slots,
            family.plane_scales(session.model.k_scales[layer], session.model.v_scales[layer]),
            tol,
            decode=functools.partial(family.decode_rows, shape),
        )
        outside_ok = outside_ok and not k.outside_changed
        if not k.real_ok and after.is_contiguous():
            # The graph's own K/V (NaN where it read poisoned memory) would be the cache later
            # steps and cases of this session find: they get eager's, in the scratch too (which
            # kv_integrity left equal to the cache).
            for t in (after, before):
                family.slot_rows(t)[:, real_slots] = eager_real
        if not k.ok and kv_ok:
            kv_ok = False
            kv_detail = (
                f"layer {layer}: {k.outside_changed} slots written outside the step's "
                f"{real_slots.numel()} real slots (first slot {k.first_outside})"
                if k.outside_changed
                else f"layer {layer}: real slots differ from eager (max_abs {k.real_max_abs:.3g})"
            )
    state_check = None
    if prepared is not None:  # the family's state: checked before the scratch is declared in sync
        state = family.step_state()
        assert state is not None, "a step is prepared only for a family with state"
        state_check = state.graph_check(case, session, prepared, eager.state, snapshot)
        outside_ok = outside_ok and state_check[0]
    if outside_ok:  # kv_integrity left the scratch equal to the caches (SCRATCH_OWNER)
        mark_scratch(session)
    if kv_ok and graph_key in session.capture_writes:  # the graph wrote the cache while it was made
        kv_ok, kv_detail = (
            False,
            f"{d.runtime_mode} graph of {d.padded_tokens} tokens: {session.capture_writes[graph_key]}",
        )
    phases["checks_s"].append(Span(t2, clock.now()))
    return GraphStep(
        replay=replay,
        attn_replay=attn_replay,
        finite=finite,
        padded=fp,
        padded_detail=f"padded row {x.shape[0] + fp.first_bad[0]} of the {d.padded_tokens}-token graph"
        if fp is not None and fp.first_bad
        else "",
        detail=f"{d.runtime_mode} graph of {d.padded_tokens} tokens for {plan.num_tokens}"
        + (f"; {rows_by_request(replay.bad_rows, plan.query_lens)}" if replay.bad_rows else "")
        + "".join(f"; {note}" for note in freed),
        used=used,
        replay_s=replay_s,
        kv_ok=kv_ok,
        kv_detail=kv_detail,
        state_check=state_check,
    )


def pad_seed(case: Case, step: int, session: Session) -> int:
    """The seed of a replay's padded input rows: new for every replay of the session, so a padded
    token's stray KV write changes bytes every time, whatever an earlier case or warm-up left in
    the slot it hits (the same pad values wrote the same bytes, and a deterministic stray
    write passed on one attempt and failed on another, FLAKY)."""
    session.replays += 1
    return hash_seed(case.seed, step, 31, session.replays)


def padded_rows(session: Session, key: GraphKey, n: int) -> torch.Tensor | None:
    """The padded output rows [size - n, hidden] of the FULL graph just replayed (its static
    output, valid until the next replay), or None. Piecewise graphs run attention on real rows
    only, so their padded rows are not the backend's output and are not checked."""
    graph = getattr(session.graphs.get(key), "graph", None)
    out = getattr(graph, "outputs", None)
    return out[n : key.size] if isinstance(out, torch.Tensor) else None


def add_step(acc: dict[str, CheckAccumulator], step: int, eager: EagerStep, g: GraphStep) -> None:
    """One step's outcomes into the checks' accumulators."""
    acc[CHECK_REFERENCE].add_comparison(step, eager.reference)
    acc[CHECK_REPLAY].add_comparison(step, g.replay, record_bitwise=True, detail=g.detail)
    add_heads(acc[CHECK_ATTN_REFERENCE], step, eager.attn_reference)
    add_heads(acc[CHECK_ATTN_REPLAY], step, g.attn_replay, record_bitwise=True, detail=g.detail)
    fe, fg = eager.finite, g.finite
    bad = fe if not fe.ok else fg
    acc[CHECK_FINITE].add(
        step,
        fe.ok and fg.ok,
        mismatch=max(fe.mismatch_frac, fg.mismatch_frac),
        first_bad=bad.first_bad,
        detail="eager" if not fe.ok else "graph",
    )
    if g.padded is not None:
        acc[CHECK_PADDED_FINITE].add(
            step, g.padded.ok, mismatch=g.padded.mismatch_frac, first_bad=g.padded.first_bad, detail=g.padded_detail
        )
    acc[CHECK_KV_INTEGRITY].add(step, g.kv_ok, detail=g.kv_detail)
    if CHECK_STATE_INTEGRITY in acc and eager.state_check is not None:
        # the eager state against the reference's, then the graph run's against eager's
        worst = max(eager.state_check[2], g.state_check[2] if g.state_check else 0.0)
        bad_state = next((sc for sc in (eager.state_check, g.state_check) if sc is not None and not sc[0]), None)
        acc[CHECK_STATE_INTEGRITY].add(step, bad_state is None, max_abs=worst, detail=bad_state[1] if bad_state else "")
    acc[CHECK_DETERMINISM].add(
        step,
        eager.deterministic,
        max_abs=eager.jitter,
        detail=f"two eager runs differ (max_abs {eager.jitter:.3g}"
        f"{', and their KV writes' if eager.kv_jitter else ''})",
    )


def add_heads(
    acc: CheckAccumulator, step: int, h: HeadComparison, *, record_bitwise: bool = False, detail: str = ""
) -> None:
    """A per-head attention comparison into its accumulator; the failing layer and the worst head
    go in the detail."""
    where = f"layer {h.layer}, worst head {h.worst_head}" if h.layer is not None else ""
    acc.add_comparison(
        step, h.comparison, record_bitwise=record_bitwise, detail=", ".join(p for p in (where, detail) if p)
    )
