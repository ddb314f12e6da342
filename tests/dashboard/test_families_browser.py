"""Attention families in the outputs, in real headless Chromium and in summary.md: a run of gqa
and mla cases splits the dashboard's rows by family first and says the family in a cell's
detail; the summary has one grid per (family, backend)."""

from __future__ import annotations

import dataclasses

import pytest

from backend.case import BatchSpec, Case, ModelShape
from backend.result import Status
from orchestrator.artifacts import write_outputs
from orchestrator.store import NewRun, ResultStore
from tests.results.samples import _checks, result_for

BATCH = BatchSpec("dec4", (1, 1, 1, 1), (17, 33, 40, 64))
MLA_SHAPE = ModelShape(
    num_heads=8,
    num_kv_heads=1,
    head_size=48,
    attention="mla",
    dims=(("kv_lora_rank", 32), ("qk_nope_head_dim", 16), ("qk_rope_head_dim", 16), ("v_head_dim", 16)),
)
FAILING_MLA = "mla-tp1-FULL-auto-dec4-torch-s0"


def write_db(tmp_path) -> str:
    path = str(tmp_path / "families.db")
    cases = [
        dataclasses.replace(Case("torch", 1, mode, "auto", BATCH, matrix="matrices/f.yaml"), **extra)
        for mode in ("NONE", "FULL")
        for extra in ({}, {"model": MLA_SHAPE})
    ]
    with ResultStore(path) as s:
        rid = s.create_run(NewRun(matrix="matrices/f.yaml", cases=cases))
        for c in cases:
            bad = c.case_id == FAILING_MLA
            s.record(
                rid,
                result_for(c, Status.FAIL, reason="finite: NaN", checks=_checks("finite")) if bad else result_for(c),
            )
        s.finish_run(rid, "finished")
    return path


@pytest.fixture
def outputs(tmp_path):
    db = write_db(tmp_path)
    with ResultStore(db) as s:
        write_outputs(s, 1, out_dir=str(tmp_path / "out"))
    return tmp_path / "out"


def test_summary_has_a_grid_per_family_and_backend(outputs):
    text = (outputs / "summary.md").read_text()
    assert "#### `torch`\n" in text and "#### `torch` · mla\n" in text
    assert text.index("#### `torch`\n") < text.index("#### `torch` · mla\n")


@pytest.mark.browser
def test_rows_split_by_family_and_detail_shows_it(page, outputs):
    page.goto((outputs / "dashboard" / "index.html").as_uri())
    page.wait_for_selector(".chip[data-case-id]")
    assert page.locator("#rows").input_value() == "attention,tp,cudagraph_mode"
    rows = page.locator("#grid tbody tr th.row").all_inner_texts()
    assert rows == ["gqa · tp1 · NONE", "gqa · tp1 · FULL", "mla · tp1 · NONE", "mla · tp1 · FULL"]
    failing = page.locator(f'.chip[data-case-id="{FAILING_MLA}"]')
    assert failing.get_attribute("data-state") == "fail"
    assert failing.evaluate("e => e.closest('tr').querySelector('th').textContent") == "mla · tp1 · FULL"
    failing.click()
    assert "attention family\tmla" in page.locator("#d-fields").inner_text().replace(":", "")
    assert page.errors == []
