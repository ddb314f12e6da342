"""A tp gang's verdict from its ranks' results. Torch-free: the driver of `orch run` merges the
ranks' results of every tp > 1 case (the driver does not import torch).

Besides taking the worst rank, the merge holds the gang to one plan (the `rank_consensus`
check): every rank must have resolved the same cudagraph mode and dispatched every step to the same
graph (`CaseResult.step_graphs`: runtime mode, padded size, uniform decode). vLLM's pipeline
split-brain (#45094, `tests/v1/cudagraph/test_pp_cudagraph_consensus.py`) had one rank on
PIECEWISE and another on NONE; ranks that agree on nothing can still each pass their own checks.
"""

from __future__ import annotations

from collections.abc import Sequence

from backend.result import CHECK_RANK_CONSENSUS, CaseResult, CheckOutcome, Status

_SEVERITY = {
    Status.ERROR: 7,
    Status.TIMEOUT: 6,
    Status.FAIL: 5,
    Status.UNVERIFIABLE: 4,
    Status.FLAKY: 3,
    Status.SKIP: 1,
    Status.PASS: 0,
}
# Ranks with these verdicts planned and ran their steps: their plans are comparable. (An error, a
# timeout or a skip may have stopped a rank before it planned anything.)
_RAN = frozenset({Status.PASS, Status.FAIL, Status.FLAKY, Status.UNVERIFIABLE})

Plan = tuple[str, tuple[str, ...]]  # (resolved mode, per step the graph it dispatched to)


def plan_of(r: CaseResult) -> Plan:
    return r.resolved_mode, tuple(r.step_graphs)


def _ranks_by(values: Sequence) -> str:
    """ "ranks [0, 2] X, ranks [1] Y" for the ranks' values, in first-rank order."""
    groups: dict = {}
    for rank, v in enumerate(values):
        groups.setdefault(v, []).append(rank)
    return ", ".join(f"rank{'s' if len(rs) > 1 else ''} {rs if len(rs) > 1 else rs[0]} {v}" for v, rs in groups.items())


def rank_consensus(plans: Sequence[Plan]) -> CheckOutcome:
    """Whether the ranks' plans (rank order) agree; if not, which ranks differ and where first."""
    if len(set(plans)) <= 1:
        mode = plans[0][0] if plans else ""
        return CheckOutcome(CHECK_RANK_CONSENSUS, True, detail=f"{len(plans)} ranks: {mode}")
    modes = [p[0] for p in plans]
    if len(set(modes)) > 1:
        return CheckOutcome(CHECK_RANK_CONSENSUS, False, detail="resolved " + _ranks_by(modes))
    steps = [p[1] for p in plans]
    n = max(len(s) for s in steps)
    at = [tuple(s[i] if i < len(s) else "no step" for s in steps) for i in range(n)]
    step = next(i for i, graphs in enumerate(at) if len(set(graphs)) > 1)
    return CheckOutcome(CHECK_RANK_CONSENSUS, False, step=step, detail=f"step {step}: " + _ranks_by(at[step]))


def consensus_reason(check: CheckOutcome) -> str:
    return f"{check.name} check failed: {check.detail}"


def merge_rank_results(results: Sequence[CaseResult]) -> CaseResult:
    """A gang's verdict: the worst rank's result (error > timeout > fail > unverifiable > flaky >
    skip > pass), its reason prefixed with the rank; the ranks that agree are noted. Where every
    rank ran its steps, the rank_consensus check is added; failed, the gang FAILs on it."""
    if not results:
        raise ValueError("no rank results to merge")
    if len(results) == 1:
        return results[0]
    worst_i = max(range(len(results)), key=lambda i: (_SEVERITY.get(results[i].status, 2), -i))
    worst = results[worst_i]
    same = [i for i, r in enumerate(results) if r.status == worst.status]
    ranks = "all ranks" if len(same) == len(results) else f"ranks {same}"
    reason = f"rank {worst_i}: {worst.reason}" if worst.reason else ""
    if worst.status != Status.PASS:
        reason = f"{reason} [{ranks} {worst.status.value}]"
    timings = dict(worst.timings)
    if all("total_s" in r.timings for r in results):
        timings["total_s"] = max(r.timings["total_s"] for r in results)
    if all("device_s" in r.timings for r in results):  # GPU-seconds: every rank holds its device
        timings["device_s"] = sum(r.timings["device_s"] for r in results)
    merged = worst.replace(
        reason=reason.strip(), worker=",".join(r.worker for r in results if r.worker), timings=timings
    )
    if not all(r.status in _RAN for r in results):
        return merged
    check = rank_consensus([plan_of(r) for r in results])
    checks = tuple(c for c in worst.checks if c.name != CHECK_RANK_CONSENSUS) + (check,)
    if check.passed:
        return merged.replace(checks=checks)
    own = (
        ""
        if worst.status == Status.FAIL and worst.reason.startswith(CHECK_RANK_CONSENSUS)
        else f" (worst rank's own verdict: {merged.status.value}{': ' + merged.reason if merged.reason else ''})"
    )
    return merged.replace(status=Status.FAIL, reason=consensus_reason(check) + own, checks=checks)
