"""The CI gate: a pure function from results (+ baseline, + known failures) to a verdict.

Semantics ("no new breakage"):
- failing statuses are fail, error, timeout;
- a failing case matching a known-failures entry is `known-fail` (xfail): reported, not gating;
- a known-failures entry whose case now passes is `fixed`: reported ("remove the entry"), not gating;
- with a baseline: a failing case that also failed there is an `old-failure` (reported, not gating);
  one that passed (or was flaky) there is a `regression`; one absent or skipped there is `new`.
  Regressions and new failures fail the gate;
- without a baseline every failing case keeps its status as classification and fails the gate;
- planned cases with no result (an interrupted run) are `missing` and fail the gate: a run that
  did not finish cannot vouch for anything;
- a required case that was runnable but never ran (placement timed out, gang never came up) is
  `not-run`: it fails the gate as an infrastructure error (exit 3) unless a real failure is also
  present (then exit 1: the code is broken whatever the machines did); it never counts as a pass;
- out of memory (`oom`): an ERROR of error_kind `oom`, a case that ran out of device memory again
  when rerun alone on a cleared worker (backend/harness/memory.py): the harness's memory, not the
  backend's verdict. It gates like not-run, as infrastructure (exit 3 when nothing else gates), is
  listed apart from the backend's failures, and is never compared with a baseline or a known failure;
- graphs the CPU emulation could not fully follow (e.g. a kernel a C extension launched behind the
  dispatcher; the reason starts "emulation: unverifiable — "): a case whose checks all passed is
  `pass-unverifiable`, counted apart from pass and listed, not gating; a case whose replay disagreed
  with eager there is status UNVERIFIABLE, classification `unverifiable`: it fails the gate (exit 1)
  unless the run allows it (`allow_unverifiable`, `--allow-unverifiable`), and is listed apart either
  way: run it on a GPU to decide (an observed disagreement is never a green);
- muted (a known-failures entry with `mute: true`): ran and reported with its real status, never
  gates, never "fixed"; an expired entry no longer applies: its cases gate and
  `GateOutcome.expired` names the entry beside each;
- a failing case whose history over the last runs of its label scores as flaky (flakiness.py;
  `--flaky-threshold`) is `flaky` too: reported with its score, not gating;
- flaky (one attempt passed, one did not) does not fail the gate but is listed; skip (cannot run
  here: unsupported, excluded by the matrix, tp larger than any node) never fails; a downgraded mode
  is a warning;
- but a run in which nothing ran, or a `--require`d slice did not, does not pass (exit 1) unless
  `--allow-empty` (the whole run only): orchestrator/empty_run.py.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from backend.result import CaseResult, Status
from orchestrator.digest import plural
from orchestrator.empty_run import Unran, nothing_ran, unran
from orchestrator.errors import ExitCode
from orchestrator.known_failures import KnownFailure, KnownFailures

FAILING = frozenset({Status.FAIL, Status.ERROR, Status.TIMEOUT})


class Classification(str, enum.Enum):
    """What the gate made of a case. A `str` Enum: stored, JSON and JUnit values are the strings
    they always were, and a member equals its value ("muted" == Classification.MUTED)."""

    REGRESSION = "regression"
    NEW = "new"
    FAIL = "fail"
    ERROR = "error"
    TIMEOUT = "timeout"
    NOT_RUN = "not-run"
    OOM = "oom"
    MISSING = "missing"
    UNVERIFIABLE = "unverifiable"
    OLD_FAILURE = "old-failure"
    FLAKY = "flaky"
    PASS_UNVERIFIABLE = "pass-unverifiable"
    KNOWN_FAIL = "known-fail"
    MUTED = "muted"
    FIXED = "fixed"
    SKIP = "skip"
    PASS = "pass"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


C = Classification
# Classifications, in the order reports list them (worst first): the Enum's own order.
CLASSIFICATIONS = tuple(Classification)
GATING = frozenset({C.REGRESSION, C.NEW, C.FAIL, C.ERROR, C.TIMEOUT, C.NOT_RUN, C.OOM, C.MISSING, C.UNVERIFIABLE})
ALLOWABLE = frozenset({C.UNVERIFIABLE})  # gating unless the run allows it (evaluate's allow_unverifiable)
INFRA = frozenset({C.NOT_RUN, C.OOM})  # gating, but the machinery's fault: exit 3 when nothing else gates
# Failing cases with nothing to excuse them: what a paste-ready known-failures entry would cover.
NEW_FAILURES = (C.REGRESSION, C.NEW, C.FAIL, C.ERROR, C.TIMEOUT)
OOM_KIND = "oom"  # CaseResult.error_kind (backend/harness/memory.py; torch-free here)


@dataclass(frozen=True)
class GateOutcome:
    exit_code: ExitCode
    classification: dict[str, Classification]  # case_id -> its class
    regressions: tuple[str, ...] = ()  # failing now, passed (or flaky) in the baseline
    new_failures: tuple[str, ...] = ()  # failing now, nothing to compare with (no/absent/skipped baseline)
    old_failures: tuple[str, ...] = ()  # failing now and in the baseline
    known_failures: tuple[str, ...] = ()  # failing and matched by a known-failures entry
    fixed: tuple[str, ...] = ()  # matched by a known-failures entry but passing: remove the entry
    flaky: tuple[str, ...] = ()
    unverifiable: tuple[str, ...] = ()  # the emulation saw a disagreement it cannot vouch for: a GPU decides
    pass_unverifiable: tuple[str, ...] = ()  # passed on the CPU emulation, which says it cannot vouch for it
    downgraded: tuple[str, ...] = ()  # resolved mode != requested mode (warning)
    missing: tuple[str, ...] = ()  # planned, no result
    not_run: tuple[str, ...] = ()  # required, runnable, never ran (infrastructure)
    oom: tuple[str, ...] = ()  # ran out of device memory when alone (infrastructure)
    counts: dict[Classification, int] = field(default_factory=dict)  # per classification, all keys present
    known_reasons: dict[str, KnownFailure] = field(default_factory=dict)  # case_id -> entry that matched
    baseline_status: dict[str, str] = field(default_factory=dict)  # case_id -> its status in the baseline
    muted: tuple[str, ...] = ()  # matched by a `mute: true` entry: reported with its real status
    expired: dict[str, KnownFailure] = field(default_factory=dict)  # case_id -> expired entry it matches (gates again)
    flaky_history: dict[str, str] = field(default_factory=dict)  # case_id -> why its history says flaky (not gating)
    unran: tuple[Unran, ...] = ()  # slices that should have run and did not (empty_run.py)
    empty_allowed: bool = False  # nothing ran, and --allow-empty let it pass
    allow_unverifiable: bool = False  # unverifiable cases were allowed: listed, not gating

    @property
    def passed(self) -> bool:
        return self.exit_code == ExitCode.OK

    @property
    def gating(self) -> tuple[str, ...]:
        """The case ids that failed the gate, worst class first."""
        gating = gating_classes(self.allow_unverifiable)
        return tuple(
            cid
            for cls in CLASSIFICATIONS
            if cls in gating
            for cid, c in sorted(self.classification.items())
            if c == cls
        )

    def ran(self) -> str:
        """What ran, truthfully: "1000 ran (1000 pass), 1245 skipped" (skipped only when any;
        not-run and missing cases did not run)."""
        c = Counter(self.classification.values())
        C = Classification
        ran = len(self.classification) - c[C.SKIP] - c[C.NOT_RUN] - c[C.MISSING]
        text = f"{ran} ran" + (f" ({c[C.PASS]} pass)" if ran else "")
        return text + (f", {c[C.SKIP]} skipped" if c[C.SKIP] else "")

    def verdict(self) -> str:
        total = len(self.classification)
        if self.passed:
            if self.empty_allowed:
                return f"gate PASSED (--allow-empty): nothing ran, {plural(total, 'case')} skipped"
            extra = []
            if self.old_failures:
                extra.append(plural(len(self.old_failures), "old failure"))
            if self.known_failures:
                extra.append(plural(len(self.known_failures), "known failure"))
            if self.flaky:
                extra.append(f"{len(self.flaky)} flaky")
            if self.unverifiable:
                extra.append(f"{len(self.unverifiable)} unverifiable allowed (run on a GPU to decide)")
            if self.pass_unverifiable:
                extra.append(f"{len(self.pass_unverifiable)} unverifiable on the emulation")
            if self.muted:
                extra.append(f"{len(self.muted)} muted")
            tail = f" ({', '.join(extra)} not gating)" if extra else ""
            return f"gate PASSED: {self.ran()}, no new failures{tail}"
        parts = []
        for name, many, ids in (
            ("regression", None, self.regressions),
            ("new failure", None, self.new_failures),
            ("missing", "missing", self.missing),
            ("not run (infrastructure)", "not run (infrastructure)", self.not_run),
            ("out of memory (infrastructure)", "out of memory (infrastructure)", self.oom),
            (
                "unverifiable (run on a GPU to decide)",
                "unverifiable (run on a GPU to decide)",
                () if self.allow_unverifiable else self.unverifiable,
            ),
        ):
            if ids:
                parts.append(plural(len(ids), name, many))
        lines = [f"{', '.join(parts)}; {self.ran()}"] if parts else []
        return "gate FAILED: " + "; ".join(lines + [u.line() for u in self.unran])

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "exit_code": int(self.exit_code),
            "verdict": self.verdict(),
            "counts": {c.value: n for c, n in self.counts.items()},
            "classification": {cid: c.value for cid, c in self.classification.items()},
            "regressions": list(self.regressions),
            "new_failures": list(self.new_failures),
            "old_failures": list(self.old_failures),
            "known_failures": list(self.known_failures),
            "fixed": list(self.fixed),
            "flaky": list(self.flaky),
            "unverifiable": list(self.unverifiable),
            "pass_unverifiable": list(self.pass_unverifiable),
            "allow_unverifiable": self.allow_unverifiable,
            "downgraded": list(self.downgraded),
            "missing": list(self.missing),
            "not_run": list(self.not_run),
            "oom": list(self.oom),
            "muted": list(self.muted),
            "expired": {cid: e.where for cid, e in self.expired.items()},
            "flaky_history": dict(self.flaky_history),
            "unran": [u.line() for u in self.unran],
        }


def classify(
    r: CaseResult,
    base: CaseResult | None,
    have_baseline: bool,
    known: KnownFailure | None,
    history_flaky: bool = False,
) -> Classification:
    if r.status == Status.SKIP:
        return C.SKIP
    if r.status == Status.NOT_RUN:
        return C.NOT_RUN  # not comparable with a baseline or a known failure: nothing was observed
    if r.status == Status.ERROR and r.error_kind == OOM_KIND:
        return C.OOM  # the harness's memory: nothing was observed of the backend either
    if known is not None and known.mute:
        return C.MUTED
    if r.status == Status.FLAKY:
        return C.FLAKY
    if r.status == Status.UNVERIFIABLE:
        return C.UNVERIFIABLE  # nothing decided: not a failure to compare or match, not a pass
    if r.status == Status.PASS:
        if known is not None:
            return C.FIXED
        return C.PASS_UNVERIFIABLE if r.unverifiable else C.PASS
    # failing from here on
    if known is not None:
        return C.KNOWN_FAIL
    if history_flaky:
        return C.FLAKY
    if not have_baseline:
        return Classification(r.status.value)
    if base is None or base.status == Status.SKIP:
        return C.NEW
    if base.status in FAILING:
        return C.OLD_FAILURE
    return C.REGRESSION


@dataclass(frozen=True)
class GateRules:
    """The gate's rules a command line sets (--require, --allow-empty, --allow-unverifiable):
    `require` and `allow_empty` are the empty-run rule (empty_run.py); `allow_unverifiable` lists
    unverifiable cases without gating on them."""

    require: tuple[str, ...] = ()
    allow_empty: bool = False
    allow_unverifiable: bool = False


def evaluate(
    results: Sequence[CaseResult],
    *,
    baseline: Sequence[CaseResult] | None = None,
    known: KnownFailures | None = None,
    missing: Sequence[str] = (),
    flaky_history: Mapping[str, str] | None = None,
    rules: GateRules = GateRules(),
    judge_empty: bool = True,
) -> GateOutcome:
    """flaky_history: case_id -> reason, for the cases whose recent history scores them flaky
    (flakiness.py): failing, they are `flaky` rather than gating. `judge_empty` False for a run
    still writing, whose cases may yet come."""
    require, allow_empty, allow_unverifiable = rules.require, rules.allow_empty, rules.allow_unverifiable
    base = {b.case_id: b for b in baseline} if baseline is not None else {}
    flaky_history = flaky_history or {}
    classification: dict[str, Classification] = {}
    known_reasons: dict[str, KnownFailure] = {}
    expired: dict[str, KnownFailure] = {}
    for r in results:
        entry = known.match(r.case_id) if known is not None else None
        if entry is not None and (r.status in (FAILING | {Status.PASS}) or (entry.mute and r.status == Status.FLAKY)):
            known_reasons[r.case_id] = entry
        if entry is None and known is not None and r.status in FAILING:
            old = known.expired_match(r.case_id)
            if old is not None:
                expired[r.case_id] = old
        classification[r.case_id] = classify(
            r,
            base.get(r.case_id),
            baseline is not None,
            entry,
            history_flaky=r.status in FAILING and r.case_id in flaky_history,
        )
    for cid in missing:
        classification.setdefault(cid, C.MISSING)

    def ids(*classes: Classification) -> tuple[str, ...]:
        return tuple(sorted(cid for cid, c in classification.items() if c in classes))

    counts = Counter(classification.values())
    gating = {c for c in classification.values() if c in gating_classes(allow_unverifiable)}
    if not gating:
        code = ExitCode.OK
    elif gating <= INFRA:
        code = ExitCode.INFRA_ERROR
    else:
        code = ExitCode.GATE_FAILED
    empty = unran(results, require=require, allow_empty=allow_empty, whole_run=not gating) if judge_empty else ()
    if empty and code == ExitCode.OK:
        code = ExitCode.GATE_FAILED
    return GateOutcome(
        exit_code=code,
        classification=classification,
        regressions=ids(C.REGRESSION),
        new_failures=ids(C.NEW, C.FAIL, C.ERROR, C.TIMEOUT),
        old_failures=ids(C.OLD_FAILURE),
        known_failures=ids(C.KNOWN_FAIL),
        fixed=ids(C.FIXED),
        flaky=ids(C.FLAKY),
        unverifiable=ids(C.UNVERIFIABLE),
        pass_unverifiable=ids(C.PASS_UNVERIFIABLE),
        downgraded=tuple(sorted(r.case_id for r in results if r.downgraded)),
        missing=ids(C.MISSING),
        not_run=ids(C.NOT_RUN),
        oom=ids(C.OOM),
        counts={c: counts.get(c, 0) for c in CLASSIFICATIONS},
        known_reasons=known_reasons,
        baseline_status={cid: b.status.value for cid, b in base.items()},
        muted=ids(C.MUTED),
        expired=expired,
        flaky_history={cid: why for cid, why in flaky_history.items() if classification.get(cid) == C.FLAKY},
        unran=empty,
        empty_allowed=judge_empty and allow_empty and not gating and nothing_ran(results),
        allow_unverifiable=allow_unverifiable,
    )


def gating_classes(allow_unverifiable: bool = False) -> frozenset[Classification]:
    """The classifications that fail the gate (GATING, less ALLOWABLE when the run allows those)."""
    return GATING - ALLOWABLE if allow_unverifiable else GATING
