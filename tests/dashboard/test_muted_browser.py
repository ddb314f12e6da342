"""A muted case on the dashboard, in real headless Chromium: its own cell mark and colour (not a
gating error's), a legend entry and a state filter of its own, its real status in the detail."""

from __future__ import annotations

import pytest

from backend.case import BatchSpec, Case
from backend.result import Status
from orchestrator.artifacts import write_outputs
from orchestrator.store import NewRun, ResultStore
from tests.results.samples import result_for

pytestmark = pytest.mark.browser
BATCH = BatchSpec("dec4", (1, 1, 1, 1), (17, 33, 40, 64))
MUTED = "tp1-FULL-auto-dec4-torch-s0"
GATING = "tp1-FULL_DECODE_ONLY-auto-dec4-torch-s0"


@pytest.fixture
def muted_page(page, tmp_path):
    """Two erroring cases in two cells: one matched by a `mute: true` entry, one gating."""
    db = str(tmp_path / "muted.db")
    cases = [Case("torch", 1, mode, "auto", BATCH, matrix="m.yaml") for mode in ("NONE", "FULL", "FULL_DECODE_ONLY")]
    kf = tmp_path / "kf.yaml"
    kf.write_text(
        f'- case: "{MUTED}"\n  reason: flips under FULL\n  link: https://example.invalid/5\n'
        f"  until: 2999-01-31\n  mute: true\n"
    )
    with ResultStore(db) as s:
        rid = s.create_run(NewRun(matrix="m.yaml", cases=cases))
        for c in cases:
            bad = c.case_id in (MUTED, GATING)
            s.record(
                rid,
                result_for(
                    c,
                    Status.ERROR if bad else Status.PASS,
                    checks=(),
                    reason="capture error: boom" if bad else "",
                    error_kind="capture" if bad else "",
                ),
            )
        s.finish_run(rid, "finished")
        write_outputs(s, rid, out_dir=str(tmp_path / "out"), known_failures=str(kf))
    page.goto((tmp_path / "out" / "dashboard" / "index.html").as_uri())
    page.wait_for_selector(".chip[data-count]")
    return page


def _background(page, selector: str) -> str:
    return page.locator(selector).evaluate(
        "e => getComputedStyle(e).backgroundImage + ' ' + getComputedStyle(e).backgroundColor"
    )


def test_a_muted_cell_is_its_own_mark_colour_legend_and_filter(muted_page):
    page = muted_page
    muted, error = page.locator(f'.chip[data-case-id="{MUTED}"]'), page.locator(f'.chip[data-case-id="{GATING}"]')
    assert muted.get_attribute("data-state") == "muted" and muted.inner_text() == "M"
    assert error.get_attribute("data-state") == "error" and error.inner_text() == "E"
    assert _background(page, f'.chip[data-case-id="{MUTED}"]') != _background(page, f'.chip[data-case-id="{GATING}"]')
    # The legend names it, drawn as the cell is, with what it means.
    entry = page.locator('#legend .chip[data-legend="muted"]')
    assert entry.count() == 1 and entry.inner_text() == "M" and "mute: true" in entry.get_attribute("title")
    assert _background(page, '#legend .chip[data-legend="muted"]') == _background(
        page, f'.chip[data-case-id="{MUTED}"]'
    )
    assert "muted" in page.locator("#legend").inner_text()
    # Its own filter: unticked, the muted cell goes and the gating error stays.
    page.locator('#f-states input[data-state="muted"]').uncheck()
    assert muted.count() == 0 and error.count() == 1
    page.locator('#f-states input[data-state="muted"]').check()
    # The detail: muted, its own status, the entry.
    page.locator(f'.chip[data-case-id="{MUTED}"]').click()
    assert page.locator("#d-state").inner_text() == "muted"
    assert page.locator("#d-status").inner_text().strip() == "its own status: error (not gating)"
    assert page.locator("#d-known").inner_text().startswith("Muted (runs and reports, does not gate) until 2999-01-31")
    assert page.errors == []
