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
