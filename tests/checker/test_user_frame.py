"""A failing backend's own line (the first frame outside orch) and a reason in Python's words, in
every text output: the checker's reason and log tail, `orch repro`, summary.md, JUnit."""

from __future__ import annotations

import inspect

import pytest

from backend.harness.checker import run_case
from backend.providers.torch_backend import TorchBackend, TorchImpl
from backend.result import Status
from orchestrator import gate, junit, summary
from orchestrator.cli import main
from orchestrator.store import RunInfo
from tests.checker.conftest import DECODE, make_case

HOST_SYNC = "tests.mutants.host_sync:Backend"
WHERE = "tests/mutants/host_sync.py, line 15, in forward"  # `int(metadata.seq_lens.max())`


@pytest.fixture(scope="module")
def host_sync():
    return run_case(make_case(HOST_SYNC, "FULL", "auto", DECODE))


def test_a_host_sync_names_the_backends_line_and_what_it_wrote(host_sync):
    r = host_sync
    assert r.status == Status.ERROR and r.error_kind == "capture"
    assert r.reason.startswith(f"capture error ({WHERE}): FULL size "), r.reason
    assert "`.item()`" in r.reason and "a host read of a device tensor" in r.reason, r.reason
    assert r.log_tail.splitlines()[-2:] == [
        f"first frame outside orch: {WHERE}",
        "    self.longest = int(metadata.seq_lens.max())  # device -> host: not capturable",
    ]


class RaisingImpl(TorchImpl):
    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        raise ValueError("bad block table")


class RaisingBackend(TorchBackend):
    name = "raising"
    impl_cls = RaisingImpl


def test_an_exception_in_forward_names_its_line():
    r = run_case(make_case("tests.checker.test_user_frame:RaisingBackend", "NONE", "auto", DECODE))
    assert r.status == Status.ERROR and r.error_kind == "exception"
    line = inspect.getsourcelines(RaisingImpl.forward)[1] + 1  # the raise, the line after the def
    assert r.reason == f"ValueError (tests/checker/test_user_frame.py, line {line}, in forward): bad block table"


def test_summary_and_junit_show_the_backends_line(host_sync):
    outcome = gate.evaluate([host_sync])
    run = RunInfo(
        id=1,
        matrix="tests/tiny.yaml",
        matrix_sha="",
        git_sha="",
        started_at=0.0,
        finished_at=1.0,
        status="finished",
        cluster="local",
        devices="cpu",
        num_cases=1,
        num_results=1,
    )
    md = summary.render(run, [host_sync], outcome)
    assert f"({WHERE})" in md and f"first frame outside orch: {WHERE}" in md
    xml = junit.to_string([host_sync], outcome, suite_name="tiny")
    assert f'message="[error] capture error ({WHERE})' in xml and "a host read of a device tensor" in xml


def test_repro_text_shows_the_backends_line(capsys):
    case_id = "tp1-FULL-auto-decode_7-Backend-s0"
    assert main(["repro", case_id, "--matrix", "matrices/smoke.yaml", "--backend", HOST_SYNC, "--devices", "cpu"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"ERROR {case_id}: capture error ({WHERE})"), out
    assert f"first frame outside orch: {WHERE}" in out
    assert "capture sizes" not in out  # it captured nothing: no "capture sizes per step []"


def test_a_gpu_capture_error_says_what_usually_causes_it():
    # A GPU's capture error names no op ("operation not permitted when stream is capturing"): the
    # reason adds the usual cause beside the backend's line.
    r = run_case(make_case("tests.executor.faulty_backends:CaptureErrorBackend", "FULL", "auto", DECODE))
    assert r.status == Status.ERROR and r.error_kind == "capture"
    assert r.reason.startswith("capture error (tests/executor/faulty_backends.py, line "), r.reason
    assert r.reason.endswith(
        "(usually a host read of a device tensor in that line: `.item()`, `.tolist()`, `.cpu()`, "
        "`nonzero`, a Python `if` on a tensor)"
    ), r.reason
