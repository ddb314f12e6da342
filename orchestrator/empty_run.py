"""The gate's empty-run rule: a run in which nothing ran does not pass.

A CI job whose GPU, driver or vllm install broke skips every case ("unavailable: needs a CUDA/ROCm
GPU"); counting 75 skips as "no new failures" turned that job green. So:
- nothing ran (no case has a result but skips) -> the gate fails (exit 1), naming the skips by
  reason: "nothing ran: 75 skipped (needs a CUDA/ROCm GPU (Triton): 75)"; `--allow-empty` lets
  such a run pass, saying so;
- `--require FILTER` (repeatable, the `--filter` language): that slice must have run, at least one
  case of it, whatever else did: "required `backend=aiter-triton` did not run: ...".
Not-run (infrastructure) and missing cases already gate, with their own words: the whole-run rule
is only asked when nothing else gates. Pure, torch-free; `gate.evaluate` calls `unran`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from backend.result import CaseResult, Status

# Statuses of a case that did not run here: skipped, or never placed (not-run gates on its own).
_DID_NOT_RUN = frozenset({Status.SKIP, Status.NOT_RUN})
SHOWN_REASONS = 3


@dataclass(frozen=True)
class Unran:
    """A slice of the run (`require` "" = the whole run) in which no case ran."""

    require: str
    cases: int  # of the slice
    skipped: int
    reasons: tuple[tuple[str, int], ...]  # (short skip reason, cases), most first

    def line(self) -> str:
        """ "nothing ran: 75 skipped (needs a CUDA/ROCm GPU (Triton): 75)"."""
        what = "nothing ran" if not self.require else f"required `{self.require}` did not run"
        if not self.cases:
            return f"{what}: no case of this run matches it"
        shown = "; ".join(f"{why}: {n}" for why, n in self.reasons[:SHOWN_REASONS])
        more = len(self.reasons) - SHOWN_REASONS
        shown += f"; and {more} more reason{'s' if more != 1 else ''}" if more > 0 else ""
        not_run = self.cases - self.skipped
        tail = f", {not_run} not run" if not_run else ""
        return f"{what}: {self.skipped} skipped ({shown}){tail}"


def short_reason(reason: str) -> str:
    """The reason that decides a skip, for a one-line count: of a skip's `; `-joined reasons the
    `unavailable:` one (the case cannot run here at all), else the first; without the prefix."""
    parts = [p.strip() for p in (reason or "skipped").split(";") if p.strip()] or ["skipped"]
    pick = next((p for p in parts if p.startswith("unavailable:")), parts[0])
    return pick.removeprefix("unavailable:").strip() or pick


def _unran(results: Sequence[CaseResult], require: str) -> Unran | None:
    if any(r.status not in _DID_NOT_RUN for r in results):
        return None
    reasons = Counter(short_reason(r.reason) for r in results if r.status == Status.SKIP)
    return Unran(
        require, len(results), sum(reasons.values()), tuple(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    )


def unran(
    results: Sequence[CaseResult], *, require: Sequence[str] = (), allow_empty: bool = False, whole_run: bool = True
) -> tuple[Unran, ...]:
    """The slices that should have run and did not: the whole run (unless `allow_empty`, or
    `whole_run` False: something else gates already), then each `require` filter."""
    from orchestrator.filters import parse_filter

    out = []
    if whole_run and not allow_empty:
        u = _unran(results, "")
        if u is not None and u.cases:
            out.append(u)
    for expr in require:
        flt = parse_filter(expr)
        u = _unran([r for r in results if flt.matches(r)], expr)
        if u is not None:
            out.append(u)
    return tuple(out)


def nothing_ran(results: Sequence[CaseResult]) -> bool:
    return bool(results) and all(r.status in _DID_NOT_RUN for r in results)
