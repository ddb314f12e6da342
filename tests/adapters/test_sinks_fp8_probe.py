"""benchmarks/gpu_sinks_fp8_probe.py (docs/VLLM.md Finding 11): the arithmetic model that the H100
matched to three digits, and what was read in vLLM's kernel."""

from __future__ import annotations

import inspect

import pytest
import torch

from benchmarks import gpu_sinks_fp8_probe as probe


def _case(sink_text: str, seq_len: int = 64, query_len: int = 1):
    q, k, v = probe.inputs(seq_len, query_len, "cpu")
    fp8 = torch.float8_e4m3fn
    k8, ks = probe.quantise(k, fp8)
    v8, vs = probe.quantise(v, fp8)
    q8, qs = probe.quantise(q, fp8)
    k, v, q = k8.float() * ks, v8.float() * vs, q8.float() * qs
    sink = probe.sink_values(sink_text, "cpu")
    ref, _ = probe.reference(q, k, v, sink, seq_len - query_len)
    return q, k, v, sink, ref


@pytest.mark.parametrize("sink", ["none", "4", "12"])
def test_the_model_without_rounding_is_the_reference(sink):
    q, k, v, s, ref = _case(sink)
    out = probe.model_fp8_p(q, k, v, s, 63, torch.float32)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_e4m3_rounding_of_p_costs_little_without_a_sink_and_everything_once_a_sink_leads_by_12():
    """The finding's shape: the same rounding is inside orch's fp8 tolerance with no sink (the
    largest P is exactly 1) and fails every head once P sinks into e4m3's subnormal range."""
    fp8 = torch.float8_e4m3fn
    q, k, v, s, ref = _case("none")
    calm = probe.judge(probe.model_fp8_p(q, k, v, s, 63, fp8), ref)
    q, k, v, s, ref = _case("12")
    led = probe.judge(probe.model_fp8_p(q, k, v, s, 63, fp8), ref)
    assert calm["bad"] == 0 and calm["max_rel"] < 0.05
    assert led["bad_fraction"] > 0.9 and led["median_rel"] > 0.1


def test_the_probe_says_it_needs_a_gpu(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the CPU answer")
    assert probe.main(["--out", str(tmp_path / "p.json")]) == 3
    assert capsys.readouterr().err.strip().startswith("gpu_sinks_fp8_probe: needs a CUDA GPU")


@pytest.mark.vllm
def test_vllms_kernel_starts_its_max_at_the_sink_and_scales_fp8_p_by_a_fixed_256():
    pytest.importorskip("vllm", reason="vllm not importable (docs/VLLM.md: .ci/run installs it)")
    from backend.adapters.vllm import native

    native.stub_platform_native()
    from vllm.v1.attention.ops import triton_attention_helpers as helpers
    from vllm.v1.attention.ops import triton_unified_attention as ua

    init = helpers.init_softmax_M
    assert "sink_ptr" in inspect.getsource(getattr(init, "fn", init))
    text = inspect.getsource(ua)
    assert "p_scale = 256.0" in text and "(P * p_scale).to(V.dtype)" in text
