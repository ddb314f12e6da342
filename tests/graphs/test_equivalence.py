"""The equivalence programs give the expected verdicts: on CPU with the emulation, and on a GPU
with real graphs (run by the lead on the H200; skipped where there is no CUDA/HIP device)."""

from __future__ import annotations

import json

import pytest
import torch

from backend.graphs import GraphCaptureError, make_graph_runner
from backend.graphs.equivalence import EXPECTED, PROGRAMS, run_all

has_gpu = torch.cuda.is_available()


def test_table_covers_every_program():
    assert set(EXPECTED) == {p.name for p in PROGRAMS}
    assert set(EXPECTED.values()) == {"fresh", "stale", "capture-error"}


def test_emulated_runner_gives_expected_verdicts():
    assert run_all(make_graph_runner("cpu"), "cpu") == EXPECTED


def test_gpu_equivalence_script_writes_json(tmp_path):
    from benchmarks.gpu_equivalence import main

    out = tmp_path / "golden_cuda.json"
    assert main(["--out", str(out)]) == 0
    report = json.loads((tmp_path / "probe_comparison.json").read_text())
    assert report["programs"]["host_sync"]["emulated"] == "capture-error"
    assert report["programs"]["customop_item"]["emulated"] == "capture-error"
    assert report["disagree"] == []
    assert out.exists() == has_gpu  # the golden table is written only from a real graph


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu, reason="needs a CUDA/HIP device")
def test_real_graph_runner_gives_expected_verdicts():
    runner = make_graph_runner(torch.device("cuda", 0))
    assert runner.kind in ("cuda", "hip")
    assert run_all(runner, "cuda") == EXPECTED


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu, reason="needs a CUDA/HIP device")
def test_real_runner_survives_a_failed_capture_and_shares_one_pool():
    runner = make_graph_runner(torch.device("cuda", 0))
    x = torch.arange(8.0, device="cuda")
    scale = torch.ones(1, device="cuda")
    with pytest.raises(GraphCaptureError):
        runner.capture(lambda: x * scale.item())
    assert not torch.cuda.is_current_stream_capturing()
    graphs = {}
    for n in (8, 4):  # largest first, one pool
        fn = (lambda m: lambda: x[:m] * scale)(n)
        runner.warmup(fn)
        graphs[n] = runner.capture(fn)
    x.add_(1)
    scale.fill_(2)
    assert torch.equal(graphs[8].replay(), (torch.arange(8.0, device="cuda") + 1) * 2)
    assert torch.equal(graphs[4].replay(), (torch.arange(4.0, device="cuda") + 1) * 2)
