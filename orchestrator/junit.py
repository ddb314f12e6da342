"""JUnit XML for CI (Jenkins, GitHub, Buildkite, GitLab): one testsuite per run, one testcase per case.

Mapping (last attempt only):
- classname "orch.tp{tp}.{mode}", name = case id, time = timings.total_s;
- <properties> on the testcase: axes, attempts, resolved_mode, graph_kind, provider, device
  (testcase-level properties as Jenkins' junit plugin and pytest's xunit1 emit them);
- fail / regression / new -> <failure>, error / timeout -> <error>, message = reason, text = the
  check numbers, the log tail (errors) and the repro command;
- not-run (required, never ran: placement, tp gang) -> <error type="not-run">, never <skipped>;
- skip and known-fail -> <skipped> (message: reason, known-failure link); old failures keep their
  <failure>/<error> element so CI shows them, the gate verdict is in the suite properties;
- flaky -> a passing testcase with property flaky=true and a <system-out> note; pass-unverifiable (a
  pass the CPU emulation cannot vouch for) -> the same with unverifiable=true;
- unverifiable (the replay disagreed on graphs the emulation cannot follow) -> <failure
  type="unverifiable">, "run on a GPU to decide"; allowed by the run: a passing testcase with
  unverifiable=true and a <system-out> note;
- missing (planned, no result: the run was interrupted) -> <error type="missing">, so a CI never
  counts an interrupted run's JUnit as a shorter green one; the suite's `run_status` property
  says `interrupted`;
- a run in which nothing ran (or a --require'd slice did not: orchestrator/empty_run.py) ->
  one more testcase, classname "orch.gate", with <error type="empty">: a suite of skips alone is
  no pass to a CI reading the XML either.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence

from junitparser import Error, Failure, JUnitXml, Properties, Property, Skipped, TestCase, TestSuite

from backend.result import CaseResult, Status
from orchestrator.gate import C, Classification, GateOutcome

# XML 1.0 forbids most C0 controls (ANSI colour codes in log tails are the usual offenders).
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: str) -> str:
    return _XML_ILLEGAL.sub("\ufffd", text or "")


def failure_text(r: CaseResult, *, log_lines: int = 40) -> str:
    """The body of a <failure>/<error>: every check's numbers, the log tail, the repro command."""
    lines = [c.summary() for c in r.checks]
    if r.error_kind:
        lines.append(f"error kind: {r.error_kind}")
    if r.downgraded:
        lines.append(f"mode downgraded: {r.requested_mode} -> {r.resolved_mode}")
    if r.log_tail:
        lines.append("--- log tail ---")
        lines.extend(r.log_tail.splitlines()[-log_lines:])
    if r.repro:
        lines.append(f"repro: {r.repro}")
    return _clean("\n".join(lines))


def _testcase(r: CaseResult, cls: Classification, gate: GateOutcome) -> TestCase:
    tp = r.axes.get("tp", "?")
    mode = r.requested_mode or r.axes.get("cudagraph_mode", "?")
    k = int(r.axes.get("spec_tokens", 0) or 0)
    # k > 0 gets its own class (CI groups by class); k = 0 keeps the class it always had.
    cls_name = f"orch.tp{tp}.{mode}" + (f".k{k}" if k else "")
    tc = TestCase(r.case_id, cls_name, float(r.timings.get("total_s", 0.0) or 0.0))
    props = Properties()
    for name, value in (
        ("axes", json.dumps(r.axes, sort_keys=True, default=str)),
        ("spec_tokens", str(k)),
        ("attempts", str(r.attempts)),
        ("resolved_mode", r.resolved_mode),
        ("graph_kind", r.graph_kind),
        ("provider", r.provider),
        ("device", r.device),
        ("classification", cls),
    ):
        props.add_property(Property(name, _clean(value)))
    if r.downgraded:
        props.add_property(Property("downgraded", f"{r.requested_mode} -> {r.resolved_mode}"))
    if r.status == Status.FLAKY:
        props.add_property(Property("flaky", "true"))
    if cls in (C.UNVERIFIABLE, C.PASS_UNVERIFIABLE):
        props.add_property(Property("unverifiable", "true"))
    if cls == C.MUTED:
        props.add_property(Property("muted", "true"))
    tc.append(props)

    reason = _clean(r.reason or r.status.value)
    if cls == C.MUTED and r.status in (Status.FAIL, Status.ERROR, Status.TIMEOUT):
        # Muted: its real status in the message, but a <skipped> a CI reporter does not count as red.
        kf = gate.known_reasons.get(r.case_id)
        note = f"muted ({kf.reason}, {kf.link})" if kf else "muted"
        sk = Skipped(_clean(f"{note}: {r.status.value}: {reason}"))
        sk.text = failure_text(r)
        tc.result = [sk]
    elif cls == C.KNOWN_FAIL:
        kf = gate.known_reasons.get(r.case_id)
        note = f"known failure: {kf.reason}" + (f" ({kf.link})" if kf and kf.link else "") if kf else "known failure"
        sk = Skipped(_clean(f"{note}; {reason}"))
        sk.text = failure_text(r)
        tc.result = [sk]
    elif r.status == Status.SKIP:
        tc.result = [Skipped(reason)]
    elif r.status == Status.NOT_RUN:  # gating: an <error>, never a <skipped> a CI would count as fine
        el: Error | Failure = Error(f"[not-run] {reason}", "not-run")
        el.text = failure_text(r)
        tc.result = [el]
    elif r.status in (Status.ERROR, Status.TIMEOUT):
        el = Error(f"[{cls}] {reason}", r.status.value)
        el.text = failure_text(r)
        tc.result = [el]
    elif r.status == Status.FAIL:
        el = Failure(f"[{cls}] {reason}", "regression" if cls == C.REGRESSION else "fail")
        el.text = failure_text(r)
        tc.result = [el]
    elif r.status == Status.FLAKY:
        tc.system_out = _clean(f"flaky (not gating): {r.reason}\n{failure_text(r)}")
    elif r.status == Status.UNVERIFIABLE and not gate.allow_unverifiable:
        el = Failure(f"[unverifiable] {reason}", "unverifiable")
        el.text = failure_text(r)
        tc.result = [el]
    elif r.status == Status.UNVERIFIABLE:
        tc.system_out = _clean(f"unverifiable (allowed, not gating): {r.reason}\n{failure_text(r)}")
    elif cls == C.PASS_UNVERIFIABLE:
        tc.system_out = _clean(f"unverifiable (not gating): {r.reason}")
    if cls == C.FIXED:
        tc.system_out = "known failure now passes: remove its entry from the known-failures file"
    return tc


def _missing_testcase(case_id: str, axes: dict) -> TestCase:
    k = int(axes.get("spec_tokens", 0) or 0)
    tc = TestCase(
        case_id, f"orch.tp{axes.get('tp', '?')}.{axes.get('cudagraph_mode', '?')}" + (f".k{k}" if k else ""), 0.0
    )
    el = Error("[missing] no result: the run stopped before this case finished", "missing")
    el.text = "planned but never finished: `orch run --resume RUN_ID` runs it"
    tc.result = [el]
    return tc


def _unran_testcase(line: str, require: str) -> TestCase:
    tc = TestCase(f"required {require}" if require else "nothing ran", "orch.gate", 0.0)
    tc.result = [Error(_clean(line), "empty")]
    return tc


def build(
    results: Sequence[CaseResult],
    gate: GateOutcome,
    *,
    suite_name: str,
    run_id: int | None = None,
    run_status: str | None = None,
    planned: Sequence[dict] = (),
) -> JUnitXml:
    """`planned`: the run's planned cases without a result (RunView.planned: case_id + axes);
    those the gate counts as missing become <error type="missing"> testcases."""
    suite = TestSuite(suite_name or "orch")
    if run_id is not None:
        suite.add_property("run_id", str(run_id))
    if run_status is not None:
        suite.add_property("run_status", run_status)
    suite.add_property("gate", gate.verdict())
    missing = set(gate.missing)
    # One add_testcases call: junitparser's add_testcase recounts the whole suite on every call
    # (quadratic in the number of cases: docs/BENCHMARKS.md).
    suite.add_testcases(
        [_testcase(r, gate.classification.get(r.case_id, Classification(r.status.value)), gate) for r in results]
        + [_missing_testcase(p["case_id"], p) for p in planned if p["case_id"] in missing]
        + [_unran_testcase(u.line(), u.require) for u in gate.unran]
    )
    xml = JUnitXml()
    xml.add_testsuite(suite)
    xml.update_statistics()
    return xml


def write(path: str, results: Sequence[CaseResult], gate: GateOutcome, **kw) -> None:
    """Whole or not at all (a CI uploading it after a cancel must not read half a file); `kw` as build."""
    build(results, gate, **kw).write(path + ".tmp", pretty=True)
    os.replace(path + ".tmp", path)


def to_string(results: Sequence[CaseResult], gate: GateOutcome, **kw) -> str:
    out = build(results, gate, **kw).tostring()
    return out.decode("utf-8") if isinstance(out, bytes) else out
