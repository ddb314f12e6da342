"""A dashboard cell at a glance, in real headless Chromium: one colour per cell (its worst
case) with its counts, its cases labelled by backend, provider and seed in the cell's detail,
skipped cases hidden until asked for, the legend above the grid, counts not shown as seconds."""

from __future__ import annotations

import pytest

from backend.case import BatchSpec, Case
from backend.result import Status
from orchestrator.artifacts import write_outputs
from orchestrator.store import NewRun, ResultStore
from tests.results.samples import _checks, result_for

pytestmark = pytest.mark.browser
BATCH = BatchSpec("dec4", (1, 1, 1, 1), (17, 33, 40, 64))
FAILING = "tp1-FULL-auto-dec4-aiter-emulated-s1"


def _db(tmp_path) -> str:
    """tp 1, FULL and NONE, one batch: each cell 2 backends x 2 seeds; one failure in FULL; the
    NONE cell of aiter-triton's fp8 is skips only."""
    path = str(tmp_path / "cells.db")
    cases = [
        Case(b, 1, mode, "auto", BATCH, seed=seed, matrix="m.yaml")
        for mode in ("NONE", "FULL")
        for b in ("torch", "aiter-emulated")
        for seed in (0, 1)
    ]
    skips = [Case("aiter-triton", 1, "NONE", "fp8", BATCH, matrix="m.yaml")]
    with ResultStore(path) as s:
        rid = s.create_run(NewRun(matrix="m.yaml", cases=[*cases, *skips]))
        for c in cases:
            if c.case_id == FAILING:
                r = result_for(c, Status.FAIL, reason="replay differs", checks=_checks("replay"), provider=c.backend)
            else:
                r = result_for(
                    c,
                    provider=c.backend,
                    timings={"total_s": 1.5, "eager_step_s": 0.02, "replay_step_s": 0.01, "eager_shared_steps": 6.0},
                )
            s.record(rid, r)
        for c in skips:
            s.record(rid, result_for(c, Status.SKIP, reason="unavailable: needs a CUDA/ROCm GPU (Triton)", checks=()))
        s.finish_run(rid, "finished")
    return path


@pytest.fixture
def cells_page(page, tmp_path):
    with ResultStore(_db(tmp_path)) as s:
        write_outputs(s, 1, out_dir=str(tmp_path / "out"))
    page.goto((tmp_path / "out" / "dashboard" / "index.html").as_uri())
    page.wait_for_selector(".chip[data-count]")
    return page


def test_a_cell_is_its_worst_case_with_counts(cells_page):
    page = cells_page
    cells = page.locator(".chip[data-count]")
    assert cells.count() == 2  # tp1 NONE and tp1 FULL x auto dec4: the fp8 skip column is hidden
    full = page.locator('.chip[data-state="fail"]')
    assert full.inner_text().startswith("3 pass · 1 fail") and full.get_attribute("data-count") == "4"
    assert page.locator('.chip[data-state="pass"]').inner_text() == "4 pass"
    full.click()
    rows = page.locator("#d-cell tr[data-case-id]")
    assert rows.count() == 4 and page.locator("#d-counts").inner_text() == "3 pass · 1 fail"
    first = rows.first.inner_text().split("\t")
    assert first == [FAILING, "aiter-emulated", "aiter-emulated", "1", "0", "fail"], first  # worst first, labelled
    page.locator(f'#d-cell button.case-link[data-case-id="{FAILING}"]').click()
    fields = page.locator("#d-fields").inner_text()
    assert "seed\t1" in fields and "provider\taiter-emulated" in fields and "backend\taiter-emulated" in fields
    assert page.errors == []


def test_skips_are_hidden_until_shown(cells_page):
    page = cells_page
    assert page.locator('.chip[data-state="skip"]').count() == 0 and page.locator("#skip-count").inner_text() == "(1)"
    page.locator("#f-skips").check()
    skip = page.locator('.chip[data-state="skip"]')
    assert skip.count() == 1 and skip.get_attribute("data-case-id") == "tp1-NONE-fp8-dec4-aiter-triton-s0"
    page.locator("#f-skips").uncheck()
    assert page.locator('.chip[data-state="skip"]').count() == 0


def test_the_legend_is_above_the_grid(cells_page):
    page = cells_page
    legend, grid = page.locator("#legend").bounding_box(), page.locator("#grid").bounding_box()
    assert legend["y"] + legend["height"] <= grid["y"]
    assert "worst case" in page.locator("#legend").inner_text()


def test_counts_are_not_shown_as_seconds(cells_page):
    page = cells_page
    page.locator('.chip[data-state="pass"]').click()
    page.locator("#d-cell button.case-link").first.click()
    timings = page.locator("#d-timings").inner_text()
    assert "eager_shared_steps\t6\n" in timings + "\n" and "total_s\t1.5 s" in timings, timings
