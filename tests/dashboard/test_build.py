"""The static page without a browser: escaping of embedded data, no external resources."""

from __future__ import annotations

import json
import re

from orchestrator.dashboard.build import build_page, json_for_script, page_data, store_history
from orchestrator.judging import Judging
from orchestrator.outputs import gather
from orchestrator.store import NewRun, ResultStore
from tests.dashboard.wire import page_data as page_wire
from tests.results import samples


def test_json_for_script_cannot_close_the_script_element():
    payload = {"reason": "</script><script>alert(1)</script>", "log": "a & b <!-- x -->"}
    text = json_for_script(payload)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == payload


def test_page_embeds_case_data_only_as_escaped_json(sample_db):
    db, kf = sample_db
    with ResultStore(db, readonly=True) as store:
        view = gather(store, None, Judging(baseline="1", known_failures=kf))
        html = build_page(store, view)
    assert samples.XSS not in html and "<script>alert(1)" not in html and "<img src=x onerror" not in html
    # The only <script> elements are ours: the JSON block and the inline code.
    assert len(re.findall(r"<script\b", html)) == 2
    assert "<img" not in html
    xss = next(c for c in page_wire(html)["cases"] if c["id"] == samples.NEW_FAILURE)
    assert samples.XSS in xss["reason"]
    # Nothing is loaded from anywhere: no src/href attributes pointing outside the file.
    assert not re.search(r'\b(src|href)\s*=\s*"(https?:)?//', html)


def test_view_model_marks_changes_and_history(sample_db):
    db, kf = sample_db
    with ResultStore(db, readonly=True) as store:
        view = gather(store, None, Judging(baseline="1", known_failures=kf))
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


def test_full_yamls_page_stays_under_a_megabyte(tmp_path):
    """full.yaml's page was 3.9 MB unpacked. Here its 2,185 cases with results shaped as a CPU run's
    (eight checks with unrounded numbers, twelve timings, versions, a downgrade's log line; the
    skips with their reasons); the figure of a real run's store is in docs/BENCHMARKS.md."""
    import random

    from backend.result import CaseResult, CheckOutcome, Status
    from orchestrator.matrix import load_matrix

    rnd = random.Random(0)
    m = load_matrix("matrices/full.yaml", devices="cpu")
    names = (
        "reference",
        "replay",
        "finite",
        "kv_integrity",
        "determinism",
        "padded_finite",
        "attn_reference",
        "attn_replay",
    )
    timings = (
        "capture_s",
        "eager_step_s",
        "replay_step_s",
        "total_s",
        "session_s",
        "inputs_s",
        "snapshot_s",
        "eager_s",
        "reference_s",
        "checks_s",
        "eager_shared_steps",
        "graph_shared_steps",
    )
    versions = {
        "aiter": "0.1.7.post2.dev18",
        "orch": "0.1.0",
        "python": "3.11.7",
        "ray": "2.60.0",
        "torch": "2.13.0+cpu",
        "vllm": "0.34.0",
    }
    results = [
        CaseResult(
            case_id=c.case_id,
            status=Status.PASS,
            requested_mode=c.mode,
            resolved_mode=c.mode,
            graph_kind="emulated",
            provider=c.backend,
            capture_sizes_used=(8, 8, 16, 8, 8, 16),
            device="cpu",
            versions=versions,
            checks=tuple(
                CheckOutcome(
                    n,
                    True,
                    max_abs_err=rnd.random() / 50,
                    max_rel_err=rnd.random(),
                    mismatch_frac=0.0,
                    bitwise=True if "replay" in n else None,
                )
                for n in names
            ),
            timings={k: rnd.random() for k in timings},
            log_tail=f"CUDAGraphMode.FULL is not supported with {c.backend}",
            repro=c.repro_command(),
            worker=f"cpu-g0r{rnd.randrange(8)}@192.0.2.2",
            axes=c.axes,
        )
        for c in m.cases
    ]
    results += [
        CaseResult(
            case_id=s.case.case_id,
            status=Status.SKIP,
            reason=s.reason,
            requested_mode=s.case.mode,
            repro=s.case.repro_command(),
            axes=s.case.axes,
        )
        for s in m.skipped
    ]
    with ResultStore(str(tmp_path / "full.db")) as store:
        rid = store.create_run(NewRun(matrix="matrices/full.yaml", cases=[*m.cases, *(s.case for s in m.skipped)]))
        store.record_many(rid, [(r, True) for r in results])
        store.finish_run(rid, "finished")
        page = build_page(store, gather(store, rid))
    # every case of the matrix, run or skipped (tests/matrix/test_shipped.py holds the count to the plan)
    assert len(results) == len(m.cases) + len(m.skipped) and len(page.encode()) < 1_000_000, len(page.encode())
