"""k in the dashboard, in real headless Chromium: a run with k > 0 cases groups rows by
tp x mode x k by default, and the cell detail says k."""

from __future__ import annotations

import pytest

from orchestrator.artifacts import write_outputs
from orchestrator.store import ResultStore
from tests.matrix import spec_samples as S

pytestmark = pytest.mark.browser


@pytest.fixture
def spec_page(page, tmp_path):
    db = S.write_db(tmp_path)
    with ResultStore(db) as s:
        write_outputs(s, 1, out_dir=str(tmp_path / "out"))
    page.goto((tmp_path / "out" / "dashboard" / "index.html").as_uri())
    page.wait_for_selector(".chip[data-case-id]")
    return page


def test_rows_split_by_k_and_detail_shows_k(spec_page):
    page = spec_page
    assert page.locator("#rows").input_value() == "tp,cudagraph_mode,spec_tokens"
    rows = page.locator("#grid tbody tr th.row").all_inner_texts()
    assert rows == ["tp1 · NONE · k0", "tp1 · NONE · k2", "tp1 · FULL · k0", "tp1 · FULL · k2"]
    failing = page.locator(f'.chip[data-case-id="{S.FAILING_K2}"]')
    assert failing.get_attribute("data-state") == "fail"
    # the k = 2 failure sits in its own row, not beside the k = 0 pass
    row_of = failing.evaluate("e => e.closest('tr').querySelector('th').textContent")
    assert row_of == "tp1 · FULL · k2"
    failing.click()
    fields = page.locator("#d-fields").inner_text()
    assert "k (spec tokens)" in fields and "2 (verify rows of 3 tokens)" in fields
    page.select_option("#rows", "spec_tokens")
    assert page.locator("#grid tbody tr").count() == 2
    assert page.errors == []
