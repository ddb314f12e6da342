"""The fp8 KV scales that a graph cannot freeze unseen. Each step draws its own scales and
graphs are captured under scales no step draws, so a graph holding a host copy of the scale it
was captured under disagrees with eager in every step of every case, in any order of cases on a
worker (before, the case after a same-seed case captured its graphs under its own scales and
passed)."""

from __future__ import annotations

import pytest
import torch

from backend.harness.checker import SessionCache, run_case
from backend.harness.step_data import CAPTURE_SCALE_RANGE, FP8_SCALE_RANGE, set_capture_scales, set_scales
from backend.result import Status
from tests.checker.conftest import CPU, DECODE, DEVICES, MIXED, make_case

MUTANT = "tests.mutants.host_scale_copy:Backend"


# A worker that ran the batch eagerly first (its scales set), then captures for FULL_DECODE_ONLY;
# and the other way round. The FULL graphs of the mutant hold the floats of the warm-up before them.
@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize("order", [("NONE", "FULL_DECODE_ONLY"), ("FULL_DECODE_ONLY", "NONE")])
def test_a_host_frozen_scale_fails_whatever_ran_before_on_the_worker(order, device):
    sessions = SessionCache(capacity=4)
    got = {mode: run_case(make_case(MUTANT, mode, "fp8", DECODE), device=device, sessions=sessions) for mode in order}
    assert got["NONE"].status == Status.PASS, got["NONE"].reason
    fdo = got["FULL_DECODE_ONLY"]
    assert fdo.status == Status.FAIL and fdo.reason.startswith("replay check failed at step 0"), fdo.reason
    # kv auto: every scale is 1.0, nothing to freeze.
    assert run_case(make_case(MUTANT, "FULL_DECODE_ONLY", "auto", DECODE), device=device).status == Status.PASS


def test_every_step_draws_its_own_scales_and_captures_draw_none_of_them():
    from backend.attention.kv_cache import fp8_dtype
    from backend.attention.registry import get_backend
    from backend.harness.checker import _session_plan

    fmax = torch.finfo(fp8_dtype(CPU)).max
    seen = []
    for batch in (DECODE, MIXED):
        case = make_case("torch", "FULL", "fp8", batch)
        session = _session_plan(case, get_backend("torch", "gqa"), 0, CPU).factory()
        for step in range(6):
            set_scales(case, session, step)
            values = [float(t) * fmax for t in (*session.model.k_scales, *session.model.v_scales)]
            assert all(FP8_SCALE_RANGE[0] <= v <= FP8_SCALE_RANGE[1] for v in values)
            seen.append(tuple(values))
        set_scales(case, session, 2)
        assert tuple(float(t) * fmax for t in (*session.model.k_scales, *session.model.v_scales)) == seen[-4]
        set_capture_scales(session, "fp8")
        assert all(CAPTURE_SCALE_RANGE[0] <= float(t) * fmax <= CAPTURE_SCALE_RANGE[1] for t in session.model.k_scales)
    assert len(set(seen)) == len(seen)  # per step and per batch
    assert CAPTURE_SCALE_RANGE[1] < FP8_SCALE_RANGE[0]
