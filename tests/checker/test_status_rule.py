"""backend/harness/verdict.status_of as a table: which checks' outcomes make PASS, FAIL, FLAKY or
UNVERIFIABLE, and the reason each names. Pure: no session, no backend."""

from __future__ import annotations

import pytest

from backend.harness.verdict import status_of
from backend.result import CheckOutcome, Status

OK = CheckOutcome("reference", True)
DET = CheckOutcome("determinism", False, step=1, max_abs_err=1e-3)
NOTE = ("a launch behind the dispatcher",)


def _bad(name, err=None, detail="", step=2):
    return CheckOutcome(name, False, step=step, max_abs_err=err, detail=detail)


@pytest.mark.parametrize("checks, notes, kv_jitter, attn_jitter, status, reason", [
    ([OK], (), False, 0.0, Status.PASS, ""),
    # emulation that could not follow the graphs: no plain pass, and a graph-only failure is unverifiable
    ([OK], NOTE, False, 0.0, Status.PASS, "emulation: unverifiable — a launch behind the dispatcher"),
    ([OK, _bad("replay", 0.5)], NOTE, False, 0.0, Status.UNVERIFIABLE,
     "the graph side disagreed with eager from step 2 (replay): run on a GPU to decide"),
    ([_bad("reference", 0.5)], NOTE, False, 0.0, Status.FAIL, "reference check failed at step 2"),
    ([_bad("replay", 0.5)], (), False, 0.0, Status.FAIL, "replay check failed at step 2"),
    # eager's own jitter explains a failure within JITTER_FACTOR of it: FLAKY, naming the others
    ([DET], (), False, 0.0, Status.FLAKY, "eager not deterministic at step 1"),
    ([DET, _bad("replay", 3e-3)], (), False, 0.0, Status.FLAKY, "eager not deterministic at step 1 (also failed: replay)"),
    ([DET, _bad("replay", 1.0)], (), False, 0.0, Status.FAIL, "(eager also not deterministic, max_abs 0.001)"),
    ([DET, _bad("finite")], (), True, 0.0, Status.FAIL, "finite check failed"),  # NaN is never jitter
    ([DET, _bad("kv_integrity", detail="step 2: slot 3")], (), True, 0.0, Status.FLAKY, "also failed: kv_integrity"),
    ([DET, _bad("kv_integrity", detail="step 2: outside the real slots")], (), True, 0.0, Status.FAIL,
     "kv_integrity check failed"),
    ([DET, _bad("kv_integrity", detail="step 2: slot 3")], (), False, 0.0, Status.FAIL, "kv_integrity check failed"),
    ([DET, _bad("attn_replay", 0.3)], (), False, 0.1, Status.FLAKY, "also failed: attn_replay"),
    ([DET, _bad("attn_replay", 0.3)], (), False, 0.0, Status.FAIL, "attn_replay check failed"),
])  # fmt: skip # a table: one row per line, as it reads
def test_status_of(checks, notes, kv_jitter, attn_jitter, status, reason):
    got_status, got_reason = status_of(checks, notes, kv_jitter, attn_jitter)
    assert got_status == status
    assert reason in got_reason if reason else got_reason == ""
