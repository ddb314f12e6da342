"""The dummy step a GPU replay is churned with (backend/harness/churn.py) runs in every
family's sessions: on the H100 it was first run after round three merged, and every MLA case of a
FULL mode (a mixed dummy batch, which MLA's capture builder refuses) and every hybrid_gdn k > 0
case (a batch whose requests were not 1 + k tokens long) became an ERROR of the harness. The
step is a no-op on the CPU, where the emulation models the churn instead, so it is called here
directly on CPU sessions of each family's shapes."""

from __future__ import annotations

import pytest
import torch

from backend.harness.checker import SessionCache, run_case
from backend.harness.churn import dummy_step
from backend.harness.scratch import mark_scratch
from backend.result import Status
from orchestrator.matrix import load_matrix

# (family, k): a FULL case of each family's torch provider in full.yaml.
SCENARIOS = [("gqa", 0), ("gqa", 2), ("mla", 0), ("mla", 2), ("swa_sinks", 0), ("hybrid_gdn", 0), ("hybrid_gdn", 2)]


@pytest.fixture(scope="module")
def full_cases():
    return load_matrix("matrices/full.yaml", devices="cpu").cases


@pytest.mark.parametrize("family,k", SCENARIOS, ids=[f"{f}-k{k}" for f, k in SCENARIOS])
def test_the_dummy_step_runs_in_every_familys_session(family, k, full_cases):
    case = next(
        c
        for c in full_cases
        if c.attention == family
        and c.spec_tokens == k
        and c.tp == 1
        and c.backend == "torch"
        and c.mode == "FULL"
        and c.kv_cache_dtype == "auto"
    )
    sessions = SessionCache()
    assert run_case(case, sessions=sessions, device="cpu").status == Status.PASS
    (session,) = sessions._sessions.values()
    before = [c.clone() for c in session.kv_caches]
    for n, size in ((1, 4), (1 + k, 1 + k), (2 * (1 + k), 1 + k)):  # never the step's nor the graph's size
        dummy_step(session, n, size)
    # Slots -1: the dummy step writes no cache the checker compares.
    assert all(torch.equal(a, b) for a, b in zip(before, session.kv_caches))


def _fake_gpu_churn(monkeypatch, write: bool):
    """The GPU's churn on the CPU: the dummy step run for real (churn() is a no-op off a GPU),
    and, with `write`, a byte written into slot 0 of layer 0's cache, as a backend writing on
    the dummy batch's slots of -1 would."""
    from backend.harness import checker

    def churn(session, n, size):
        dummy_step(session, n, size)
        if write:
            session.family.slot_rows(session.kv_caches[0])[0, 0].add_(1.0)
        mark_scratch(None)

    monkeypatch.setattr(checker, "churn", churn)  # the step loop's


@pytest.mark.parametrize("write", [False, True], ids=["writes-nothing", "writes-slot-0"])
def test_what_the_dummy_step_writes_is_not_the_steps(monkeypatch, full_cases, write):
    """The dummy step is the harness's own step: it runs before the step's snapshot, so a write of
    it is part of the state the step starts from, never an outside write of the step (a backend
    writing on slots of -1 is capture_checked's finding, in the modes that capture). Run after the
    snapshot, the #39444 mutant (a warm-up write to slot 0) turned PIECEWISE red on an H100."""
    from backend.harness import checker, scratch

    _fake_gpu_churn(monkeypatch, write)
    seen: list[bool] = []
    real = scratch.take_snapshot

    def record(caches, session=None, written=None):
        seen.append(scratch.scratch_in_sync(session))
        return real(caches, session, written)

    monkeypatch.setattr(checker, "take_snapshot", record)
    case = next(
        c
        for c in full_cases
        if c.attention == "gqa" and c.spec_tokens == 0 and c.tp == 1 and c.backend == "torch" and c.mode == "FULL"
    )
    r = run_case(case, sessions=SessionCache(), device="cpu")
    assert r.status == Status.PASS, r.reason
    assert len(seen) == case.steps and not any(seen), seen  # each step after a dummy step: a whole copy
