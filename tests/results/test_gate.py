"""The gate as a scenario table: (now, baseline, known) -> classification and exit code."""

from __future__ import annotations

import datetime as dt

import pytest

from backend.result import Status
from orchestrator.errors import ExitCode
from orchestrator.gate import GateRules, evaluate
from orchestrator.known_failures import parse
from tests.results import samples

CASES = samples.make_cases()
C = CASES[0]
KNOWN = parse(
    f'- case: "{C.case_id}"\n  reason: tracked upstream\n  link: https://example.invalid/1\n  until: 2999-01-01\n'
)
NO_BASE = "no-baseline"
ABSENT = "absent"

# name: (status now, baseline status | NO_BASE | ABSENT, known?, expected classification, gate exit)
SCENARIOS = {
    "pass": (Status.PASS, NO_BASE, False, "pass", ExitCode.OK),
    "fail without baseline": (Status.FAIL, NO_BASE, False, "fail", ExitCode.GATE_FAILED),
    "error without baseline": (Status.ERROR, NO_BASE, False, "error", ExitCode.GATE_FAILED),
    "timeout without baseline": (Status.TIMEOUT, NO_BASE, False, "timeout", ExitCode.GATE_FAILED),
    # A run of nothing but skips is no pass (a CI job whose GPU broke went green): the
    # empty-run rule, tested on its own below.
    "skip alone: nothing ran": (Status.SKIP, NO_BASE, False, "skip", ExitCode.GATE_FAILED),
    "flaky is listed, not gating": (Status.FLAKY, Status.PASS, False, "flaky", ExitCode.OK),
    "known failure is xfail": (Status.FAIL, NO_BASE, True, "known-fail", ExitCode.OK),
    "known error is xfail": (Status.ERROR, Status.PASS, True, "known-fail", ExitCode.OK),
    "known failure now passes": (Status.PASS, Status.FAIL, True, "fixed", ExitCode.OK),
    "regression: passed in baseline": (Status.FAIL, Status.PASS, False, "regression", ExitCode.GATE_FAILED),
    "timeout regression": (Status.TIMEOUT, Status.PASS, False, "regression", ExitCode.GATE_FAILED),
    "regression from flaky": (Status.ERROR, Status.FLAKY, False, "regression", ExitCode.GATE_FAILED),
    "old failure does not gate": (Status.FAIL, Status.FAIL, False, "old-failure", ExitCode.OK),
    "error that was a timeout is old": (Status.ERROR, Status.TIMEOUT, False, "old-failure", ExitCode.OK),
    "new case failing": (Status.FAIL, ABSENT, False, "new", ExitCode.GATE_FAILED),
    "failing case skipped in baseline is new": (Status.FAIL, Status.SKIP, False, "new", ExitCode.GATE_FAILED),
    "new case passing": (Status.PASS, ABSENT, False, "pass", ExitCode.OK),
    # A required case that never ran is no pass: gating, and the machines' fault (exit 3).
    "not run is infrastructure": (Status.NOT_RUN, NO_BASE, False, "not-run", ExitCode.INFRA_ERROR),
    "not run though it passed before": (Status.NOT_RUN, Status.PASS, False, "not-run", ExitCode.INFRA_ERROR),
    "not run is never a known failure": (Status.NOT_RUN, NO_BASE, True, "not-run", ExitCode.INFRA_ERROR),
    # The emulation saw the replay disagree on graphs it cannot follow: never a pass, nothing
    # decided to compare with a baseline or match with a known failure; gating unless allowed.
    "unverifiable gates": (Status.UNVERIFIABLE, NO_BASE, False, "unverifiable", ExitCode.GATE_FAILED),
    "unverifiable is no old failure": (Status.UNVERIFIABLE, Status.FAIL, False, "unverifiable", ExitCode.GATE_FAILED),
    "unverifiable is never a known failure": (Status.UNVERIFIABLE, NO_BASE, True, "unverifiable", ExitCode.GATE_FAILED),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_gate_scenario(name):
    now, base, known, expected, code = SCENARIOS[name]
    results = [samples.result_for(C, now)]
    baseline = None if base == NO_BASE else ([] if base == ABSENT else [samples.result_for(C, base)])
    out = evaluate(results, baseline=baseline, known=KNOWN if known else None)
    assert out.classification == {C.case_id: expected}
    assert out.exit_code == code
    assert out.counts[expected] == 1 and sum(out.counts.values()) == 1


def test_a_real_failure_beside_a_not_run_case_is_exit_1():
    d = CASES[1]
    out = evaluate(
        [
            samples.result_for(C, Status.NOT_RUN, error_kind="placement", reason="not run: placement"),
            samples.result_for(d, Status.FAIL),
        ]
    )
    assert out.exit_code == ExitCode.GATE_FAILED
    assert out.not_run == (C.case_id,) and out.gating == (d.case_id, C.case_id)
    assert "1 not run (infrastructure)" in out.verdict() and "1 new failure," in out.verdict()


def test_not_run_alone_says_infrastructure():
    out = evaluate([samples.result_for(C, Status.NOT_RUN, reason="not run: placement")])
    assert not out.passed and out.verdict() == "gate FAILED: 1 not run (infrastructure); 0 ran"
    assert out.to_dict()["not_run"] == [C.case_id]


def test_full_sample_run_lists_every_class():
    out = evaluate(samples.make_results(CASES), baseline=samples.make_baseline(CASES), known=parse(samples.KNOWN_YAML))
    assert out.exit_code == ExitCode.GATE_FAILED
    assert out.regressions == tuple(sorted((samples.REGRESSION, samples.TIMEOUT)))
    assert out.new_failures == (samples.NEW_FAILURE,)
    assert out.old_failures == (samples.OLD_FAILURE,)
    assert out.known_failures == (samples.KNOWN_FAIL,)
    assert out.fixed == (samples.FIXED,)
    assert out.flaky == (samples.FLAKY,)
    assert out.downgraded == (samples.DOWNGRADED,)
    assert out.classification[samples.SKIPPED] == "skip"
    assert out.gating[:2] == out.regressions  # worst first
    assert out.verdict() == "gate FAILED: 2 regressions, 1 new failure; 31 ran (24 pass), 1 skipped"


def test_only_old_and_known_failures_pass_the_gate():
    results = [
        r
        for r in samples.make_results(CASES)
        if r.case_id not in (samples.REGRESSION, samples.TIMEOUT, samples.NEW_FAILURE)
    ]
    out = evaluate(results, baseline=samples.make_baseline(CASES), known=parse(samples.KNOWN_YAML))
    assert out.passed and out.exit_code == ExitCode.OK
    assert "1 old failure," in out.verdict() and "1 known failure," in out.verdict()


def test_missing_results_fail_the_gate():
    out = evaluate([samples.result_for(C)], missing=[CASES[1].case_id])
    assert out.exit_code == ExitCode.GATE_FAILED and out.missing == (CASES[1].case_id,)


def test_expired_known_failure_gates_again():
    kf = parse(f'- case: "{C.case_id}"\n  reason: r\n  link: l\n  until: 2020-01-01\n', "kf.yaml")
    out = evaluate([samples.result_for(C, Status.FAIL)], known=kf)
    assert out.classification[C.case_id] == "fail" and kf.expired == kf.entries
    assert out.expired == {C.case_id: kf.entries[0]} and kf.entries[0].where == "kf.yaml:1"  # said, not silent
    live = parse(f'- case: "{C.case_id}"\n  reason: r\n  link: l\n  until: 2999-01-01\n')
    assert evaluate([samples.result_for(C, Status.FAIL)], known=live).passed
    fixed_today = type(kf)(kf.entries, kf.source, today=dt.date(2019, 12, 31))
    assert evaluate([samples.result_for(C, Status.FAIL)], known=fixed_today).passed


def test_evaluate_is_pure():
    results = samples.make_results(CASES)
    before = [r.to_dict() for r in results]
    a = evaluate(results, baseline=samples.make_baseline(CASES))
    b = evaluate(results, baseline=samples.make_baseline(CASES))
    assert a == b and [r.to_dict() for r in results] == before


def test_a_pass_unverifiable_on_the_emulation_is_counted_apart_from_pass_and_listed():
    """A pass the CPU emulation cannot vouch for is neither pass nor a gate failure;
    the summary lists it and JUnit flags it."""
    from backend.result import UNVERIFIABLE_PREFIX
    from orchestrator.summary import _section

    r = samples.result_for(C, Status.PASS, reason=UNVERIFIABLE_PREFIX + "a raw pointer left the dispatcher")
    out = evaluate([r], baseline=[samples.result_for(C, Status.PASS)])
    assert out.classification == {C.case_id: "pass-unverifiable"} and out.exit_code == ExitCode.OK
    assert out.counts["pass"] == 0 and out.counts["pass-unverifiable"] == 1 and out.pass_unverifiable == (C.case_id,)
    assert "1 unverifiable on the emulation" in out.verdict()
    assert C.case_id in "\n".join(_section("Unverifiable", out.pass_unverifiable, {C.case_id: r}, out))
    # Known failure entries still say "fixed": the case passed.
    assert evaluate([r], known=KNOWN).classification == {C.case_id: "fixed"}


# --- the empty-run rule (orchestrator/empty_run.py) ------------------------------------------

GPU = "unavailable: needs a CUDA/ROCm GPU (Triton)"


def _skip(case, reason=GPU):
    return samples.result_for(case, Status.SKIP, reason=reason, checks=())


# name: (results, require, allow_empty, exit code, the verdict's text)
EMPTY_SCENARIOS = {
    "every case skipped fails, naming the reason": (
        lambda: [_skip(c) for c in CASES[:3]],
        (),
        False,
        ExitCode.GATE_FAILED,
        "gate FAILED: nothing ran: 3 skipped (needs a CUDA/ROCm GPU (Triton): 3)",
    ),
    "the unavailable reason decides, dtype reasons aside": (
        lambda: [
            _skip(CASES[0]),
            _skip(CASES[1], f"x does not support kv_cache_dtype fp8; {GPU}"),
            _skip(CASES[2], "unsupported: x implements the gqa attention family, not mla"),
        ],
        (),
        False,
        ExitCode.GATE_FAILED,
        "gate FAILED: nothing ran: 3 skipped (needs a CUDA/ROCm GPU (Triton): 2; unsupported: x implements the gqa "
        "attention family, not mla: 1)",
    ),
    "--allow-empty lets it pass, saying so": (
        lambda: [_skip(c) for c in CASES[:3]],
        (),
        True,
        ExitCode.OK,
        "gate PASSED (--allow-empty): nothing ran, 3 cases skipped",
    ),
    "one case ran: the rest may skip": (
        lambda: [samples.result_for(CASES[0]), *[_skip(c) for c in CASES[1:3]]],
        (),
        False,
        ExitCode.OK,
        "gate PASSED: 1 ran (1 pass), 2 skipped, no new failures",
    ),
    "a required slice that did not run fails": (
        lambda: [samples.result_for(CASES[0]), *[_skip(c) for c in CASES[1:3]]],
        ("batch=mixed",),
        False,
        ExitCode.GATE_FAILED,
        "required `batch=mixed` did not run: 1 skipped (needs a CUDA/ROCm GPU (Triton): 1)",
    ),
    "a required slice that ran passes": (
        lambda: [samples.result_for(CASES[0]), *[_skip(c) for c in CASES[1:3]]],
        ("batch=decode4",),
        False,
        ExitCode.OK,
        "gate PASSED: 1 ran (1 pass), 2 skipped, no new failures",
    ),
    "--allow-empty does not waive --require": (
        lambda: [_skip(c) for c in CASES[:3]],
        ("torch",),
        True,
        ExitCode.GATE_FAILED,
        "required `torch` did not run: 3 skipped",
    ),
    "a required slice that matches nothing says so": (
        lambda: [samples.result_for(CASES[0])],
        ("backend=aiter",),
        False,
        ExitCode.GATE_FAILED,
        "required `backend=aiter` did not run: no case of this run matches it",
    ),
    "a failure is the verdict, not the emptiness": (
        lambda: [samples.result_for(CASES[0], Status.NOT_RUN, reason="not run: placement"), _skip(CASES[1])],
        (),
        False,
        ExitCode.INFRA_ERROR,
        "gate FAILED: 1 not run (infrastructure); 0 ran, 1 skipped",
    ),
}


@pytest.mark.parametrize("name", list(EMPTY_SCENARIOS))
def test_empty_run_scenario(name):
    results, require, allow_empty, code, text = EMPTY_SCENARIOS[name]
    out = evaluate(results(), rules=GateRules(require=tuple(require), allow_empty=allow_empty))
    assert out.exit_code == code
    assert text in out.verdict(), out.verdict()
    assert (out.exit_code == ExitCode.OK) == out.passed and all(
        c in ("skip", "pass", "not-run") for c in out.classification.values()
    )


def test_a_run_still_writing_is_not_judged_empty():
    # `orch serve` shows a running run whose skips were recorded before any case ran.
    out = evaluate([_skip(c) for c in CASES[:3]], judge_empty=False)
    assert out.passed and out.unran == () and "nothing ran" not in out.verdict()


def test_an_unverifiable_case_fails_the_gate_unless_allowed_and_is_listed_either_way():
    """A disagreement the emulation saw is never a green; --allow-unverifiable stops it
    gating, not being listed (summary, JUnit, the gate's own lists)."""
    from backend.result import UNVERIFIABLE_ADVICE, UNVERIFIABLE_PREFIX
    from orchestrator import junit, summary
    from orchestrator.store import RunInfo

    d = CASES[1]
    r = samples.result_for(C, Status.UNVERIFIABLE, reason=f"{UNVERIFIABLE_PREFIX}a pointer; {UNVERIFIABLE_ADVICE}")
    ok = samples.result_for(d, Status.PASS)
    run = RunInfo(
        id=1,
        matrix="m.yaml",
        matrix_sha="",
        git_sha="",
        started_at=0.0,
        finished_at=1.0,
        status="finished",
        cluster="",
        devices="cpu",
        versions={},
        argv=[],
        baseline=None,
        num_cases=2,
        num_results=2,
    )
    for allow, code in ((False, ExitCode.GATE_FAILED), (True, ExitCode.OK)):
        out = evaluate([r, ok], rules=GateRules(allow_unverifiable=allow))
        assert out.exit_code == code and out.unverifiable == (C.case_id,) and out.counts["unverifiable"] == 1
        assert out.gating == (() if allow else (C.case_id,))
        assert ("1 unverifiable allowed" in out.verdict()) == allow
        assert ("1 unverifiable (run on a GPU to decide)" in out.verdict()) == (not allow)
        md = summary.render(run, [r, ok], out)
        assert "Unverifiable: the replay disagreed" in md and C.case_id in md
        xml = junit.to_string([r, ok], out, suite_name="m.yaml", run_id=1, run_status="finished")
        assert ('type="unverifiable"' in xml) == (not allow) and 'name="unverifiable" value="true"' in xml
