"""Case.to_dict and CaseResult.to_dict are hand-written for speed (they run per case in the
driver); they must stay exactly dataclasses.asdict, and round-trip through from_dict."""

from __future__ import annotations

import dataclasses
import json

import pytest

from backend.case import BatchSpec, Case, ModelShape, Tolerance
from backend.result import CaseResult, CheckOutcome, Status
from orchestrator.matrix import load_matrix

CASES = [
    Case("torch", 1, "FULL", "auto", BatchSpec("b", (1, 3), (8, 9), "two rows")),
    Case(
        "pkg.mod:Cls",
        4,
        "NONE",
        "fp8",
        BatchSpec("d", (1,), (5,)),
        seed=3,
        model=ModelShape(num_heads=32),
        capture_sizes=(1, 2),
        tolerance=Tolerance(1e-3, 2e-3),
        matrix="m.yaml",
        spec_tokens=2,
    ),
]
RESULTS = [
    CaseResult("a", Status.PASS),
    CaseResult(
        "b",
        Status.FAIL,
        reason="replay",
        checks=(CheckOutcome("replay", False, 1, 0.5, 0.1, 0.2, (3, 1), False, "d"), CheckOutcome("finite", True)),
        capture_sizes_used=(8, 0),
        timings={"total_s": 1.5},
        versions={"torch": "x"},
        axes={"tp": 1},
    ),
]


def _asdict_result(r: CaseResult) -> dict:
    d = dataclasses.asdict(r)
    d["status"] = r.status.value
    return d


@pytest.mark.parametrize(
    "case", CASES + list(load_matrix("matrices/smoke.yaml", devices="cpu", backend_checks=False).cases[:20])
)
def test_case_to_dict_is_asdict_and_round_trips(case):
    d = case.to_dict()
    assert d == dataclasses.asdict(case) and json.dumps(d) == json.dumps(dataclasses.asdict(case))
    assert Case.from_dict(d) == case and Case.from_dict(json.loads(json.dumps(d))) == case


@pytest.mark.parametrize("result", RESULTS)
def test_result_to_dict_is_asdict_and_round_trips(result):
    d = result.to_dict()
    assert d == _asdict_result(result) and json.dumps(d) == json.dumps(_asdict_result(result))
    assert CaseResult.from_dict(d) == result


def test_result_dict_does_not_alias_the_result():
    # asdict copies the dict fields; so must the fast path (a store or report editing the dict
    # must not change the frozen result it came from).
    r = RESULTS[1]
    d = r.to_dict()
    d["timings"]["total_s"] = 99.0
    d["axes"]["tp"] = 8
    assert r.timings == {"total_s": 1.5} and r.axes == {"tp": 1}


def test_a_subclass_field_is_serialised():
    # The fast path walks the instance's own class's fields, as asdict does: an added field is
    # not silently dropped.
    @dataclasses.dataclass(frozen=True)
    class Wider(Case):
        extra: int = 7

    w = Wider("torch", 1, "FULL", "auto", BatchSpec("b", (1,), (4,)))
    assert w.to_dict()["extra"] == 7 and w.to_dict() == dataclasses.asdict(w)
