"""hybrid_gdn's StepState (backend/families/contract/family.py): requests that keep their state from step to
step, the state each step starts from, and the state_integrity check (docs/CHECKER.md).

The state a step starts from. A request that continued from the step before starts from the
reference's state after that step (every slot column and the whole conv buffer, as a correct step
leaves them), rounded as the cache stores it; a request the case first sees mid-life starts from
a drawn state; a new prompt's slots hold a finished request's leftover (drawn: recycled slots are
not zeroed, as vLLM's Mamba blocks are not), which it must read as zeros. The step's reference
runs from the same values, so a request's state after N steps is held to N reference steps, and
the backend's state is checked at the step that wrote it (a wrong slot, column or offset is red
there); re-anchoring each step on the reference keeps every step self-contained, so the eager and
graph sides of one step are shared by the cudagraph modes as for the other families.

state_integrity, per step and state layer:
  eager   the owned slots' new state (both planes, every column) against the reference's;
  graph   slots no real row owns bit-identical to the step's snapshot (slot 0 and the last slot
          included), the owned slots' state against eager's (bitwise, else within tolerance),
          and the metadata's contract (request-indexed buffers sized by requests, padded rows
          holding the padding values: backend/attention/gdn.py request_buffer_problems; state
          rows that hold the step's tokens; no capture build of the graph writing the metadata
          the groups share: gdn_groups.py, named first).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.attention.gdn import request_buffer_problems
from backend.attention.interface import BatchDescription
from backend.families.contract import StepState
from backend.families.gdn_groups import uncovered
from backend.families.gdn_layout import conv_channels, gdn_layers, kv_cache_groups, state_page
from backend.families.gdn_reference import StateContext
from backend.families.gdn_steps import plan_steps
from backend.harness.checks import compare, raw
from backend.harness.session import LRU
from backend.harness.steps import hash_seed
from backend.harness.verdict import STATE_GRAPH_ONLY

# The reference's state after each step, by the harness's reference key (the chain the next step
# starts from): per state layer, (conv [n, 1 + k, W, C], recurrent [n, 1 + k, Hv, Dv, Dk]) fp32.
POST_BYTES = 2 * 2**30
POST = LRU(POST_BYTES, size=lambda post: sum(t.numel() * t.element_size() for pair in post.values() for t in pair))

DRAWN_STATE_SCALE = 0.5  # a drawn recurrent state's spread (a live one is a decaying sum of v k^T)


def _page(session, layer: int):
    """The state layer's page layout on this rank (its dims, its dtypes)."""
    return state_page(session.config, session.shape, layer)


@dataclass
class Prepared:
    """One step as the state check sees it (per state layer)."""

    contexts: dict  # layer -> StateContext (the reference's view, full heads)
    owned: dict  # layer -> the owned slots, row by row and column by column (long, on the device)
    post: dict  # layer -> the reference's state after the step at those slots: (conv, recurrent), the rank's share
    groups: dict  # layer -> its state group's index among the groups (for its metadata)

    def merge(self, context: list) -> list:
        context = list(context)
        for layer, ctx in self.contexts.items():
            context[layer] = ctx
        return context


class GDNState(StepState):
    def _state_groups(self, shape):
        return [(g, grp) for g, grp in enumerate(kv_cache_groups(shape)) if grp.kind == "state"]

    def plan_steps(self, batch, shape, capture_sizes, num_steps, seed, spec_tokens):
        slots = 1 + shape.max_num_seqs * (1 + spec_tokens)
        return plan_steps(
            batch, shape, capture_sizes, num_steps, seed, spec_tokens, len(self._state_groups(shape)), slots
        )

    def group_batch(self, plan, shape, group_index, group):
        ordinal = [g for g, _ in self._state_groups(shape)].index(group_index)
        carry = plan.carry
        table = torch.tensor(carry.slots[ordinal], dtype=torch.int32).view(len(plan.query_lens), -1)
        spec = any(d >= 0 for d in carry.drafts)
        return BatchDescription(
            list(plan.query_lens),
            list(plan.seq_lens),
            table,
            torch.full((sum(plan.query_lens),), -1, dtype=torch.int64),
            list(carry.accepted) if spec else None,
            list(carry.drafts) if spec else None,
        )

    # ---- the state a step starts from, and the reference after it -------------------------------
    def _pre(self, case, session, plans, index: int) -> dict:
        """Every state layer's StateContext before step `index` (full heads, rounded as the cache
        stores them)."""
        shape, plan = case.model, plans[index]
        carry = plan.carry
        prev = self._post(case, session, plans, index - 1) if index > 0 else {}
        prev_rows = {rid: r for r, rid in enumerate(plans[index - 1].carry.ids)} if index > 0 else {}
        k = case.spec_tokens
        out = {}
        for layer in gdn_layers(shape):
            page = _page(session, layer)
            d = page.dims
            cols, width = 1 + k, d.conv_width
            hk, dk = dict(shape.dims)["num_k_heads"], dict(shape.dims)["head_k_dim"]
            c = 2 * hk * dk + shape.num_heads * shape.head_size
            convs, states = [], []
            dev = session.device
            for r, rid in enumerate(carry.ids):
                p = prev_rows.get(rid)
                if p is not None and not carry.fresh[r]:
                    convs.append(prev[layer][0][p].to(dev))  # the reference's: on the device already
                    states.append(prev[layer][1][p].to(dev))
                    continue
                # A new request's state is drawn on the device, as the context K/V are (steps.py): on
                # the host, a state per request and layer (MBs at the GPU shape) and its copy were
                # most of a hybrid_gdn step's inputs on an H100. The same seed on a device of the
                # same type draws the same values, so a repro on that device reproduces the case.
                gen = torch.Generator(device=dev).manual_seed(hash_seed(case.seed, rid, layer, 71 + index))
                convs.append(torch.randn(cols, width, c, generator=gen, device=dev))
                states.append(
                    DRAWN_STATE_SCALE
                    * torch.randn(cols, shape.num_heads, shape.head_size, dk, generator=gen, device=dev)
                )
            conv = (
                torch.stack(convs).to(page.conv_dtype).float() if convs else torch.zeros(0, cols, width, c, device=dev)
            )
            state = torch.stack(states).to(page.state_dtype).float() if states else torch.zeros(0, device=dev)
            spec = tuple(dr >= 0 for dr in carry.drafts)
            out[layer] = StateContext(conv, state, carry.fresh, spec, carry.accepted)
        return out

    def _post(self, case, session, plans, index: int, contexts: dict | None = None) -> dict:
        """The reference's state after step `index` (the chain: computes the steps it needs)."""
        from backend.harness import step_data

        key = step_data.reference_key(case, session, index)
        hit = POST.get(key)
        if hit is not None:
            return hit
        contexts = contexts or self._pre(case, session, plans, index)
        inputs = step_data.step_inputs(plans[index], case.model, case.seed, session.device)
        context = step_data.reference_context(session, inputs)
        for layer, ctx in contexts.items():
            context[layer] = ctx
        ref = step_data.compute_reference(case, session, inputs, context)
        if step_data.REFERENCES.get(key) is None:
            step_data.REFERENCES.put(key, ref)
        post = {layer: (ctx.post_conv, ctx.post_state) for layer, ctx in contexts.items()}
        POST.put(key, post)
        return post

    def prepare(self, case, session, inputs, plans):
        index = inputs.plan.index
        contexts = self._pre(case, session, plans, index)
        post_full = self._post(case, session, plans, index, contexts)
        shape, layout = case.model, session.layout
        channels = conv_channels(layout, shape).to(session.device)
        heads = slice(layout.q_heads.start, layout.q_heads.stop)
        groups = {layer: g for g, grp in self._state_groups(shape) for layer in grp.layers}
        ordinal = {g: i for i, (g, _) in enumerate(self._state_groups(shape))}
        owned, post = {}, {}
        for layer, ctx in contexts.items():
            slots = inputs.plan.carry.slots[ordinal[groups[layer]]]
            idx = torch.tensor([s for row in slots for s in row], dtype=torch.long, device=session.device)
            page = _page(session, layer)
            cache = session.kv_caches[layer]
            n, cols = ctx.conv.shape[0], ctx.conv.shape[1]
            pre_conv = ctx.conv.index_select(3, channels).reshape(n * cols, *page.conv(cache).shape[1:])
            pre_state = ctx.state[:, :, heads].reshape(n * cols, *page.state(cache).shape[1:])
            if idx.numel():
                page.conv(cache).index_copy_(0, idx, pre_conv.to(page.conv_dtype))
                page.state(cache).index_copy_(0, idx, pre_state.to(page.state_dtype))
            pc, ps = post_full[layer]
            post[layer] = (
                pc.index_select(3, channels).reshape(n * cols, *pre_conv.shape[1:]),
                ps[:, :, heads].reshape(n * cols, *pre_state.shape[1:]),
            )
            owned[layer] = idx
        return Prepared(contexts, owned, post, groups)

    # ---- what a run left, and the checks -----------------------------------------------------------
    def owned(self, session, prepared):
        return {layer: session.kv_caches[layer].index_select(0, idx) for layer, idx in prepared.owned.items()}

    def same(self, a, b):
        return all(torch.equal(a[layer], b[layer]) for layer in a)

    def eager_check(self, case, session, prepared, owned):
        worst = 0.0
        for layer, pages in owned.items():
            page = _page(session, layer)
            conv, state = page.conv(pages), page.state(pages)
            want_conv, want_state = prepared.post[layer]
            for name, got, want in (("conv", conv, want_conv), ("recurrent", state, want_state)):
                c = _compare(got, want, case)
                worst = max(worst, c.max_abs)
                if not c.ok:
                    slot = int(prepared.owned[layer][c.first_bad[0] // _rows_per_slot(got)]) if c.first_bad else -1
                    return (
                        False,
                        (
                            f"layer {layer}: eager {name} state against the reference's, slot {slot} "
                            f"(max_abs {c.max_abs:.3g})"
                        ),
                        worst,
                    )
        return True, "", worst

    def graph_check(self, case, session, prepared, owned, snapshot):
        ok, detail, worst = self._graph_check(case, session, prepared, owned, snapshot)
        # The cause before its consequences: a capture build of this graph that wrote the metadata
        # every later group's builder reads (gdn_groups.py).
        problems = getattr(session.last_metadata, "capture_problems", ())
        if problems:
            return False, f"metadata: {problems[0]}" + (f"; {detail}" if detail else ""), worst
        return ok, detail, worst

    def _graph_check(self, case, session, prepared, owned, snapshot):
        worst = 0.0
        checked_groups = set()
        for layer, idx in prepared.owned.items():
            cache, before = session.kv_caches[layer], snapshot[layer]
            changed = (raw(cache) != raw(before)).any(dim=-1)
            if idx.numel():
                changed[idx] = False
            n_out = int(changed.sum())
            if n_out:
                first = int(torch.argmax(changed.to(torch.uint8)))
                return (
                    False,
                    (
                        f"layer {layer}: {n_out} state slot{'s' if n_out != 1 else ''} written outside the "
                        f"step's {idx.numel()} owned slots (first slot {first})"
                    ),
                    worst,
                )
            now = cache.index_select(0, idx)
            if not torch.equal(now, owned[layer]):
                page = _page(session, layer)
                for name, got, want in (
                    ("conv", page.conv(now), page.conv(owned[layer])),
                    ("recurrent", page.state(now), page.state(owned[layer])),
                ):
                    c = _compare(got, want.float(), case)
                    worst = max(worst, c.max_abs)
                    if not c.ok:
                        return False, (f"layer {layer}: {STATE_GRAPH_ONLY} ({name}, max_abs {c.max_abs:.3g})"), worst
            before[idx] = now  # the scratch equals the caches again (scratch.py: SCRATCH_OWNER)
            group = prepared.groups[layer]
            md = session.last_metadata
            if group in checked_groups or md is None:
                continue
            checked_groups.add(group)
            gmd = md[layer] if isinstance(md, tuple) else md
            problems = (
                request_buffer_problems(gmd, getattr(gmd, "pad_slot", -1)) if hasattr(gmd, "num_prefills") else []
            )
            short = uncovered(gmd, getattr(gmd, "num_actual_tokens", 0)) if hasattr(gmd, "num_prefills") else None
            problems = [short, *problems] if short else problems
            if problems:
                return False, f"layer {layer} metadata: {problems[0]}", worst
        return True, "", worst


def _rows_per_slot(t: torch.Tensor) -> int:
    return t.shape[1] if t.dim() == 4 else 1  # recurrent: a row per (slot, head); conv: a row per slot


def _compare(got: torch.Tensor, want: torch.Tensor, case):
    """State values compared as the model's outputs are: per row (a slot's conv buffer, a slot's head
    of the recurrent state), atol scaled by the row's magnitude."""
    rows = got.shape[0] * _rows_per_slot(got)
    return compare(
        got.float().reshape(rows, -1), want.float().reshape(rows, -1), case.tolerance, 1, row_scaled_atol=True
    )


STATE = GDNState()
