"""Host tensors taking part in device work inside a captured forward, through the whole checker:
red (or a capture error) where a real graph is stale or cannot capture, green for the control
(tests/mutants/host_in_capture.py; the probes HOST_WORK in probes.py show each against real graphs).
On a GPU machine the same cases run under real CUDA graphs too (DEVICES)."""

from __future__ import annotations

import pytest

from backend.harness.checker import SessionCache, run_case
from backend.result import Status
from tests.checker.conftest import DEVICES, MIXED, make_case

# mutant -> (kv dtype, FULL status, FULL reason prefix); NONE passes for every one
EXPECT = {
    "NumpyLens": ("auto", Status.FAIL, "replay check failed at step 0"),
    "HostIndex": ("auto", Status.ERROR, "capture error (tests/mutants/host_in_capture.py, line "),
    "LazyHostIndex": ("auto", Status.ERROR, "capture error (tests/mutants/host_in_capture.py, line "),
    "HostScale": ("auto", Status.FAIL, "replay check failed at step 0"),
    "PinnedStaging": ("auto", Status.PASS, ""),
}


@pytest.fixture(scope="module")
def own_sessions() -> SessionCache:
    return SessionCache(capacity=4)


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize("mutant", EXPECT)
def test_host_work_in_a_captured_forward_is_red_and_the_pinned_staging_control_green(mutant, device, own_sessions):
    kv, status, reason = EXPECT[mutant]
    # NONE first, on the session FULL then captures in: what the backend made on eager calls is
    # what the capture reads
    case = f"tests.mutants.host_in_capture:{mutant}"
    eager = run_case(make_case(case, "NONE", kv, MIXED), device=device, sessions=own_sessions)
    assert eager.status == Status.PASS, eager.reason
    r = run_case(make_case(case, "FULL", kv, MIXED), device=device, sessions=own_sessions)
    assert r.status == status, r.reason
    assert r.reason.startswith(reason), r.reason
    if status == Status.ERROR and device.type == "cpu":
        assert "aten.index.Tensor mixes host tensors with device tensors" in r.reason, r.reason


# Host memory a builder makes in an eager step's build() (the session builds every step's metadata
# inside host_scope, as it builds the capture's): red on a GPU and under the emulation alike.
@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_host_memory_a_builder_makes_in_an_eager_build_is_red(device, own_sessions):
    case = "tests.mutants.host_in_capture:LazyHostScale"
    eager = run_case(make_case(case, "NONE", "auto", MIXED), device=device, sessions=own_sessions)
    assert eager.status == Status.PASS, eager.reason
    r = run_case(make_case(case, "FULL", "auto", MIXED), device=device, sessions=own_sessions)
    assert r.status == Status.FAIL and r.reason.startswith("replay check failed at step 0"), r.reason
