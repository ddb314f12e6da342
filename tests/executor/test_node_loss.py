"""Node loss on a 2-node cluster of its own (a subprocess: never a second cluster in this process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.executor.node_loss_script import CASES

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_cases_of_a_lost_node_are_rescheduled_without_blame():
    p = subprocess.run(
        [sys.executable, "-m", "tests.executor.node_loss_script"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(next(l for l in p.stdout.splitlines() if l.startswith("RESULT "))[len("RESULT ") :])
    assert set(out["nodes"]) == {out["keep"], out["doomed"]}
    # The node really went away while cases ran on it (the GCS says so).
    assert out["removal_error"] is None and out["removed"], out["removal_error"]
    assert out["dead"] == [out["doomed"]], out
    # At least one case was interrupted by the loss and rescheduled...
    lost = out["requeued_after_loss"]
    assert lost, "no case was running on the node that was removed"
    results = out["results"]
    assert len(results) == CASES and set(lost) <= set(results)
    # ...and ran again on a live worker. Every case passed, and the node loss did not count as an
    # attempt of the cases it interrupted.
    assert all(status == "pass" and attempts == 1 for status, attempts, _ in results.values()), results
