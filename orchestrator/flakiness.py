"""Flakiness over time: a case's verdicts over the last runs of a label, scored.

Per run a case is pass (P), failing (F: fail, error, timeout) or flaky (one of its two attempts
passed: a pass on retry, or a fail on retry); skipped, not-run and absent runs are not observed.
Over the observed runs, oldest first:

    flips    P<->F changes between consecutive P/F runs (a flaky run is not part of the chain)
    retried  runs where the case was flaky
    score    (flips + retried) / (2n - 1) for n observed runs: 0 for a steady case, 1 for one
             that flipped every run and was flaky in each (the most either count can reach)

vLLM's AMD tracker counts pass<->fail flips over a 60-day window; Buildkite scores flakiness from
retries that passed. The gate's window is the N runs of the gated run's history (the same runs a
label baseline is chosen from: refs.history_runs), never the gated run itself, so a case that was
steady and fails now is a regression with score 0, and a case that has been flipping all along
is `flaky` rather than gating when its score is over `--flaky-threshold`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from backend.result import Status
from orchestrator.errors import InputError

DEFAULT_WINDOW = 20
_FAILING = frozenset({Status.FAIL.value, Status.ERROR.value, Status.TIMEOUT.value})


@dataclass(frozen=True)
class Flakiness:
    runs: int  # observed runs in the window
    flips: int
    retried: int
    score: float

    def describe(self) -> str:
        return (
            f"flakiness {self.score:.2f} over its last {self.runs} run(s): {self.flips} pass/fail flip(s), "
            f"{self.retried} flaky on retry"
        )

    def to_dict(self) -> dict:
        return {"runs": self.runs, "flips": self.flips, "retried": self.retried, "score": round(self.score, 3)}


def score(statuses: Sequence[str]) -> Flakiness:
    """`statuses`: one per run, oldest first (Status values)."""
    observed = [s for s in statuses if s == Status.PASS.value or s in _FAILING or s == Status.FLAKY.value]
    chain = ["F" if s in _FAILING else "P" for s in observed if s != Status.FLAKY.value]
    flips = sum(1 for a, b in itertools.pairwise(chain) if a != b)
    retried = sum(1 for s in observed if s == Status.FLAKY.value)
    n = len(observed)
    return Flakiness(n, flips, retried, (flips + retried) / (2 * n - 1) if n else 0.0)


def scores(history: Mapping[str, Sequence[tuple]]) -> dict[str, Flakiness]:
    """case_id -> Flakiness from store.status_history rows ((run id, status, ...), newest first)."""
    return {cid: score([row[1] for row in sorted(rows, key=lambda row: row[0])]) for cid, rows in history.items()}


def over_threshold(found: Mapping[str, Flakiness], threshold: float | None) -> dict[str, str]:
    """case_id -> why, for the gate: the cases whose score is over the threshold."""
    if threshold is None:
        return {}
    return {cid: f.describe() for cid, f in found.items() if f.score > threshold}


def options(window: int | None, threshold: float | None) -> dict:
    """--flaky-window / --flaky-threshold, checked (exit 2); the window defaulted when not given."""
    if window is not None and window < 1:
        raise InputError(f"--flaky-window must be >= 1, got {window}")
    if threshold is not None and not 0.0 <= threshold < 1.0:
        raise InputError(f"--flaky-threshold must be in [0, 1), got {threshold}")
    return {"flaky_window": DEFAULT_WINDOW if window is None else window, "flaky_threshold": threshold}
