"""A tp gang's verdict from its ranks' results. Torch-free: the driver of `orch run` merges the
ranks' results of every tp > 1 case (issue 13: the driver does not import torch)."""

from __future__ import annotations

from collections.abc import Sequence

from backend.result import CaseResult, Status

_SEVERITY = {Status.ERROR: 7, Status.TIMEOUT: 6, Status.FAIL: 5, Status.UNVERIFIABLE: 4, Status.FLAKY: 3, Status.SKIP: 1,
             Status.PASS: 0}


def merge_rank_results(results: Sequence[CaseResult]) -> CaseResult:
    """A gang's verdict: the worst rank's result (error > timeout > fail > unverifiable > flaky > skip > pass),
    its reason prefixed with the rank; the ranks that agree are noted."""
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
    return worst.replace(reason=reason.strip(), worker=",".join(r.worker for r in results if r.worker),
                         timings=timings)
