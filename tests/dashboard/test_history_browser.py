"""The dashboard's detail for a case with history in a shared store, in real Chromium: each run's
label, streaks per device model, the flakiness score over the gate's window, a muted entry."""

from __future__ import annotations

import pytest

from backend.result import Status
from orchestrator.artifacts import write_outputs
from orchestrator.store import NewRun, ResultStore
from tests.results import samples

pytestmark = pytest.mark.browser
CASES = samples.make_cases()
C = CASES[0].case_id
H100 = "NVIDIA H100 80GB HBM3 (cuda:0)"


def test_history_by_device_flakiness_and_mute_in_the_detail(page, tmp_path):
    db = str(tmp_path / "r.db")
    # C's history on main: failed on an H100, then passed, failed, passed on CPU; it fails in pr-7.
    runs = [
        ("main", H100, Status.FAIL),
        ("main", "cpu", Status.PASS),
        ("main", "cpu", Status.FAIL),
        ("main", "cpu", Status.PASS),
        ("pr-7", "cpu", Status.FAIL),
    ]
    with ResultStore(db) as s:
        for label, device, status in runs:
            rid = s.create_run(NewRun(matrix="matrices/sample.yaml", cases=CASES, label=label))
            s.record_many(
                rid,
                [
                    (samples.result_for(c, status if c.case_id == C else Status.PASS, device=device), True)
                    for c in CASES
                ],
            )
            s.finish_run(rid, "finished")
        kf = tmp_path / "kf.yaml"
        kf.write_text(
            f'- case: "{C}"\n  reason: flips on CPU\n  link: https://example.invalid/9\n'
            f"  until: 2999-01-01\n  mute: true\n"
        )
        write_outputs(s, rid, out_dir=str(tmp_path / "out"), baseline="main", known_failures=str(kf))
    page.goto((tmp_path / "out" / "dashboard" / "index.html").as_uri())
    page.locator(f'.chip[data-case-id="{C}"]').click()
    meta = page.locator("#run-meta").inner_text()
    assert "label: pr-7" in meta and "device: cpu" in meta and "baseline: run 4 (latest labelled 'main')" in meta
    assert page.locator("#d-state").inner_text() == "muted"
    assert page.locator("#d-known").inner_text().startswith("Muted (runs and reports, does not gate) until 2999-01-01")
    history = page.locator("#d-history").inner_text()
    assert history.startswith("run 5 [pr-7]: fail · run 4 [main]: pass") and "run 1 [main]: fail" in history
    rows = page.locator("#d-by-device tr")
    assert rows.count() == 2
    assert (
        rows.nth(0).inner_text().startswith("cpu") and "fail for 1 run(s); last pass: run 4" in rows.nth(0).inner_text()
    )
    assert (
        rows.nth(1).inner_text().startswith("NVIDIA H100 80GB HBM3") and "last pass: never" in rows.nth(1).inner_text()
    )
    # The window: main's CPU runs before run 5 (the H100 run is another device): pass, fail, pass.
    assert page.locator("#d-flaky").inner_text() == (
        "flakiness 0.40 over 3 of the last 3 run(s) labelled main: 2 pass/fail flip(s), 0 flaky on retry"
    )
