"""benchmarks/gpu_mla_pad_probe.py (docs/VLLM.md, "TRITON_MLA's padded rows"): what was read in
vLLM's source, and the probe's answer off a GPU."""

from __future__ import annotations

import inspect

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vllm not importable (docs/VLLM.md: .ci/run installs it)")
pytestmark = pytest.mark.vllm


def test_vllms_stage_two_divides_by_a_sum_a_seq_len_0_row_never_adds_to():
    """The mechanism as read: the split merge starts from e_sum = 0 and only adds splits with
    split_kv_end > split_kv_start (none for seq_len 0), then stores acc / e_sum; vLLM's V2 runner
    pads a decode graph's requests with seq_len 0."""
    from backend.adapters.vllm import native

    native.stub_platform_native()
    from vllm.v1.attention.ops import triton_decode_attention as t
    from vllm.v1.worker.gpu import input_batch

    stage2 = inspect.getsource(t._fwd_kernel_stage2)
    assert "e_sum = 0.0" in stage2 and "if split_kv_end > split_kv_start:" in stage2 and "acc / e_sum" in stage2
    assert "seq_lens[num_reqs:] = 0" in inspect.getsource(input_batch)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answer")
def test_the_probe_says_it_needs_a_gpu(capsys, tmp_path):
    from benchmarks.gpu_mla_pad_probe import main

    assert main(["--out", str(tmp_path / "p.json")]) == 3
    assert capsys.readouterr().err.strip() == "gpu_mla_pad_probe: needs a CUDA GPU"
