"""k in the reports: JUnit (class and property), the markdown grid (rows tp x mode x k), the
dashboard's page data; a k = 2 failure must never be folded into the k = 0 cell."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from orchestrator import summary
from orchestrator.artifacts import write_outputs
from orchestrator.dashboard.build import with_k
from orchestrator.gate import evaluate
from orchestrator.store import ResultStore
from tests.dashboard.wire import page_data
from tests.matrix import spec_samples as S


def _outputs(tmp_path):
    db = S.write_db(tmp_path)
    out = tmp_path / "out"
    with ResultStore(db) as s:
        gate = write_outputs(s, 1, out_dir=str(out))
    return gate, out


def test_junit_names_k(tmp_path):
    gate, out = _outputs(tmp_path)
    assert not gate.passed
    root = ET.parse(out / "junit.xml").getroot()
    tcs = {tc.get("name"): tc for tc in root.iter("testcase")}
    k2, k0 = tcs[S.FAILING_K2], tcs[S.PASSING_K0]
    assert k2.get("classname") == "orch.tp1.FULL.k2" and k0.get("classname") == "orch.tp1.FULL"
    props = {p.get("name"): p.get("value") for p in k2.iter("property")}
    assert props["spec_tokens"] == "2"
    assert k2.find("failure") is not None and k0.find("failure") is None


def test_summary_grid_has_a_row_per_k(tmp_path):
    _, out = _outputs(tmp_path)
    md = (out / "summary.md").read_text()
    assert "| tp × mode × k |" in md
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| tp1 ")}
    assert set(rows) == {"tp1 NONE", "tp1 NONE k2", "tp1 FULL", "tp1 FULL k2"}
    fail, ok = summary.SYMBOL["fail"], summary.SYMBOL["pass"]
    assert fail in rows["tp1 FULL k2"] and fail not in rows["tp1 FULL"] and ok in rows["tp1 FULL"]


def test_summary_without_k_keeps_its_old_header():
    r = S.old_result()
    md = "\n".join(summary.grid([r], evaluate([r])))
    assert "| tp × mode |" in md and "× k" not in md and "| tp1 NONE |" in md


def test_dashboard_data_gives_every_case_a_k(tmp_path):
    _, out = _outputs(tmp_path)
    page = (out / "dashboard" / "index.html").read_text()
    assert {c["axes"]["spec_tokens"] for c in page_data(page)["cases"]} == {0, 2}
    assert with_k(S.old_result().axes)["spec_tokens"] == 0
