"""The static page without a browser: escaping of embedded data, no external resources."""

from __future__ import annotations

import json
import re

from orchestrator.dashboard.build import build_page, json_for_script, page_data, store_history
from orchestrator.outputs import gather
from orchestrator.store import ResultStore
from tests.results import samples


def test_json_for_script_cannot_close_the_script_element():
    payload = {"reason": "</script><script>alert(1)</script>", "log": "a & b <!-- x -->"}
    text = json_for_script(payload)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == payload


def test_page_embeds_case_data_only_as_escaped_json(sample_db):
    db, kf = sample_db
    with ResultStore(db, readonly=True) as store:
        view = gather(store, None, baseline="1", known_failures=kf)
        html = build_page(store, view)
    assert samples.XSS not in html and "<script>alert(1)" not in html and "<img src=x onerror" not in html
    # The only <script> elements are ours: the JSON block and the inline code.
    assert len(re.findall(r"<script\b", html)) == 2
    assert "<img" not in html
    block = re.search(r'<script type="application/json" id="orch-data">(.*?)</script>', html, re.S).group(1)
    data = json.loads(block)
    xss = next(c for c in data["cases"] if c["id"] == samples.NEW_FAILURE)
    assert samples.XSS in xss["reason"]
    # Nothing is loaded from anywhere: no src/href attributes pointing outside the file.
    assert not re.search(r'\b(src|href)\s*=\s*"(https?:)?//', html)


def test_view_model_marks_changes_and_history(sample_db):
    db, kf = sample_db
    with ResultStore(db, readonly=True) as store:
        view = gather(store, None, baseline="1", known_failures=kf)
        data = page_data(view, *store_history(store)[:1])
    by_id = {c["id"]: c for c in data["cases"]}
    assert by_id[samples.REGRESSION]["change"] == "regression"
    assert by_id[samples.FIXED]["change"] == "fixed" and by_id[samples.FIXED]["cls"] == "fixed"
    assert by_id[samples.KNOWN_FAIL]["state"] == "known-fail"
    assert by_id[samples.KNOWN_FAIL]["known"]["link"] == "https://example.invalid/issue/1"
    assert by_id[samples.DOWNGRADED]["downgraded"] is True
    assert by_id[samples.REGRESSION]["speedup"] == 4.0
    h = by_id[samples.OLD_FAILURE]["history"]
    assert h["runs"] == [[2, "fail", "cpu", ""], [1, "fail", "cpu", ""]] and h["streak"] == 2 and h["last_pass"] is None
    assert by_id[samples.REGRESSION]["history"]["last_pass"] == 1
