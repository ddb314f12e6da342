"""vLLM's own backends for the mla and swa_sinks families (backend/adapters/vllm/mla.py, swa.py):
what they declare, where they skip and why, and on CPU vLLM's FLEX_ATTENTION through the swa_sinks
family (sliding windows per layer, builders per KV-cache group over shared metadata)."""

from __future__ import annotations

import pytest
import torch

from backend.attention.registry import get_backend, get_capabilities
from backend.harness.checker import run_case
from backend.result import Status
from tests.families.conftest import SWA_DECODE, SWA_MIXED, make_swa_case, swa_model

vllm = pytest.importorskip("vllm", reason="vllm not importable (docs/VLLM.md: .ci/run installs it)")
pytestmark = pytest.mark.vllm


@pytest.mark.parametrize(
    "name, family, support, features, reason",
    [
        ("vllm:TRITON_MLA", "mla", "UNIFORM_BATCH", (), "launches Triton kernels: it needs a GPU"),
        ("vllm:TRITON_ATTN", "swa_sinks", "ALWAYS", ("sinks",), "launches Triton kernels: it needs a GPU"),
        ("vllm:FLEX_ATTENTION", "swa_sinks", "ALWAYS", (), None),
        ("vllm:FLASHMLA", "mla", "NEVER", (), "is not bridged for the mla family"),
        ("vllm:TRITON_MLA", "gqa", "NEVER", (), "is an MLA backend: run it with attention: [mla]"),
    ],
)
def test_what_each_family_bridge_declares_and_why_it_skips(name, family, support, features, reason):
    cls = get_backend(name, family)
    caps = get_capabilities(name, family)
    assert cls.family == family and caps.cudagraph_support.name == support and caps.features == features
    why = cls.unavailable_reason(torch.device("cpu"))
    assert (why is None) if reason is None else (reason in why), why


def test_triton_mla_says_what_runs_as_vllms_and_what_as_orchs():
    cls = get_backend("vllm:TRITON_MLA", "mla")
    assert "forward_mqa" in cls.kernels and "orch's" in cls.kernels


def _flex(mode, batch, **dims):
    model = swa_model(sinks=0, **dims)
    return make_swa_case("vllm:FLEX_ATTENTION", mode, "auto", batch, model=model)


@pytest.mark.parametrize("layout, mode, batch", [("hybrid", "FULL", SWA_DECODE), ("merged", "PIECEWISE", SWA_MIXED)])
def test_flex_attention_runs_the_swa_family_per_group_on_cpu(layout, mode, batch):
    # (CPU flex is slow: one graph mode per layout; the GPU run covers every mode, gpu_vllm.py)
    r = run_case(_flex(mode, batch, kv_groups=layout), device=torch.device("cpu"))
    assert r.status == Status.PASS, f"{layout} {mode}/{batch.name}: {r.reason}"


def test_the_layers_windows_reach_vllms_impls(monkeypatch):
    """Every layer given no window: the window layers attend their whole context, and the
    reference (windowed) says so: the bridge really hands vLLM each layer's window."""
    from backend.adapters.vllm import swa

    real = swa.VllmSWAImpl._impl
    monkeypatch.setattr(swa.VllmSWAImpl, "_impl", lambda self, window, sinks: real(self, None, sinks))
    r = run_case(_flex("NONE", SWA_MIXED), device=torch.device("cpu"))
    ref = next(c for c in r.checks if c.name == "attn_reference")
    assert r.status == Status.FAIL and not ref.passed and ref.detail.startswith("step 0: layer 0,"), r.reason


def test_sinks_with_a_vllm_backend_that_has_none_is_bad_input(tmp_path, capsys):
    from orchestrator.cli import main
    from tests.matrix.helpers import replace, write

    doc = (
        replace("  backend: [torch]", "  backend: [torch]\n  attention: [swa_sinks]")
        + "families:\n  swa_sinks:\n    axes: {backend: ['vllm:FLEX_ATTENTION']}\n"
    )
    assert main(["plan", write(tmp_path, doc), "--devices", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "vllm:FLEX_ATTENTION has no sinks, which the swa_sinks model asks for" in err, err
