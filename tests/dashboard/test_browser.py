"""The dashboard in real headless Chromium: from disk (the CI artifact) and from `orch serve`."""

from __future__ import annotations

import os
import shutil
import threading
import urllib.error
import urllib.request

import pytest
from playwright.sync_api import expect

from backend.result import Status
from orchestrator.artifacts import write_outputs
from orchestrator.dashboard.server import make_server
from orchestrator.store import NewRun, ResultStore
from tests.results import samples

pytestmark = pytest.mark.browser
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Expected display state per case of the sample run (the gate's xfail shows as known-fail).
STATE_COUNTS = {"pass": 25, "fail": 2, "error": 1, "timeout": 1, "flaky": 1, "known-fail": 1, "skip": 1}
COLOURS = {
    "pass": "rgb(46, 158, 72)",
    "fail": "rgb(214, 45, 45)",
    "error": "rgb(122, 31, 162)",
    "timeout": "rgb(230, 126, 0)",
    "flaky": "rgb(227, 192, 0)",
    "skip": "rgb(201, 204, 209)",
}


def chip(page, case_id):
    return page.locator(f'.chip[data-case-id="{case_id}"]')


def chips(page):
    return page.locator(".chip[data-case-id]")


@pytest.fixture
def static_page(page, sample_db, tmp_path):
    db, kf = sample_db
    with ResultStore(db) as s:
        write_outputs(s, 2, out_dir=str(tmp_path / "out"), baseline="1", known_failures=kf)
    page.goto((tmp_path / "out" / "dashboard" / "index.html").as_uri())
    page.wait_for_selector(".chip[data-case-id]")
    return page


def test_grid_cells_states_and_colours(static_page):
    page = static_page
    assert chips(page).count() == 31  # the skipped case is hidden until asked for
    assert page.locator('.chip[data-state="skip"]').count() == 0
    page.locator("#f-skips").check()
    assert chips(page).count() == 32 and page.locator("#skip-count").inner_text() == "(1)"
    for state, n in STATE_COUNTS.items():
        assert page.locator(f'.chip[data-state="{state}"]').count() == n, state
    for state, rgb in COLOURS.items():
        bg = page.locator(f'.chip[data-state="{state}"]').first.evaluate("e => getComputedStyle(e).backgroundColor")
        assert bg == rgb, state
    # Default layout: rows tp x mode (8), columns kv dtype x batch (4).
    assert page.locator("#grid tbody tr").count() == 8 and page.locator("#grid thead th").count() == 5
    assert chip(page, samples.REGRESSION).get_attribute("data-change") == "regression"
    assert chip(page, samples.FIXED).get_attribute("data-change") == "fixed"
    assert "downgraded" in chip(page, samples.DOWNGRADED).get_attribute("class")
    assert "2 regressions" in page.locator("#verdict").inner_text()
    assert page.errors == [] and page.dialogs == []
    # Opens from disk with nothing fetched from anywhere else.
    assert all(u.startswith(("file:", "data:")) for u in page.requests), page.requests


def test_clicking_a_failing_cell_shows_numbers_and_repro(static_page):
    page = static_page
    chip(page, samples.REGRESSION).click()
    assert page.locator("#details").is_visible()
    assert page.locator("#d-title").inner_text() == samples.REGRESSION
    row = page.locator('#d-checks tr[data-check="replay"]').inner_text()
    assert "FAILED" in row and "0.8125" in row and "(7, 3)" in row and "25.0%" in row
    assert "regression" in page.locator("#d-change").inner_text()
    assert page.locator("#d-repro").inner_text() == f"orch repro {samples.REGRESSION} --matrix matrices/sample.yaml"
    assert "4× vs eager" in page.locator("#d-timings").inner_text()
    assert "run 1: pass" in page.locator("#d-history").inner_text()
    page.locator("#d-copy").click()
    expect(page.locator("#d-copy")).not_to_have_text("copy")  # "copied", or the manual fallback hint
    chip(page, samples.KNOWN_FAIL).click()
    assert page.locator("#d-known a").get_attribute("href") == "https://example.invalid/issue/1"


def test_filters_and_axes_hide_and_regroup_cells(static_page):
    page = static_page
    page.locator('#f-states input[data-state="pass"]').uncheck()
    assert chips(page).count() == 31 - STATE_COUNTS["pass"]  # the skip hidden, as by default
    page.locator('#f-states input[data-state="pass"]').check()
    page.locator("#f-text").fill("tp2-")
    assert chips(page).count() == 15
    page.locator("#f-text").fill("")
    page.locator("#f-changed").check()
    assert sorted(chips(page).evaluate_all("es => es.map(e => e.dataset.caseId)")) == sorted(
        [samples.REGRESSION, samples.TIMEOUT, samples.NEW_FAILURE, samples.FIXED]
    )
    page.locator("#f-changed").uncheck()
    page.locator("#f-provider").select_option("torch")
    assert chips(page).count() == 31
    page.select_option("#rows", "batch")
    page.select_option("#cols", "tp")
    # Regrouped: 2 x 2 cells of 8 cases, each one colour (its worst case) with its counts.
    assert page.locator("#grid tbody tr").count() == 2 and page.locator("#grid thead th").count() == 3
    cells = page.locator(".chip[data-count]")
    assert cells.count() == 4 and sum(int(c) for c in cells.evaluate_all("es => es.map(e => e.dataset.count)")) == 31


def test_xss_payload_is_inert_text_and_screenshot(static_page, tmp_path):
    page = static_page
    chip(page, samples.NEW_FAILURE).click()
    assert "<script>alert(1)</script><img src=x onerror=alert(2)>" in page.locator("#d-reason").inner_text()
    assert "<img src=x onerror=alert(2)>" in page.locator("#d-log").inner_text()
    assert page.locator("#details img, #details script").count() == 0
    page.wait_for_timeout(200)  # an onerror handler would have fired by now
    assert page.dialogs == [] and page.errors == []
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    keep = os.path.join(REPO, "orch-out", "test-artifacts")
    os.makedirs(keep, exist_ok=True)
    shutil.copy(shot, os.path.join(keep, "dashboard.png"))


@pytest.fixture
def server(sample_db):
    db, kf = sample_db
    srv = make_server(db, "127.0.0.1", 0, baseline="1", known_failures=kf)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv, db
    srv.shutdown()
    srv.server_close()


def test_served_page_matches_and_refreshes_live(page, server):
    srv, db = server
    assert srv.server_address[0] == "127.0.0.1"
    page.goto(srv.url + "?run=2")
    page.wait_for_selector(".chip[data-case-id]")
    assert chips(page).count() == 31 and page.locator('.chip[data-state="known-fail"]').count() == 1
    chip(page, samples.NEW_FAILURE).click()
    assert samples.XSS in page.locator("#d-reason").inner_text()
    # A run in progress: the page shows pending cells, then picks up results as the driver commits.
    cases = samples.make_cases()
    with ResultStore(db) as s:
        rid = s.create_run(NewRun(matrix="matrices/sample.yaml", cases=cases))
        for c in cases[:5]:
            s.record(rid, samples.result_for(c))
        page.goto(srv.url)
        page.wait_for_selector(".chip[data-case-id]")
        assert page.locator("#run-id").inner_text() == str(rid)
        assert page.locator('.chip[data-state="pending"]').count() == 27
        s.record(rid, samples.result_for(cases[5], Status.FAIL, reason="replay: differs"))
        # The page polls every 2 s (no eval: the page's CSP forbids it, so wait on locators).
        expect(page.locator('.chip[data-state="pending"]')).to_have_count(26, timeout=15000)
        assert page.locator('.chip[data-state="fail"]').count() == 1
    assert page.dialogs == [] and page.errors == []


def test_server_errors_are_plain_responses(server):
    srv, _ = server
    for path, code in (("nope", 404), ("?run=99", 404)):
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(srv.url + path, timeout=10)
        assert ei.value.code == code
    with urllib.request.urlopen(srv.url + "api/version?run=2", timeout=10) as r:
        assert r.headers["Content-Type"] == "application/json" and b"2:32:finished" in r.read()


LINKS = [
    "javascript:alert(3)",
    " JaVaScRiPt:alert(4)",
    "data:text/html,<script>alert(5)</script>",
    "vbscript:msgbox(6)",
    "//evil.invalid/x",
]


@pytest.mark.parametrize("link", LINKS)
def test_a_known_failure_link_that_is_not_http_stays_text(page, sample_db, tmp_path, link):
    """dashboard.js makes an anchor only of an http(s) link: a known-failures file is a YAML file
    anyone can edit, and a `javascript:` href runs in the dashboard's origin when clicked. The
    reason next to it is text too."""
    db, _ = sample_db
    kf = tmp_path / "known.yaml"
    kf.write_text(f'- case: "{samples.KNOWN_FAIL}"\n  reason: "{samples.XSS}"\n  link: "{link}"\n  until: 2999-01-01\n')
    with ResultStore(db) as s:
        write_outputs(s, 2, out_dir=str(tmp_path / "out"), baseline="1", known_failures=str(kf))
    page.goto((tmp_path / "out" / "dashboard" / "index.html").as_uri())
    page.wait_for_selector(".chip[data-case-id]")
    chip(page, samples.KNOWN_FAIL).click()
    known = page.locator("#d-known")
    assert link.strip() in known.inner_text() and samples.XSS in known.inner_text()
    assert page.locator("#details a, #details img, #details script").count() == 0
    known.click()
    page.wait_for_timeout(200)
    assert page.dialogs == [] and page.errors == []
    assert page.url.startswith("file:") and page.url.endswith("index.html")
