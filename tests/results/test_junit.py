"""JUnit XML: parsed back with junitparser and validated against the CI-reader structure (junit.xsd)."""

from __future__ import annotations

import json
import os

import pytest
from junitparser import Error, Failure, JUnitXml, Properties, Skipped

from orchestrator import junit
from orchestrator.gate import evaluate
from orchestrator.known_failures import parse
from tests.results import samples

XSD = os.path.join(os.path.dirname(__file__), "junit.xsd")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    cases = samples.make_cases()
    results = samples.make_results(cases)
    gate = evaluate(results, baseline=samples.make_baseline(cases), known=parse(samples.KNOWN_YAML))
    path = str(tmp_path_factory.mktemp("junit") / "junit.xml")
    junit.write(path, results, gate, suite_name="matrices/sample.yaml", run_id=7)
    return path, results, gate


def _cases(path):
    [suite] = list(JUnitXml.fromfile(path))
    return suite, {tc.name: tc for tc in suite}


def test_one_suite_one_testcase_per_case_with_right_counts(written):
    path, results, _ = written
    suite, tcs = _cases(path)
    assert suite.name == "matrices/sample.yaml"
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (32, 2, 2, 2)
    assert set(tcs) == {r.case_id for r in results}
    assert tcs[samples.REGRESSION].classname == "orch.tp2.FULL"


def test_results_map_to_failure_error_skipped(written):
    path, _, _ = written
    _, tcs = _cases(path)
    kinds = {name: type(tc.result[0]).__name__ if tc.result else "pass" for name, tc in tcs.items()}
    assert kinds[samples.REGRESSION] == "Failure" and kinds[samples.OLD_FAILURE] == "Failure"
    assert kinds[samples.NEW_FAILURE] == "Error" and kinds[samples.TIMEOUT] == "Error"
    assert kinds[samples.SKIPPED] == "Skipped" and kinds[samples.KNOWN_FAIL] == "Skipped"
    assert kinds[samples.FLAKY] == "pass" and kinds[samples.FIXED] == "pass"
    reg = tcs[samples.REGRESSION].result[0]
    assert isinstance(reg, Failure) and reg.type == "regression" and "replay" in reg.message
    # The check numbers and the repro command are in the element text.
    assert "max_abs=0.812" in reg.text and "first bad row 7 head 3" in reg.text
    assert f"repro: orch repro {samples.REGRESSION} --matrix matrices/sample.yaml" in reg.text
    err = tcs[samples.NEW_FAILURE].result[0]
    assert isinstance(err, Error) and "<script>alert(1)</script>" in err.message and "Traceback" in err.text
    known = tcs[samples.KNOWN_FAIL].result[0]
    assert isinstance(known, Skipped) and "https://example.invalid/issue/1" in known.message


def test_properties_and_flaky_note(written):
    path, _, _ = written
    _, tcs = _cases(path)
    props = {p.name: p.value for p in tcs[samples.FLAKY].child(Properties)}
    assert props["flaky"] == "true" and props["attempts"] == "2" and props["provider"] == "torch"
    assert json.loads(props["axes"])["kv_cache_dtype"] == "fp8"
    assert "flaky" in tcs[samples.FLAKY].system_out
    down = {p.name: p.value for p in tcs[samples.DOWNGRADED].child(Properties)}
    assert down["downgraded"] == "FULL -> PIECEWISE" and down["resolved_mode"] == "PIECEWISE"


def test_validates_against_the_junit_schema(written):
    xmlschema = pytest.importorskip("xmlschema", reason="xmlschema not installed (pip install xmlschema)")
    path, _, _ = written
    xmlschema.XMLSchema(XSD).validate(path)  # raises on any structural error
    # ANSI escapes from the log tail are illegal XML 1.0 characters and must have been replaced.
    assert "\x1b" not in open(path, encoding="utf-8").read()


def test_schema_rejects_a_broken_document(tmp_path):
    xmlschema = pytest.importorskip("xmlschema", reason="xmlschema not installed (pip install xmlschema)")
    bad = tmp_path / "bad.xml"
    bad.write_text('<testsuites><testsuite name="x"><testcase name="a"/></testsuite></testsuites>')
    assert not xmlschema.XMLSchema(XSD).is_valid(str(bad))  # no tests=, no classname=


def test_a_not_run_case_is_an_error_in_junit_and_its_own_section_in_the_summary(tmp_path):
    from backend.result import Status
    from orchestrator import summary
    from orchestrator.dashboard.build import STATES
    from orchestrator.store import RunInfo

    cases = samples.make_cases()[:2]
    results = [
        samples.result_for(
            cases[0],
            Status.NOT_RUN,
            reason="not run: needs 8 GPUs on one node (no placement within 30s)",
            error_kind="placement",
            checks=(),
        ),
        samples.result_for(cases[1]),
    ]
    gate = evaluate(results)
    path = str(tmp_path / "junit.xml")
    junit.write(path, results, gate, suite_name="m.yaml")
    [suite] = list(JUnitXml.fromfile(path))
    by_name = {tc.name: tc for tc in suite}
    [el] = by_name[cases[0].case_id].result
    assert isinstance(el, Error) and el.type == "not-run" and "no placement within 30s" in el.message  # not <skipped>
    assert suite.errors == 1 and suite.skipped == 0
    run = RunInfo(1, "m.yaml", "", "", 0.0, 1.0, "finished", "", "cpu")
    text = summary.render(run, results, gate)
    assert "Not run (infrastructure) (1)" in text or "Not run (infrastructure)" in text
    assert "gate FAILED: 1 not run (infrastructure); 1 ran (1 pass)" in text
    assert "not-run" in STATES  # a dashboard cell state, hence a legend entry


def test_suite_statistics_counted_once_not_per_case(monkeypatch):
    """junitparser's add_testcase recounts the suite on every call: building full.yaml's 1,730
    cases took 9-20 s. The counts are computed once per suite, whatever the case count."""
    from junitparser import TestSuite

    calls = []
    original = TestSuite.update_statistics
    monkeypatch.setattr(TestSuite, "update_statistics", lambda self: (calls.append(1), original(self))[1])
    cases = samples.make_cases()
    results = samples.make_results(cases)
    gate = evaluate(results, baseline=samples.make_baseline(cases), known=parse(samples.KNOWN_YAML))
    xml = junit.build(results, gate, suite_name="s")
    [suite] = list(xml)
    assert suite.tests == len(results) > 10
    assert len(calls) <= 2
