"""From the checks' outcomes to a status (`status_of`): a failed check is FAIL unless eager's own
jitter explains it (then FLAKY); NaN and writes outside the real slots never are jitter; graphs
the CPU emulation could not follow make a graph-only disagreement UNVERIFIABLE, never a pass."""

from __future__ import annotations

from collections.abc import Sequence

from backend.harness.checks import failure_reason
from backend.result import (
    CHECK_ATTN_REFERENCE,
    CHECK_ATTN_REPLAY,
    CHECK_DETERMINISM,
    CHECK_FINITE,
    CHECK_KV_INTEGRITY,
    CHECK_PADDED_FINITE,
    CHECK_REPLAY,
    CHECK_STATE_INTEGRITY,
    UNVERIFIABLE_ADVICE,
    UNVERIFIABLE_PREFIX,
    CheckOutcome,
    Status,
)

# state_integrity's detail names which of its parts failed (backend/families/gdn_state.py).
STATE_GRAPH_ONLY = "the graph run's state differs from eager's"
STATE_NEVER_JITTER = ("outside", "metadata")

# A check failure counts as eager jitter only when its error is within this factor of the jitter
# measured between two eager runs: a wrong kernel that also jitters by an ulp must stay FAIL.
JITTER_FACTOR = 4.0


def explained_by_jitter(check, det, kv_jitter: bool, attn_jitter: float = 0.0) -> bool:
    """Whether a failed check could be the nondeterminism `det` measured rather than a bug
    (`attn_jitter`: the same measure on the attention outputs, for the per-head checks)."""
    if check.name in (CHECK_FINITE, CHECK_PADDED_FINITE):
        return False  # NaN/Inf is never rounding jitter
    if check.name == CHECK_KV_INTEGRITY:
        return kv_jitter and "outside" not in check.detail  # writes outside the real slots are a bug
    if check.name == CHECK_STATE_INTEGRITY:  # the same, for state slots; a metadata contract is no jitter
        return kv_jitter and not any(w in check.detail for w in STATE_NEVER_JITTER)
    if check.max_abs_err is None or det.max_abs_err is None:
        return False
    jitter = attn_jitter if check.name in (CHECK_ATTN_REFERENCE, CHECK_ATTN_REPLAY) else det.max_abs_err
    return check.max_abs_err <= JITTER_FACTOR * jitter


def graph_only(check) -> bool:
    """A failure of the graph run's values alone (eager and the reference agree); a write outside
    the real slots is never one of these. A check's detail is `step N: <what>` (checks.py)."""
    return (
        check.name in (CHECK_REPLAY, CHECK_ATTN_REPLAY, CHECK_PADDED_FINITE)
        or (check.name == CHECK_FINITE and check.detail.rsplit(": ", 1)[-1] == "graph")
        or (check.name == CHECK_KV_INTEGRITY and "outside" not in check.detail)
        or (check.name == CHECK_STATE_INTEGRITY and STATE_GRAPH_ONLY in check.detail)
    )


def status_of(
    checks: Sequence[CheckOutcome], unverifiable: Sequence[str], kv_jitter: bool, attn_jitter: float
) -> tuple[Status, str]:
    """A case's status and reason from its checks. `unverifiable`: why the CPU emulation could
    not follow some of its graphs (a launch behind the dispatcher): then it vouches for no pass
    (PASS with the note, counted apart) and for no failure of the graph side alone, but a
    disagreement it saw is never a pass (UNVERIFIABLE, which gates unless allowed).
    `kv_jitter` / `attn_jitter`: the nondeterminism eager showed (explained_by_jitter)."""
    failed = [c for c in checks if not c.passed]
    if unverifiable and all(graph_only(c) for c in failed):
        if not failed:
            return Status.PASS, UNVERIFIABLE_PREFIX + unverifiable[0]
        return Status.UNVERIFIABLE, (
            f"{UNVERIFIABLE_PREFIX}{unverifiable[0]}; the graph side disagreed with eager "
            f"from step {min(c.step or 0 for c in failed)} "
            f"({', '.join(c.name for c in failed)}): {UNVERIFIABLE_ADVICE}"
        )
    if not failed:
        return Status.PASS, ""
    det = next((c for c in failed if c.name == CHECK_DETERMINISM), None)
    real = [
        c
        for c in failed
        if c.name != CHECK_DETERMINISM and not (det and explained_by_jitter(c, det, kv_jitter, attn_jitter))
    ]
    if real or det is None:
        note = f" (eager also not deterministic, max_abs {det.max_abs_err:.3g})" if det else ""
        return Status.FAIL, failure_reason(real[0]) + note
    others = [c.name for c in failed if c.name != CHECK_DETERMINISM]
    note = f" (also failed: {', '.join(others)})" if others else ""
    return Status.FLAKY, f"eager not deterministic at step {det.step}{note}"
