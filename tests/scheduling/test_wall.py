"""The wall-time estimate `orch plan` prints (orchestrator/scheduling/wall.py): per-case durations
that charge a gang's start-up once per tp, and the makespan on the workers a run starts."""

from __future__ import annotations

import pytest

from orchestrator.matrix import load_matrix
from orchestrator.scheduling.cost import GANG_STARTUP_S, calibration_factor, estimate_all, model_seconds
from orchestrator.scheduling.wall import case_durations, expected_wall


@pytest.fixture(scope="module")
def full_cpu():
    return load_matrix("matrices/full.yaml", devices="cpu").cases


def test_a_gangs_start_up_is_charged_once_per_tp(full_cpu):
    # The model charges it to every gang case: 700 of full.yaml's 815 model seconds on a CPU
    # before the MLA and swa_sinks blocks, 790 of 927 with them.
    got = case_durations(full_cpu)
    for tp in (1, 2, 4, 8):
        cases = [c for c in full_cpu if c.tp == tp]
        model = sum(model_seconds(c) for c in cases)
        charged_once = model - (len(cases) - 1) * GANG_STARTUP_S * (tp - 1) if tp > 1 else model
        assert sum(got[c.case_id] for c in cases) == pytest.approx(charged_once, rel=1e-9), tp
    assert sum(got.values()) < 0.2 * sum(model_seconds(c) for c in full_cpu)


def test_with_history_the_start_up_is_still_charged_once_per_tp(full_cpu):
    # Recorded durations never hold a gang's start-up; the estimates add it to every gang case.
    history = {c.case_id: 0.2 for c in full_cpu}
    est, got = estimate_all(full_cpu, history), case_durations(full_cpu, history)
    scale = calibration_factor(full_cpu, history)
    for tp in (1, 2, 4, 8):
        cases = [c for c in full_cpu if c.tp == tp]
        want = sum(est[c.case_id] for c in cases) - (len(cases) - 1) * GANG_STARTUP_S * (tp - 1) * scale
        assert sum(got[c.case_id] for c in cases) == pytest.approx(want, rel=1e-9), tp


@pytest.mark.parametrize("parallel,workers", [(2, 8), (8, 8)])
def test_gangs_wider_than_the_ranks_running_at_once_take_the_machine(full_cpu, parallel, workers):
    tp8 = [c for c in full_cpu if c.tp == 8][:10]
    est = {c.case_id: 1.0 for c in tp8}
    # On 2 cores (8 workers, 2 ranks at once) the tp 8 gang runs alone: one case after another.
    assert expected_wall(tp8, est, parallel, workers) == pytest.approx(10.0)
    assert expected_wall(tp8, est, parallel, 4) == 0.0  # tp 8 does not fit 4 workers: skipped by the run
    assert expected_wall(tp8, est, 0, 0) is None
