"""The merge gate end to end on real Ray: a change that breaks a backend turns `orch run` red with
the right cases in JUnit, the markdown summary and the dashboard, and a baseline separates the
regressions it caused from failures that were already there."""

from __future__ import annotations

import json
import re

import pytest
from junitparser import Error, Failure, JUnitXml

from orchestrator.commands import run as run_cmd
from orchestrator.store import ResultStore

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.slow]

FILTER = "tp=1 kv_cache_dtype=auto batch=decode_7,mixed_small cudagraph_mode=NONE,FULL,FULL_AND_PIECEWISE"
# The FULL mixed cell: the seed backend is captured on its prefill branch in every FULL graph and
# its prefill rows replay stale metadata; a decode batch replayed through such a graph takes the
# decode kernel (live buffers), as in vLLM 0.10.2; split modes keep a sound decode graph.
BROKEN = {"tp1-FULL-auto-mixed_small-MyBackend-s0"}


def _run(tmp_path, name: str, plugin: str, baseline: str | None = None) -> tuple[int, str]:
    out = tmp_path / name
    code = run_cmd.main("matrices/smoke.yaml", backend=f"tests.executor.{plugin}:MyBackend", filter_expr=FILTER,
                        db=str(tmp_path / "r.db"), out_dir=str(out), devices="cpu", baseline=baseline,
                        no_progress=True)  # fmt: skip
    return code, str(out)


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gate")
    good = _run(tmp, "good", "plugin_v1")
    broken = _run(tmp, "broken", "plugin_v2", baseline="1")
    again = _run(tmp, "again", "plugin_v2", baseline="2")
    return tmp, good, broken, again


def test_the_change_fails_the_gate_and_the_baseline_names_it_a_regression(runs):
    _, good, broken, again = runs
    assert good[0] == 0
    assert broken[0] == 1
    # Against a baseline that already had the failure: an old failure, not a regression.
    assert again[0] == 0


def test_junit_has_exactly_the_broken_case_with_numbers_and_repro(runs):
    _, _, (_, out), _ = runs
    xml = JUnitXml.fromfile(f"{out}/junit.xml")
    cases = [c for suite in xml for c in suite]
    assert len(cases) == 6
    failed = {c.name for c in cases if any(isinstance(r, (Failure, Error)) for r in c.result)}
    assert failed == BROKEN
    case = next(c for c in cases if c.name == "tp1-FULL-auto-mixed_small-MyBackend-s0")
    text = case.result[0].text or ""
    assert "replay" in (case.result[0].message or "") and "max_abs" in text
    assert "orch repro tp1-FULL-auto-mixed_small-MyBackend-s0" in text


def test_summary_lists_the_regression_first_with_its_repro(runs):
    _, _, (_, out), (_, out_again) = runs
    md = open(f"{out}/summary.md").read()
    first_case = re.search(r"tp1-[A-Z_]+-auto-\w+-MyBackend-s0", md).group(0)
    assert first_case in BROKEN
    assert "regression" in md.lower() and "orch repro tp1-FULL-auto-mixed_small-MyBackend-s0" in md
    md_again = open(f"{out_again}/summary.md").read().lower()
    assert "old failure" in md_again or "old-failure" in md_again


def test_dashboard_embeds_the_failing_cell_with_its_checks(runs):
    _, _, (_, out), _ = runs
    html = open(f"{out}/dashboard/index.html").read()
    blob = re.search(r'<script[^>]*type="application/json"[^>]*>(.*?)</script>', html, re.S).group(1)
    assert "tp1-FULL-auto-mixed_small-MyBackend-s0" in blob
    data = json.loads(blob)
    text = json.dumps(data)
    assert "regression" in text and "max_abs" in text.replace("max_abs_err", "max_abs")


def test_store_keeps_all_three_runs(runs):
    tmp = runs[0]
    with ResultStore(str(tmp / "r.db"), readonly=True) as store:
        assert len(store.runs()) == 3 and all(len(store.results(r.id)) == 6 for r in store.runs())
