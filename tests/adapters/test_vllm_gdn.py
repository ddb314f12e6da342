"""vLLM's own GDN backend for the hybrid_gdn family (backend/adapters/vllm/gdn.py): what it declares,
vLLM's GDN builder under the CPU graph emulation (orch's torch kernels in place of its Triton ones,
labelled), vLLM's padding rule, a broken twin red where its bug reaches, and the layer view that
carries vLLM's Triton core on a GPU."""

from __future__ import annotations

import pytest
import torch

from backend.attention.registry import get_backend, get_capabilities
from backend.harness.checker import SessionCache, run_case
from backend.result import Status
from tests.families.conftest import GDN_DECODE, GDN_MIXED, make_gdn_case

vllm = pytest.importorskip("vllm", reason="vllm not importable (docs/VLLM.md: .ci/run installs it)")
pytestmark = pytest.mark.vllm

CPU = torch.device("cpu")
DECODE_GRAPH = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


@pytest.fixture(scope="module")
def sessions():
    return SessionCache(capacity=32)


def test_what_the_bridge_declares_and_says_it_runs():
    cls = get_backend("vllm:GDN_ATTN", "hybrid_gdn")
    assert (
        cls.family == "hybrid_gdn"
        and get_capabilities("vllm:GDN_ATTN", "hybrid_gdn").cudagraph_support.name == "UNIFORM_BATCH"
    )  # vLLM's GDNAttentionMetadataBuilder._cudagraph_support
    assert cls.unavailable_reason(CPU) is None  # vLLM's builder runs here; the core is orch's, labelled
    assert "GDN builder: vLLM's" in cls.kernels and "orch's torch kernels" in cls.kernels
    gqa = get_backend("vllm:GDN_ATTN", "gqa")
    assert "is not bridged for the gqa family" in gqa.unavailable_reason(CPU)


@pytest.mark.parametrize("k", [0, 2])
def test_vllms_builder_passes_every_mode_on_cpu(k, sessions):
    for batch in (GDN_DECODE, GDN_MIXED):
        for mode in ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
            r = run_case(
                make_gdn_case("vllm:GDN_ATTN", mode, "auto", batch, spec_tokens=k), device=CPU, sessions=sessions
            )
            assert r.status == Status.PASS, f"{mode}/k{k}/{batch.kind}: {r.reason}"
            assert "orch's torch kernels" in r.versions["kernels"] and r.versions["vllm"]


def test_vllm_pads_a_state_index_with_its_null_block():
    """A padded FULL decode replay (the last step: 6 requests in a graph of 8): vLLM's staged
    indices hold its null block 0 for the padded requests, which the state check takes as vLLM's
    padding."""
    case = make_gdn_case("vllm:GDN_ATTN", "FULL_DECODE_ONLY", "auto", GDN_DECODE)
    sessions = SessionCache()
    assert run_case(case, device=CPU, sessions=sessions).status == Status.PASS
    (session,) = sessions._sessions.values()
    md = session.last_metadata[0]
    idx, n = md.non_spec_state_indices_tensor, md.num_reqs
    assert md.pad_slot == 0 and idx.shape[0] == md.num_padded_reqs == 8 > n
    assert idx[n:].tolist() == [0] * (8 - n) and bool((idx[:n] > 0).all())


def test_the_unstaged_twin_is_red_where_a_graph_keeps_its_capture_metadata(sessions):
    for k in (0, 2):
        for mode in ("NONE", "PIECEWISE", *DECODE_GRAPH):
            r = run_case(
                make_gdn_case("tests.mutants.vllm_gdn:Unstaged", mode, "auto", GDN_DECODE, spec_tokens=k),
                device=CPU,
                sessions=sessions,
            )
            want = Status.FAIL if k > 0 and mode in DECODE_GRAPH else Status.PASS
            assert r.status == want, f"{mode}/k{k}: {r.reason}"


def test_the_layer_view_holds_everything_vllms_core_reads():
    """On a GPU the bridge calls QwenGatedDeltaNetAttention._forward_core on a view of the layer:
    every `self.` attribute of the core (and of the methods it calls on self) is on the view."""
    from vllm.config import set_current_vllm_config

    from backend.adapters.vllm.gdn import forward_core_attributes, layer_view, load_gdn, vllm_context
    from backend.attention.gdn import GDNDims, StatePage
    from backend.harness.session import Session

    loaded, why = load_gdn()
    assert loaded is not None, why
    case = make_gdn_case("vllm:GDN_ATTN", "NONE", "auto", GDN_DECODE, spec_tokens=2)
    session = Session(
        get_backend("vllm:GDN_ATTN", "hybrid_gdn"), case.model, 1, 0, "auto", (1, 2, 4, 8), CPU, spec_tokens=2
    )
    config = session.config
    page = StatePage(GDNDims.of(config), config.dtype, torch.float32)
    weights = session.model.layers[0]
    with set_current_vllm_config(vllm_context(config)[0]):
        view = layer_view(loaded[1], config, session.kv_caches[0], page, weights)
    missing = forward_core_attributes(loaded[1]) - set(vars(view))
    assert not missing, missing
    assert view.kv_cache[0].shape[1:] == (GDNDims.of(config).conv_width, GDNDims.of(config).conv_dim)  # SD layout


def test_cutlass_capability_queries_answer_false_where_their_compiled_op_is_absent():
    """On CUDA the GDN layer's quantization configs call vLLM's compiled CUTLASS capability ops at
    import (w8a8_utils); a Python-only wheel has none: they answer False, labelled."""
    from backend.adapters.vllm import native

    ops = pytest.importorskip("vllm._custom_ops")
    before = {n: getattr(ops, n) for n in native.CAPABILITY_QUERIES}
    try:
        done = native.stub_capability_queries(force=True)
        assert set(done) == {n for n in native.CAPABILITY_QUERIES if not native._compiled_op(n)}
        for name in done:
            assert getattr(ops, name)(90) is False
        if done:
            assert any("no compiled CUTLASS kernel" in e for e in native.EMULATED)
    finally:
        for name, fn in before.items():
            setattr(ops, name, fn)
