"""The verdict for one case: small, frozen, JSON-able. Produced by the checker (in a plain process,
under pytest or in a Ray actor, identically) and consumed by the store, gate, reports and dashboard.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from backend.case import field_names


class Status(str, enum.Enum):
    """Verdict of one case. `known-fail` and `regression` are gate-level classifications of these,
    made against a known-failures file or a baseline run; they are not produced by workers."""

    PASS = "pass"
    FAIL = "fail"  # a check failed: numbers in `checks`
    ERROR = "error"  # an exception, a capture error, or a crashed worker (log tail kept)
    TIMEOUT = "timeout"  # ran past its deadline; the worker was killed and recreated
    FLAKY = "flaky"  # eager not deterministic, or one attempt passed and the other did not
    # The CPU emulation saw the graph side disagree with eager on graphs it could not fully follow
    # (a launch behind the dispatcher, backend/graphs/opaque.py): not a pass, not a proven failure.
    # Fails the gate unless the run allows it (--allow-unverifiable): run it on a GPU to decide.
    UNVERIFIABLE = "unverifiable"
    SKIP = "skip"  # unsupported here (provider unavailable, placement impossible, ...): reason says why
    # Required and runnable here, but it never ran (placement timed out, tp gang never came up):
    # an infrastructure outcome, never a pass. error_kind "placement" | "gang"; reason says why.
    NOT_RUN = "not-run"

    def __str__(self) -> str:
        return self.value


# A case whose graphs the CPU emulation could not fully follow (backend/graphs/opaque.py): its
# reason starts with this. Every check passed: status PASS, counted apart from pass and not gating
# ("pass-unverifiable"); a graph-side check failed: status UNVERIFIABLE, reason ending with
# UNVERIFIABLE_ADVICE, its checks keep what failed (gating unless allowed).
UNVERIFIABLE_PREFIX = "emulation: unverifiable — "
UNVERIFIABLE_ADVICE = "run on a GPU to decide"

# Names of the checks (DESIGN.md §5), in the order they are reported.
CHECK_REFERENCE = "reference"  # eager vs an independent fp32 reference
CHECK_REPLAY = "replay"  # graph replay vs eager
CHECK_FINITE = "finite"  # no NaN/Inf on real rows
CHECK_KV_INTEGRITY = "kv_integrity"  # no KV-cache write outside the real slots
CHECK_DETERMINISM = "determinism"  # eager twice gives the same answer
CHECK_PADDED_FINITE = "padded_finite"  # a FULL graph's padded output rows hold no NaN/Inf
# The attention op's output [tokens, heads, head_size] per head, in every layer (one
# wrong head of 32 is diluted in the residual stream the first two compare).
CHECK_ATTN_REFERENCE = "attn_reference"  # eager attention vs the reference's, per head
CHECK_ATTN_REPLAY = "attn_replay"  # graph attention vs eager's, per head
# A family whose requests keep state across steps (hybrid_gdn's StepState): slots no real row
# owns unchanged, owned slots' new state against the reference's and eager's, the state metadata's
# padding contract (docs/CHECKER.md "state_integrity"). Reported only by cases of such a family.
CHECK_STATE_INTEGRITY = "state_integrity"
CHECK_NAMES = (
    CHECK_REFERENCE,
    CHECK_REPLAY,
    CHECK_FINITE,
    CHECK_KV_INTEGRITY,
    CHECK_STATE_INTEGRITY,
    CHECK_DETERMINISM,
    CHECK_PADDED_FINITE,
    CHECK_ATTN_REFERENCE,
    CHECK_ATTN_REPLAY,
)
# A tp gang's own check (backend/rank_merge.py), not a rank's: every rank resolved the same mode and
# dispatched every step to the same graph (vLLM #45094: one pipeline rank PIECEWISE, another NONE).
CHECK_RANK_CONSENSUS = "rank_consensus"
# The checks every case reports; a family adds its own (AttentionFamily.extra_checks).
CORE_CHECKS = tuple(n for n in CHECK_NAMES if n != CHECK_STATE_INTEGRITY)


def checks_for(extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The checks a case reports, in CHECK_NAMES order: the core ones and its family's `extra`."""
    return tuple(n for n in CHECK_NAMES if n in CORE_CHECKS or n in extra)


@dataclass(frozen=True)
class CheckOutcome:
    name: str  # one of CHECK_NAMES
    passed: bool
    step: int | None = None  # first failing step (or None)
    max_abs_err: float | None = None  # worst over steps
    max_rel_err: float | None = None
    mismatch_frac: float | None = None  # fraction of elements outside tolerance, worst step
    first_bad: tuple[int, int] | None = None  # (row/token, head) of the first bad element
    bitwise: bool | None = None  # replay check: were replay and eager bit-identical on every step
    detail: str = ""

    def summary(self) -> str:
        parts = [f"{self.name}: {'ok' if self.passed else 'FAILED'}"]
        if self.step is not None and not self.passed:
            parts.append(f"step {self.step}")
        if self.max_abs_err is not None:
            parts.append(f"max_abs={self.max_abs_err:.3g}")
        if self.max_rel_err is not None:
            parts.append(f"max_rel={self.max_rel_err:.3g}")
        if self.mismatch_frac is not None and not self.passed:
            parts.append(f"mismatched={self.mismatch_frac:.1%}")
        if self.first_bad is not None:
            parts.append(f"first bad row {self.first_bad[0]} head {self.first_bad[1]}")
        if self.bitwise is not None:
            parts.append("bitwise" if self.bitwise else "not bitwise")
        if self.detail:
            parts.append(self.detail)
        return ", ".join(parts)


@dataclass(frozen=True)
class CaseResult:
    case_id: str
    status: Status
    reason: str = ""  # one line: the failing check, the exception, or the skip reason
    checks: tuple[CheckOutcome, ...] = ()
    requested_mode: str = ""
    resolved_mode: str = ""  # after resolution against the backend's support level
    downgraded: bool = False  # resolved_mode != requested_mode (a warning, shown in every report)
    graph_kind: str = "none"  # "cuda" | "hip" | "emulated" | "none"
    provider: str = ""  # the kernel provider that actually ran
    capture_sizes_used: tuple[int, ...] = ()  # per step: padded size replayed, 0 = ran eager
    # Per step, the graph the step dispatched to ("FULL 8", "FULL 4 decode", "PIECEWISE 16", "NONE"):
    # what the ranks of a gang must agree on (rank_merge). Crosses Ray with the result; not a
    # column of the store (the merged result's rank_consensus check is what is kept).
    step_graphs: tuple[str, ...] = ()
    error_kind: str = ""  # "capture" | "exception" | "crash" | "timeout" | "placement" | "gang" | ""
    timings: dict[str, float] = field(default_factory=dict)  # capture_s, eager_step_s, replay_step_s, total_s
    device: str = ""  # e.g. "cpu", "NVIDIA H200 (cuda:0)"
    versions: dict[str, str] = field(default_factory=dict)  # torch, triton, aiter, ray, orch, python
    log_tail: str = ""
    repro: str = ""  # one-line command that re-runs this case
    attempts: int = 1
    worker: str = ""  # actor / gpu that produced the last attempt
    axes: dict[str, Any] = field(default_factory=dict)  # Case.axes, for reports that only have results
    # Device memory of the case in bytes (docs/EXECUTION.md "GPU memory"): peak_allocated,
    # peak_reserved (during the case), session (KV caches, snapshots, graph pool of the session it
    # ran in), worker_reserved_at_start, budget; empty where nothing was measured (CPU, a skip).
    memory: dict[str, int] = field(default_factory=dict)

    @property
    def unverifiable(self) -> bool:
        """A pass the emulation cannot vouch for (UNVERIFIABLE_PREFIX): every check passed on graphs
        it could not fully follow. (A disagreement seen there is Status.UNVERIFIABLE, not a pass.)"""
        return self.status == Status.PASS and self.reason.startswith(UNVERIFIABLE_PREFIX)

    @property
    def failed_checks(self) -> tuple[CheckOutcome, ...]:
        return tuple(c for c in self.checks if not c.passed)

    def to_dict(self) -> dict[str, Any]:
        """dataclasses.asdict(self) with status as its value, without asdict's recursive deep copy
        (the dict fields hold scalars: a shallow copy each). Every result crosses Ray and the store
        as this dict; tests/results/test_store.py holds it to asdict."""
        d = {name: getattr(self, name) for name in field_names(type(self))}
        d["status"] = self.status.value
        d["checks"] = tuple({name: getattr(c, name) for name in field_names(type(c))} for c in self.checks)
        d["timings"], d["versions"], d["axes"] = dict(self.timings), dict(self.versions), dict(self.axes)
        d["memory"] = dict(self.memory)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaseResult:
        d = dict(d)
        d["status"] = Status(d["status"])
        d["checks"] = tuple(
            CheckOutcome(**{**c, "first_bad": tuple(c["first_bad"]) if c.get("first_bad") is not None else None})
            for c in d.get("checks", ())
        )
        d["capture_sizes_used"] = tuple(d.get("capture_sizes_used", ()))
        d["step_graphs"] = tuple(d.get("step_graphs", ()))
        return cls(**d)

    def replace(self, **changes: Any) -> CaseResult:
        return dataclasses.replace(self, **changes)
