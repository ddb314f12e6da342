"""The merge gate end to end on real Ray: a change that breaks a backend turns `orch run` red with
the right cases in JUnit, the markdown summary and the dashboard, and a baseline separates the
regressions it caused from failures that were already there."""

from __future__ import annotations

import re

import pytest
from junitparser import Error, Failure, JUnitXml

from orchestrator.commands import run as run_cmd
from orchestrator.store import ResultStore
from tests.dashboard.wire import page_data

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.slow]

FILTER = "attention=gqa tp=1 kv_cache_dtype=auto batch=decode_7,mixed_small cudagraph_mode=NONE,FULL,FULL_AND_PIECEWISE"
# The FULL mixed cell: the seed backend is captured on its prefill branch in every FULL graph and
# its prefill rows replay stale metadata; a decode batch replayed through such a graph takes the
# decode kernel (live buffers), as in vLLM 0.10.2; split modes keep a sound decode graph.
BROKEN = {"tp1-FULL-auto-mixed_small-MyBackend-s0"}


def _run(tmp_path, name: str, plugin: str, baseline: str | None = None) -> tuple[int, str]:
    out = tmp_path / name
    code = run_cmd.main(
        "matrices/smoke.yaml",
        backend=f"tests.executor.{plugin}:MyBackend",
        filter_expr=FILTER,
        db=str(tmp_path / "r.db"),
        out_dir=str(out),
        devices="cpu",
        baseline=baseline,
        no_progress=True,
    )
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


def test_orch_gate_later_gives_each_run_the_verdict_orch_run_gave(runs, capsys):
    from orchestrator.cli import main as cli_main

    tmp, *_ = runs
    capsys.readouterr()
    summaries = {rid: open(f"{tmp}/{name}/summary.md").read() for rid, name in ((2, "broken"), (3, "again"))}
    for rid, md in summaries.items():  # no --baseline given here: the run's own
        code = cli_main(["gate", "--db", str(tmp / "r.db"), "--run", str(rid)])
        headline = capsys.readouterr().out.splitlines()[-1]
        assert f"**{headline}**" in md and code == (1 if rid == 2 else 0), (headline, md[:300])


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


def _section(md: str, title: str) -> str:
    """The body of one `### title (n)` section of the summary ('' when absent)."""
    m = re.search(rf"^### {re.escape(title)} \((\d+)\)\n(.*?)(?=^### |\Z)", md, re.S | re.M)
    return m.group(2) if m else ""


def _cases_in(section: str) -> set[str]:
    return set(re.findall(r"^- \*\*`([^`]+)`\*\*", section, re.M))


def test_summary_lists_the_regression_first_with_its_repro(runs):
    # Every page and summary carries the words "regression" and "old failure" (the legend lists
    # every classification): the asserts read the sections and grid cells of the broken cases.
    _, _, (_, out), (_, out_again) = runs
    md = open(f"{out}/summary.md").read()
    regressions = _section(md, "Regressions")
    assert _cases_in(regressions) == BROKEN
    assert md.index("### Regressions") < md.index("### Grid")  # listed first, before the grid
    for cid in BROKEN:  # each with its failing check's numbers and its repro
        block = regressions[regressions.index(f"`{cid}`") :]
        block = block[: block.index("\n- **") if "\n- **" in block else len(block)]
        assert "replay: FAILED" in block and "max_abs=" in block and f"orch repro {cid}" in block, block
    grid = _grid_cells(md)
    assert {cell for cell, sym in grid.items() if sym == "🔻"} == {("tp1 FULL", "mixed_small")}
    assert all(sym == "✅" for (row, _), sym in grid.items() if row != "tp1 FULL"), grid
    # Against a baseline that already failed the same way: old failures, no regression section.
    md_again = open(f"{out_again}/summary.md").read()
    assert _cases_in(_section(md_again, "Old failures (not gating)")) == BROKEN
    assert not _section(md_again, "Regressions")
    assert {cell for cell, sym in _grid_cells(md_again).items() if sym == "🟥"} == {("tp1 FULL", "mixed_small")}


def _grid_cells(md: str) -> dict[tuple[str, str], str]:
    """(row label, batch) -> the grid's symbol, for the one backend of these runs."""
    lines = [ln for ln in md[md.index("### Grid") :].splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    batches = [h.split("<br>")[-1] for h in head[1:]]
    cells = {}
    for ln in lines[2:]:
        row = [c.strip() for c in ln.strip("|").split("|")]
        for batch, sym in zip(batches, row[1:]):
            cells[(row[0], batch)] = sym
    return cells


def test_dashboard_embeds_the_failing_cell_with_its_checks(runs):
    _, _, (_, out), _ = runs
    data = page_data(open(f"{out}/dashboard/index.html").read())  # packed on the page: unpacked as the page does
    by_id = {c["id"]: c for c in data["cases"]}
    assert len(by_id) == 6
    assert {cid for cid, c in by_id.items() if c["cls"] == "regression"} == BROKEN
    assert all(c["cls"] == "pass" and c["state"] == "pass" for cid, c in by_id.items() if cid not in BROKEN)
    for cid in BROKEN:
        cell = by_id[cid]
        assert cell["state"] == "fail" and cell["change"] == "regression" and cell["baseline"] == "pass"
        replay = next(c for c in cell["checks"] if c["name"] == "replay")
        assert not replay["passed"] and replay["max_abs"] > 0
        assert cell["repro"].startswith(f"orch repro {cid}")
    assert data["gate"]["regressions"] == sorted(BROKEN)


def test_store_keeps_all_three_runs(runs):
    tmp = runs[0]
    with ResultStore(str(tmp / "r.db"), readonly=True) as store:
        assert len(store.runs()) == 3 and all(len(store.results(r.id)) == 6 for r in store.runs())


def test_a_tp2_allreduce_skipped_behind_a_raw_pointer_fails_orch_run_on_cpu(ray_cluster, tmp_path):
    """The tp 2 custom all-reduce that records its buffer's address while capturing and
    skips the reduction. Its replay disagrees with eager on the CPU emulation, which cannot follow
    the pointer: UNVERIFIABLE, so `orch run` exits 1 (it passed before, exit 0); `orch gate
    --allow-unverifiable` passes the same run and still lists the case."""
    from orchestrator.commands import gate as gate_cmd

    db, out = str(tmp_path / "r.db"), str(tmp_path / "out")
    code = run_cmd.main(
        "matrices/smoke.yaml",
        backend="tests.mutants.allreduce_registered:Backend",
        filter_expr="attention=gqa tp=2 cudagraph_mode=FULL",
        db=db,
        out_dir=out,
        devices="cpu",
        no_progress=True,
    )
    assert code == 1
    with ResultStore(db, readonly=True) as store:
        (r,) = store.results(store.latest_run_id())
    assert r.case_id.startswith("tp2-FULL-auto-mixed_small-") and r.status.value == "unverifiable"
    assert r.reason.endswith("run on a GPU to decide [all ranks unverifiable]"), r.reason
    junit = JUnitXml.fromfile(f"{out}/junit.xml")
    (tc,) = [c for suite in junit for c in suite]
    assert tc.name == r.case_id and isinstance(tc.result[0], Failure) and tc.result[0].type == "unverifiable"
    assert "Unverifiable: the replay disagreed" in open(f"{out}/summary.md").read()
    assert gate_cmd.main(db, allow_unverifiable=True) == 0
    assert gate_cmd.main(db) == 1
