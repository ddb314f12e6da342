"""mla_sparse's checks, through the StepState hook (backend/families/contract/family.py): the family
keeps no state across steps, but it is how a family adds checks of its own. Reported as
state_integrity (docs/FAMILIES.md "mla_sparse").

After each run (eager's first, and the graph side's) the metadata the run was built with and the
Impl's top-k buffer are held to their contract (backend/attention/mla_sparse.py `problems`):
per-token lengths in [0, seq_len], request rows inside the block table, indices -1 or causal
positions, padded tokens indexing nothing, the buffer sized for the model's index_topk. A
violation is a FAIL naming the field, the row and the value. The graph run's top-k rows of real
tokens are also held to eager's, bit for bit (a stale or misplaced buffer).

Steps are the harness's own plan, in MLA's row order: nothing continues from step to step.
"""

from __future__ import annotations

import torch

from backend.attention.mla_sparse import Buffers, IndexerDims, problems
from backend.families.contract import StepState
from backend.harness.steps import StepPlan, _plan_steps, plan_verify_steps


class _Unchanged:
    """The step's context as the harness drew it (no state layer to merge in)."""

    def merge(self, context):
        return context


def buffers(session) -> Buffers | None:
    """The last run's metadata and top-k buffer (None when the run built no sparse metadata)."""
    md = session.last_metadata
    md = md[0] if isinstance(md, tuple) else md
    topk_for = getattr(session.model.impl, "topk_for", None)
    if md is None or topk_for is None or getattr(md, "token_seq_lens", None) is None:
        return None
    return Buffers.of(md, topk_for(md))


class SparseChecks(StepState):
    def plan_steps(self, batch, shape, capture_sizes, num_steps, seed, spec_tokens):
        from backend.families.contract import family

        plans = (
            plan_verify_steps(batch, shape, capture_sizes, num_steps, seed, spec_tokens)
            if spec_tokens > 0
            else _plan_steps(batch, shape, capture_sizes, num_steps, seed)
        )
        order = family(shape.attention).order_rows
        return [StepPlan(p.index, *order(p.query_lens, p.seq_lens, spec_tokens), p.shuffle_blocks) for p in plans]

    def group_batch(self, plan, shape, group_index, group):
        raise AssertionError("mla_sparse has no state group")

    def prepare(self, case, session, inputs, plans):
        return _Unchanged()

    def owned(self, session, prepared):
        return buffers(session)

    def same(self, a, b):
        return (a is None) == (b is None) and (a is None or torch.equal(a.topk, b.topk))

    def _contract(self, case, b: Buffers | None, side: str) -> tuple[bool, str, float]:
        if b is None:
            return False, f"{side}: no sparse metadata was built (the provider's builder is not mla_sparse's)", 0.0
        found = problems(b, IndexerDims.of(case.model).index_topk)
        return (
            not found,
            f"{side}: {found[0]}" + (f" (+{len(found) - 1} more)" if len(found) > 1 else "") if found else "",
            0.0,
        )

    def eager_check(self, case, session, prepared, owned):
        return self._contract(case, owned, "eager")

    def graph_check(self, case, session, prepared, owned, snapshot):
        b = buffers(session)
        ok, detail, worst = self._contract(case, b, "graph")
        if not ok or owned is None:
            return ok, detail, worst
        n = min(b.num_actual_tokens, owned.num_actual_tokens)
        diff = (b.topk[:n] != owned.topk[:n]).any(dim=1).nonzero()
        if diff.numel():
            t = int(diff[0])
            return (
                False,
                (f"graph: topk_indices[{t}] = {b.topk[t].tolist()[:8]}, eager picked {owned.topk[t].tolist()[:8]}"),
                worst,
            )
        return True, "", worst


CHECKS = SparseChecks()
