"""The ranks of a tp gang must agree on their resolved mode and on the graph every step
dispatches to (vLLM #45094, a pipeline split-brain). The merge (torch-free, the driver's) checks it
as `rank_consensus`; each rank also exchanges its plan before any collective of the case, so a gang
that disagrees fails at once instead of pairing its collectives wrongly."""

from __future__ import annotations

import pytest

from backend.harness.checker import run_case_local
from backend.rank_merge import merge_rank_results, rank_consensus
from backend.result import CHECK_RANK_CONSENSUS, CaseResult, Status
from tests.checker.conftest import DECODE, GANG_DEVICES, MIXED, make_case

# name: (per-rank plans, passed, step, phrase in the detail)
PLANS = {
    "agree": ([("FULL", ("FULL 8", "FULL 4")), ("FULL", ("FULL 8", "FULL 4"))], True, None, "2 ranks: FULL"),
    "a rank resolved another mode": (
        [("FULL", ("FULL 8",)), ("FULL_AND_PIECEWISE", ("PIECEWISE 8",))],
        False,
        None,
        "resolved rank 0 FULL, rank 1 FULL_AND_PIECEWISE",
    ),
    "one step on another graph": (
        [("FULL_AND_PIECEWISE", ("FULL 4 decode", "FULL 4 decode", "PIECEWISE 8"))] * 2
        + [("FULL_AND_PIECEWISE", ("FULL 4 decode", "FULL 4 decode", "NONE"))],
        False,
        2,
        "step 2: ranks [0, 1] PIECEWISE 8, rank 2 NONE",
    ),
    "another padded size": (
        [("FULL", ("FULL 8",)), ("FULL", ("FULL 16",))],
        False,
        0,
        "step 0: rank 0 FULL 8, rank 1 FULL 16",
    ),
    "a rank with fewer steps": ([("NONE", ("NONE", "NONE")), ("NONE", ("NONE",))], False, 1, "rank 1 no step"),
}


@pytest.mark.parametrize("name", PLANS)
def test_rank_consensus(name):
    plans, passed, step, phrase = PLANS[name]
    check = rank_consensus(plans)
    assert check.name == CHECK_RANK_CONSENSUS and check.passed == passed and check.step == step
    assert phrase in check.detail, check.detail


def _rank(status: Status, mode: str, graphs: tuple[str, ...], rank: int) -> CaseResult:
    return CaseResult(
        case_id="tp2-FULL-auto-m-torch-s0",
        status=status,
        resolved_mode=mode,
        step_graphs=graphs,
        worker=f"rank{rank}",
        reason="" if status == Status.PASS else "replay check failed",
    )


def test_the_merge_fails_a_gang_whose_ranks_disagree_though_each_passed():
    merged = merge_rank_results(
        [_rank(Status.PASS, "FULL", ("FULL 8",), 0), _rank(Status.PASS, "FULL_AND_PIECEWISE", ("PIECEWISE 8",), 1)]
    )
    assert merged.status == Status.FAIL
    assert (
        merged.reason == "rank_consensus check failed: resolved rank 0 FULL, rank 1 FULL_AND_PIECEWISE "
        "(worst rank's own verdict: pass)"
    )
    assert [c.name for c in merged.failed_checks] == [CHECK_RANK_CONSENSUS]
    # Agreeing ranks: the worst rank's verdict as before, with the check recorded as passed.
    agree = merge_rank_results([_rank(Status.PASS, "FULL", ("FULL 8",), 0), _rank(Status.FAIL, "FULL", ("FULL 8",), 1)])
    assert agree.status == Status.FAIL and agree.reason.startswith("rank 1: replay check failed")
    assert [c.passed for c in agree.checks if c.name == CHECK_RANK_CONSENSUS] == [True]
    # A rank that stopped before planning (an error) is not compared.
    error = merge_rank_results([_rank(Status.PASS, "FULL", ("FULL 8",), 0), _rank(Status.ERROR, "", (), 1)])
    assert error.status == Status.ERROR and not any(c.name == CHECK_RANK_CONSENSUS for c in error.checks)


# The mutant's rank 1 reads a lower support level: FULL resolves to FULL on rank 0 and to
# FULL_AND_PIECEWISE on rank 1; modes that resolve alike pass.
@pytest.mark.parametrize("device", GANG_DEVICES, ids=str)
@pytest.mark.parametrize(
    "mode, batch, status",
    [("FULL", MIXED, Status.FAIL), ("FULL", DECODE, Status.FAIL), ("PIECEWISE", MIXED, Status.PASS)],
)
def test_a_gang_whose_rank_1_resolves_another_mode_fails_rank_consensus(mode, batch, status, device):
    r = run_case_local(make_case("tests.mutants.rank_split_mode:Backend", mode, "auto", batch, tp=2), device=device)
    assert r.status == status, r.reason
    (check,) = [c for c in r.checks if c.name == CHECK_RANK_CONSENSUS]
    assert check.passed == (status == Status.PASS)
    if status == Status.FAIL:
        assert r.reason.startswith("rank_consensus check failed: resolved rank 0 FULL, rank 1 FULL_AND_PIECEWISE")
        # Found before any collective of the case: no step ran (no other check), nothing captured.
        assert [c.name for c in r.checks] == [CHECK_RANK_CONSENSUS] and "capture_s" not in r.timings
