"""Every check is load-bearing: for each check, a mutant that only it catches (once the checks
that see the same bug by design are switched off too) is red with the check on and green with it
switched off. A check that could be deleted without a mutant turning green would be untested.

A check is switched off by making its accumulator record every step as passed
(CheckAccumulator.add with ok=True): the numbers are still computed, the verdict ignores them.
"""

from __future__ import annotations

import dataclasses

import pytest

from backend.harness.checker import run_case
from backend.harness.checks import CheckAccumulator
from backend.result import CHECK_NAMES, Status
from tests.checker.conftest import DECODE, TINY, make_case
from tests.families.conftest import GDN_DECODE, GDN_TOL, TINY_GDN

ONE_LAYER = dataclasses.replace(TINY, num_layers=1)  # nothing after the output feeds an attention
# 16 heads: one head's error is diluted in the residual stream as at the GPU shape (1 of 32).
WIDE = dataclasses.replace(TINY, num_heads=16, num_kv_heads=4)
VALUE_CHECKS = ("reference", "replay", "attn_reference", "attn_replay")

LOAD_BEARING = {
    # check: (mutant, mode, case changes, checks that see the same bug by design, status when on)
    "reference": ("tests.mutants.scaled_allreduce:Backend", "NONE", {"model": ONE_LAYER}, (), Status.FAIL),
    "replay": ("tests.mutants.scaled_allreduce:CapturedBackend", "FULL", {"model": ONE_LAYER}, (), Status.FAIL),
    "attn_reference": ("tests.mutants.near_threshold:HeadScaled", "NONE", {"model": WIDE}, (), Status.FAIL),
    "attn_replay": (
        "tests.mutants.near_threshold:HeadScaledCaptured",
        "FULL",
        {"model": dataclasses.replace(WIDE, num_layers=1)},
        (),
        Status.FAIL,
    ),
    # NaN is never close: every value check sees it too.
    "finite": ("tests.mutants.nan_output:Backend", "NONE", {}, VALUE_CHECKS, Status.FAIL),
    "padded_finite": ("tests.mutants.padded_nan:Backend", "FULL", {}, (), Status.FAIL),
    "kv_integrity": ("tests.mutants.padded_slot_write:Backend", "FULL", {}, (), Status.FAIL),
    "determinism": ("tests.mutants.jittery:TinyBackend", "NONE", {}, (), Status.FLAKY),
    # hybrid_gdn's: padded requests' accepted count 0, not 1 (the metadata's padding contract);
    # no kernel of the torch provider reads it, so nothing else sees it
    "state_integrity": (
        "tests.mutants.gdn_builders:AcceptedPaddedZero",
        "FULL_DECODE_ONLY",
        {"model": TINY_GDN, "batch": GDN_DECODE, "tolerance": GDN_TOL["auto"], "spec_tokens": 2},
        (),
        Status.FAIL,
    ),
}


def _switch_off(monkeypatch, names) -> None:
    real = CheckAccumulator.add
    off = frozenset(names)

    def add(self, step, ok, **kw):
        real(self, step, ok or self.name in off, **kw)

    monkeypatch.setattr(CheckAccumulator, "add", add)


@pytest.mark.parametrize("check", CHECK_NAMES)
def test_check_is_load_bearing(check, monkeypatch):
    # Parametrized by the checker's own list: a check added without a scenario fails here.
    assert check in LOAD_BEARING, f"no load-bearing scenario for check {check!r}"
    backend, mode, changes, also_off, status = LOAD_BEARING[check]
    changes = dict(changes)
    case = make_case(backend, mode, "auto", changes.pop("batch", DECODE), **changes)
    _switch_off(monkeypatch, also_off)
    on = run_case(case)
    assert on.status == status, (on.reason, [c.summary() for c in on.checks])
    failed = [c.name for c in on.failed_checks]
    assert failed == [check], [c.summary() for c in on.checks]
    monkeypatch.undo()
    _switch_off(monkeypatch, (*also_off, check))
    off = run_case(case)
    assert off.status == Status.PASS, (off.reason, [c.summary() for c in off.checks])


def test_switching_off_works_through_the_verdict(monkeypatch):
    """The seam itself: a correct provider stays green, and a mutant red for two checks is still
    red with one of them off (the harness does not just turn everything green)."""
    _switch_off(monkeypatch, ("reference",))
    assert run_case(make_case("torch", "NONE", "auto", DECODE)).status == Status.PASS
    r = run_case(make_case("tests.mutants.near_threshold:HeadZeroed", "NONE", "auto", DECODE))
    assert r.status == Status.FAIL and r.reason.startswith("attn_reference check failed"), r.reason
