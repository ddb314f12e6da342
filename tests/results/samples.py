"""Realistic CaseResults for the results/gate/report/dashboard tests: one small matrix with every
kind of outcome (failing checks with numbers, errors with log tails, a timeout, flaky, skip,
downgraded, a known failure, a fixed known failure, a regression, an old failure, a new failure).
No Ray and no torch: results are plain dataclasses, exactly what workers send back."""

from __future__ import annotations

from backend.case import BatchSpec, Case
from backend.result import CaseResult, CheckOutcome, Status
from orchestrator.store import NewRun

XSS = "<script>alert(1)</script><img src=x onerror=alert(2)>"
BATCHES = (BatchSpec("decode4", (1, 1, 1, 1), (17, 33, 5, 64)), BatchSpec("mixed", (1, 7, 1), (40, 7, 9)))
MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY")

# The designated outcomes; every other case passes.
REGRESSION = "tp2-FULL-fp8-mixed-torch-s0"  # fails now, passed in the baseline
NEW_FAILURE = "tp1-FULL-auto-mixed-torch-s0"  # error (XSS in message/log), absent from the baseline
TIMEOUT = "tp2-PIECEWISE-auto-mixed-torch-s0"  # passed in the baseline: a regression too
OLD_FAILURE = "tp2-NONE-fp8-mixed-torch-s0"  # fails now and in the baseline
FLAKY = "tp1-NONE-fp8-decode4-torch-s0"
SKIPPED = "tp2-FULL_DECODE_ONLY-fp8-mixed-torch-s0"
KNOWN_FAIL = "tp1-PIECEWISE-fp8-mixed-torch-s0"
FIXED = "tp1-FULL-fp8-decode4-torch-s0"  # passes but listed as known failure
DOWNGRADED = "tp2-FULL-auto-decode4-torch-s0"

KNOWN_YAML = f"""\
- case: "tp1-PIECEWISE-fp8-mixed-*"
  reason: fp8 KV dequant scale frozen at capture
  link: https://example.invalid/issue/1
  until: 2999-01-01
- case: "{FIXED}"
  reason: was broken under FULL
  link: https://example.invalid/issue/2
  until: 2999-01-01
"""


def make_cases(matrix: str = "matrices/sample.yaml") -> list[Case]:
    return [
        Case("torch", tp, mode, kv, b, matrix=matrix)
        for tp in (1, 2)
        for mode in MODES
        for kv in ("auto", "fp8")
        for b in BATCHES
    ]


def _checks(bad: str | None = None) -> tuple[CheckOutcome, ...]:
    out = []
    for name in ("reference", "replay", "finite", "kv_integrity", "determinism"):
        if name == bad:
            out.append(
                CheckOutcome(
                    name,
                    False,
                    step=2,
                    max_abs_err=0.8125,
                    max_rel_err=3.5,
                    mismatch_frac=0.25,
                    first_bad=(7, 3),
                    bitwise=False if name == "replay" else None,
                )
            )
        else:
            out.append(
                CheckOutcome(
                    name,
                    True,
                    max_abs_err=0.0039 if name in ("reference", "replay") else None,
                    bitwise=True if name == "replay" else None,
                )
            )
    return tuple(out)


def result_for(c: Case, status: Status = Status.PASS, **kw) -> CaseResult:
    base = dict(
        case_id=c.case_id,
        status=status,
        checks=_checks(),
        requested_mode=c.mode,
        resolved_mode=c.mode,
        graph_kind="emulated" if c.mode != "NONE" else "none",
        provider="torch",
        capture_sizes_used=(8, 4, 16),
        timings={"capture_s": 0.05, "eager_step_s": 0.02, "replay_step_s": 0.005, "total_s": 1.5 + c.tp},
        device="cpu",
        versions={"torch": "2.13.0", "ray": "2.60.0", "orch": "0.1.0"},
        repro=c.repro_command(),
        worker=f"worker-{c.tp}",
        axes=c.axes,
    )
    base.update(kw)
    return CaseResult(**base)


def make_results(cases: list[Case]) -> list[CaseResult]:
    out = []
    for c in cases:
        cid = c.case_id
        if cid == REGRESSION:
            r = result_for(
                c, Status.FAIL, reason="replay: graph replay differs from eager at step 2", checks=_checks("replay")
            )
        elif cid == NEW_FAILURE:
            r = result_for(
                c,
                Status.ERROR,
                reason=f"RuntimeError: {XSS}",
                checks=(),
                error_kind="exception",
                log_tail=f'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: {XSS}\n\x1b[31mred\x1b[0m',
            )
        elif cid == TIMEOUT:
            r = result_for(
                c,
                Status.TIMEOUT,
                reason="ran past its 300s deadline",
                checks=(),
                error_kind="timeout",
                timings={"total_s": 300.0},
                attempts=2,
                log_tail="worker killed and recreated",
            )
        elif cid == OLD_FAILURE:
            r = result_for(
                c, Status.FAIL, reason="reference: eager differs from fp32 reference", checks=_checks("reference")
            )
        elif cid == FLAKY:
            r = result_for(
                c, Status.FLAKY, reason="determinism: eager twice differs", checks=_checks("determinism"), attempts=2
            )
        elif cid == SKIPPED:
            r = result_for(
                c, Status.SKIP, reason="FULL_DECODE_ONLY with tp2 fp8: provider unavailable", checks=(), timings={}
            )
        elif cid == KNOWN_FAIL:
            r = result_for(c, Status.FAIL, reason="reference: fp8 scale", checks=_checks("reference"))
        elif cid == DOWNGRADED:
            r = result_for(c, Status.PASS, resolved_mode="PIECEWISE", downgraded=True)
        else:
            r = result_for(c)
        out.append(r)
    return out


def make_baseline(cases: list[Case]) -> list[CaseResult]:
    out = []
    for c in cases:
        if c.case_id == NEW_FAILURE:
            continue
        if c.case_id in (OLD_FAILURE, KNOWN_FAIL, FIXED):
            out.append(
                result_for(
                    c, Status.FAIL, reason="reference: eager differs from fp32 reference", checks=_checks("reference")
                )
            )
        else:
            out.append(result_for(c))
    return out


def write_sample_db(tmp_path, **run_kw) -> tuple[str, str]:
    """A store with run 1 = the baseline and run 2 = the sample results (both finished), and a
    known-failures file beside it; returns (db path, known-failures path)."""
    from orchestrator.store import ResultStore

    path = str(tmp_path / "r.db")
    cases = make_cases()
    with ResultStore(path) as s:
        b = s.create_run(NewRun(matrix="matrices/sample.yaml", cases=cases))
        for r in make_baseline(cases):
            s.record(b, r)
        s.finish_run(b, "finished")
        rid = s.create_run(NewRun(matrix="matrices/sample.yaml", cases=cases, baseline="1", **run_kw))
        for r in make_results(cases):
            s.record(rid, r)
        s.finish_run(rid, "finished")
    kf = tmp_path / "kf.yaml"
    kf.write_text(KNOWN_YAML)
    return path, str(kf)
