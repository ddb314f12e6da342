"""The cost model orders cases sensibly and history pulls it toward what was observed."""

from __future__ import annotations

import dataclasses

import pytest

from backend.case import BatchSpec, Case, ModelShape
from orchestrator.scheduling.cost import (
    calibration_factor,
    capture_counts,
    estimate_all,
    estimate_seconds,
    gang_startup_seconds,
    model_seconds,
)

BASE = Case(backend="torch", tp=1, mode="FULL", kv_cache_dtype="auto", batch=BatchSpec("b", (1,) * 8, (256,) * 8))


def with_(**kw) -> Case:
    return dataclasses.replace(BASE, **kw)


@pytest.mark.parametrize(
    "name, cheaper, dearer",
    [
        ("more tokens", BASE, with_(batch=BatchSpec("b", (64,) * 8, (256,) * 8))),
        ("more context", BASE, with_(batch=BatchSpec("b", (1,) * 8, (512,) * 8))),
        ("more layers", BASE, with_(model=ModelShape(num_layers=8))),
        ("bigger heads", BASE, with_(model=ModelShape(head_size=128))),
        ("gang startup", BASE, with_(tp=2)),
        ("bigger gang", with_(tp=2), with_(tp=8)),
        ("fp8 kv", BASE, with_(kv_cache_dtype="fp8")),
        ("more steps", BASE, with_(steps=8)),
        ("no capture vs full", with_(mode="NONE"), BASE),
        ("decode-only vs full", with_(mode="FULL_DECODE_ONLY"), BASE),
        ("full vs piecewise (more pieces)", BASE, with_(mode="PIECEWISE")),
        ("piecewise vs full_and_piecewise", with_(mode="PIECEWISE"), with_(mode="FULL_AND_PIECEWISE")),
        ("fewer capture sizes", with_(capture_sizes=(1, 2, 4)), BASE),
    ],
)
def test_cost_orders_cases(name, cheaper, dearer):
    assert model_seconds(cheaper) < model_seconds(dearer), name


def test_capture_counts_follow_the_mode():
    n = len(BASE.capture_sizes)
    decode = sum(1 for s in BASE.capture_sizes if s <= BASE.model.max_num_seqs)
    assert capture_counts(with_(mode="NONE")) == (0, 0)
    assert capture_counts(with_(mode="PIECEWISE")) == (0, n)
    assert capture_counts(with_(mode="FULL")) == (n, 0)
    assert capture_counts(with_(mode="FULL_DECODE_ONLY")) == (decode, 0)
    assert capture_counts(with_(mode="FULL_AND_PIECEWISE")) == (decode, n)
    with pytest.raises(ValueError, match="BOGUS"):
        capture_counts(with_(mode="BOGUS"))


def test_history_pulls_the_estimate_toward_observed():
    model = estimate_seconds(BASE)
    assert model == model_seconds(BASE) > 0
    slow = estimate_seconds(BASE, {BASE.case_id: model * 10})
    fast = estimate_seconds(BASE, {BASE.case_id: model / 10})
    assert model < slow < model * 10 and model / 10 < fast < model
    assert slow > model * 5  # mostly believes the observation
    assert estimate_seconds(BASE, {"some-other-case": 999.0}) == model


def test_estimate_all_rescales_unseen_cases_by_the_machine():
    seen, unseen = BASE, with_(tp=2)
    history = {seen.case_id: model_seconds(seen) * 4}  # this machine is 4x slower than the model
    est = estimate_all([seen, unseen], history)
    assert est[unseen.case_id] == pytest.approx(model_seconds(unseen) * 4)  # its gang start-up too
    assert est[seen.case_id] == pytest.approx(model_seconds(seen) * 4)
    assert estimate_all([seen, unseen]) == {c.case_id: model_seconds(c) for c in (seen, unseen)}


@pytest.mark.parametrize("wide_s, narrow_s", [(0.1, 0.3), (0.05, 1.0), (0.3, 0.3)])
def test_history_keeps_a_gangs_cases_ahead_of_narrower_ones(wide_s, narrow_s):
    """A store's durations are the cases' own time, never their gang's forming: with history a tp 8
    case that ran faster than a tp 1 case still estimates above it (by its start-up), so a run
    keeps its widths in order instead of re-forming gangs back and forth (docs/EXECUTION.md)."""
    wide, narrow = with_(tp=8), BASE
    history = {wide.case_id: wide_s, narrow.case_id: narrow_s}
    est = estimate_all([wide, narrow], history)
    start_up = gang_startup_seconds(wide) * calibration_factor([wide, narrow], history)
    assert est[wide.case_id] > est[narrow.case_id] + start_up * 0.5, est
