"""`vllm:NAME`: vLLM's own attention backends behind our interface (backend/adapters/vllm/).

The first group needs no vllm (version range, names, skips with reasons). The `vllm` group runs
vLLM's real FLEX_ATTENTION code and is skipped with the reason when vllm is not importable
(.ci/run installs it, docs/VLLM.md); it includes backends broken on purpose.
"""

from __future__ import annotations

import pytest
import torch

from backend.adapters import vllm as adapter
from backend.attention.registry import BackendLoadError, availability, get_backend
from backend.case import BatchSpec, Case, ModelShape, Tolerance
from backend.harness.checker import run_case
from backend.result import Status

_VLLM_WHY = adapter.version_reason(adapter.installed_version())
if _VLLM_WHY is None:
    _cls, _VLLM_WHY = adapter.load_vllm_backend("FLEX_ATTENTION")
_skip = pytest.mark.skipif(_VLLM_WHY is not None, reason=f"vllm not usable here: {_VLLM_WHY}")


def needs_vllm(test):
    """The `vllm` group (`pytest -m vllm`): real vLLM code, skipped with the reason without it."""
    return pytest.mark.vllm(_skip(test))


@pytest.mark.parametrize(
    "installed,expect",
    [
        (None, "unavailable: vllm is not installed"),
        ("0.32.1", "outside the supported range >=0.33.0,<0.35.0"),
        ("0.33.0", None),
        ("0.34.0", None),
        ("0.34.1rc1", None),
        ("0.34.0+cu130", None),
        ("0.35.0", "outside the supported range"),
        ("1.0.0", "outside the supported range"),
        ("not-a-version", "is not a version number"),
    ],
)
def test_version_range(installed, expect):
    why = adapter.version_reason(installed)
    if expect is None:
        assert why is None
    else:
        assert expect in why and "\n" not in why


def test_empty_vllm_name_is_one_line_error():
    with pytest.raises(BackendLoadError, match="empty vLLM backend name"):
        get_backend("vllm:")


def test_unusable_vllm_is_a_skip_reason_never_a_traceback(monkeypatch):
    """vllm missing / outside the range: the class still loads and says why it cannot run."""
    monkeypatch.setattr(adapter, "installed_version", lambda: "0.20.0")
    adapter.load_vllm_backend.cache_clear()
    adapter._make_backend.cache_clear()
    try:
        cls = get_backend("vllm:FLEX_ATTENTION")
        why = cls.unavailable_reason(torch.device("cpu"))
        assert "vllm 0.20.0 is outside the supported range" in why
        a = availability("vllm:FLEX_ATTENTION", "cpu")
        assert not a.available and "outside the supported range" in a.reason
        case = Case(
            "vllm:FLEX_ATTENTION",
            1,
            "FULL",
            "auto",
            BatchSpec("d", (1,), (9,)),
            model=ModelShape(
                num_heads=4, num_kv_heads=2, head_size=16, num_layers=1, max_model_len=64, max_num_seqs=4, num_blocks=32
            ),
            capture_sizes=(1, 2, 4),
        )
        result = run_case(case, device=torch.device("cpu"))
        assert result.status == Status.SKIP and "outside the supported range" in result.reason
    finally:
        adapter.load_vllm_backend.cache_clear()
        adapter._make_backend.cache_clear()


def test_without_vllm_the_matrix_skips_every_vllm_case_with_that_reason_alone(monkeypatch):
    """vllm not installed: every vllm: cell of matrices/vllm.yaml is a skip whose reason is that,
    not a kv dtype the backend may well support, and nothing is runnable."""
    from orchestrator.matrix import load_matrix

    monkeypatch.setattr(adapter, "installed_version", lambda: None)
    adapter.load_vllm_backend.cache_clear()
    adapter._make_backend.cache_clear()
    try:
        matrix = load_matrix("matrices/vllm.yaml", devices="cpu")
        assert not matrix.cases and len(matrix.skipped) == 150
        assert {s.reason for s in matrix.skipped} == {adapter.version_reason(None)}
        assert adapter.version_reason(None).startswith("unavailable: vllm is not installed")
    finally:
        adapter.load_vllm_backend.cache_clear()
        adapter._make_backend.cache_clear()


# ---- with vLLM ---------------------------------------------------------------------------------
SHAPE = ModelShape(
    num_heads=8,
    num_kv_heads=2,
    head_size=16,
    num_layers=1,
    max_model_len=128,
    max_num_seqs=16,
    num_blocks=64,
    max_num_batched_tokens=512,
)
SIZES = (1, 2, 4, 8, 16, 32)


def _case(mode: str, batch: BatchSpec, backend: str = "vllm:FLEX_ATTENTION", kv: str = "auto", k: int = 0) -> Case:
    return Case(
        backend,
        1,
        mode,
        kv,
        batch,
        model=SHAPE,
        capture_sizes=SIZES,
        steps=3,
        tolerance=Tolerance(2e-2, 2e-2),
        spec_tokens=k,
    )


DECODE_5 = BatchSpec("decode_5", (1,) * 5, (40, 17, 64, 9, 33))
MIXED = BatchSpec("mixed", (1, 1, 6, 1), (30, 12, 6, 50))


@needs_vllm
def test_flex_declares_vllms_own_support_and_kv_dtypes():
    cls = get_backend("vllm:FLEX_ATTENTION")
    vllm_cls = cls.vllm_backend
    assert cls.name == "vllm:FLEX_ATTENTION"
    assert cls.cudagraph_support.name == vllm_cls.get_builder_cls()._cudagraph_support.name == "ALWAYS"
    assert cls.supported_kv_cache_dtypes == ("auto",)  # vLLM's FLEX has no quantized cache
    a = availability("vllm:FLEX_ATTENTION", "cpu")
    assert a.available, a.reason


@needs_vllm
def test_unknown_vllm_name_is_bad_input_with_the_closest_name():
    # It used to be 75 skips ("vLLM has no attention backend 'NOPE'") and a green gate.
    from orchestrator.errors import InputError
    from orchestrator.matrix import load_matrix

    with pytest.raises(
        InputError,
        match=r"vllm:FLEX_ATTENTIN is not an attention backend of vLLM .*did you mean "
        r"vllm:FLEX_ATTENTION\?",
    ):
        load_matrix("matrices/vllm.yaml", devices="cpu", backend_override="vllm:FLEX_ATTENTIN")


@needs_vllm
def test_cache_view_is_vllms_storage_in_our_layout():
    """Our [2, B, N, H, D] view and vLLM's logical [B, H, N, 2D] view address the same bytes:
    K of (block b, offset n, head h) is vLLM's [b, h, n, :D], V its [b, h, n, D:]."""
    from vllm.v1.kv_cache_layout import KVCacheLayout

    from backend.harness.model import TPLayout
    from backend.harness.session import attention_config

    config = attention_config(SHAPE, TPLayout(1, 0, 8, 2, 16), "auto", SIZES, "cpu")
    ours = adapter.allocate_vllm_kv_cache(config, KVCacheLayout.LBNHC)
    theirs = adapter.as_vllm_view(ours)
    assert ours.shape == (2, 64, 16, 2, 16) and theirs.shape == (64, 2, 16, 32)
    ours[0, 5, 3, 1] = 1.0
    ours[1, 5, 3, 1] = 2.0
    assert (theirs[5, 1, 3, :16] == 1).all() and (theirs[5, 1, 3, 16:] == 2).all()
    assert int((theirs != 0).sum()) == 32  # nothing else touched
    # vLLM's FLEX reads [B, N, H, 2D] physically (LBNHC): a token's heads are adjacent.
    assert theirs.transpose(1, 2).is_contiguous()


@needs_vllm
def test_emulated_kv_write_skips_padded_slots():
    adapter.ensure_cache_ops()
    kc = torch.zeros(4, 16, 2, 8)
    vc = torch.zeros(4, 16, 2, 8)
    key, value = torch.ones(3, 2, 8), 2 * torch.ones(3, 2, 8)
    slots = torch.tensor([17, -1, 63])
    one = torch.ones(1)
    torch.ops._C_cache_ops.reshape_and_cache_flash(key, value, kc, vc, slots, "auto", one, one)
    assert (kc.view(64, 2, 8)[[17, 63]] == 1).all() and (vc.view(64, 2, 8)[[17, 63]] == 2).all()
    assert int((kc != 0).sum()) == 2 * 16  # the -1 token wrote nowhere


@needs_vllm
@pytest.mark.parametrize(
    "mode,batch",
    [
        ("NONE", MIXED),
        ("PIECEWISE", MIXED),
        ("FULL", MIXED),  # ALWAYS: the mixed batch replays a FULL graph of 16 tokens
        ("FULL", DECODE_5),  # pads 5 -> 8
        ("FULL_AND_PIECEWISE", DECODE_5),
    ],
)
def test_flex_cells_run_vllm_code_green(mode, batch):
    result = run_case(_case(mode, batch), device=torch.device("cpu"))
    assert result.status == Status.PASS, (result.reason, result.log_tail[-2000:])
    assert result.provider == "vllm:FLEX_ATTENTION" and result.resolved_mode == mode
    # What ran in place of vLLM's own code is in the result, with vLLM's version.
    assert result.versions["vllm"] == adapter.installed_version()
    assert {"reshape_and_cache_flash", "flex_attention eager (CPU)"} <= set(result.versions["emulated"].split(", "))
    if mode != "NONE":
        assert result.graph_kind == "emulated"


@needs_vllm
def test_flex_spec_decode_verify_rows():
    result = run_case(_case("FULL_DECODE_ONLY", DECODE_5, k=2), device=torch.device("cpu"))
    assert result.status == Status.PASS, result.reason


@needs_vllm
@pytest.mark.parametrize("k, want", [(0, None), (2, 2), (3, 3)])
def test_spec_tokens_reach_vllms_speculative_config(k, want):
    """The case's k is vLLM's num_speculative_tokens (its builders size by it: TRITON_ATTN's 3D
    scratch, spec-as-decode reorder thresholds), and k > 0 gets a session of its own."""
    from vllm.v1.attention.backend import max_decode_query_len

    from backend.harness.checker import SessionCache

    sessions = SessionCache(capacity=4)
    result = run_case(_case("FULL_DECODE_ONLY", DECODE_5, k=k), device=torch.device("cpu"), sessions=sessions)
    assert result.status == Status.PASS, result.reason
    (session,) = sessions._sessions.values()
    assert session.config.spec_tokens == k
    vc = session.builder.ctx.vllm_config
    spec = vc.speculative_config
    assert (spec.num_speculative_tokens if spec is not None else None) == want
    assert max_decode_query_len(vc) == 1 + k


@needs_vllm
def test_flex_fp8_is_a_skip_with_reason():
    result = run_case(_case("FULL", DECODE_5, kv="fp8"), device=torch.device("cpu"))
    assert result.status == Status.SKIP and "kv_cache_dtype fp8 not supported by vllm:FLEX_ATTENTION" in result.reason


# ---- broken on purpose: the checker must see it through the adapter ---------------------------
class _NoKVWriteImpl(adapter.VllmImpl):
    """vLLM's FLEX with the KV write dropped: new tokens are never attended to."""

    backend_name = "FLEX_ATTENTION"

    def forward(self, query, key, value, kv_cache, metadata, k_scale, v_scale, output):
        self.layer.bind(k_scale, v_scale)
        t = metadata.num_padded_tokens
        self.impl.forward(
            self.layer, query[:t], key[:t], value[:t], adapter.as_vllm_view(kv_cache), metadata.vllm, output[:t]
        )
        return output


class _StaleMetadataBuilder(adapter.VllmBuilder):
    """Rebuilds vLLM's metadata only at capture: a replay keeps the capture's seq_lens (what a
    builder that does not write its persistent buffers looks like under FULL graphs)."""

    backend_name = "FLEX_ATTENTION"

    def build(self, batch, num_padded_tokens=None, num_padded_reqs=None):
        md = super().build(batch, num_padded_tokens, num_padded_reqs)
        if num_padded_tokens is not None:  # a FULL replay step
            self.vllm_builder.persistent_seq_lens.fill_(1)
        return md


def _mutant(**roles):
    base = get_backend("vllm:FLEX_ATTENTION")
    return type("Mutant", (base,), {"name": "vllm:FLEX_ATTENTION-mutant", **roles})


@needs_vllm
def test_dropped_kv_write_fails_the_reference_check(monkeypatch):
    mutant = _mutant(impl_cls=_NoKVWriteImpl)
    monkeypatch.setattr("backend.harness.checker.get_backend", lambda name, family="gqa": mutant)
    result = run_case(_case("NONE", MIXED), device=torch.device("cpu"))
    assert result.status == Status.FAIL and "reference" in result.reason


@needs_vllm
def test_stale_metadata_under_full_fails_replay_only(monkeypatch):
    mutant = _mutant(builder_cls=_StaleMetadataBuilder)
    monkeypatch.setattr("backend.harness.checker.get_backend", lambda name, family="gqa": mutant)
    full = run_case(_case("FULL", DECODE_5), device=torch.device("cpu"))
    assert full.status == Status.FAIL and "replay" in full.reason
    piecewise = run_case(_case("PIECEWISE", DECODE_5), device=torch.device("cpu"))
    assert piecewise.status == Status.PASS, piecewise.reason


_CUDA_PLATFORM = """
import sys
from backend.adapters import vllm as adapter
if sys.argv[1] == "stub":
    print("stubbed", adapter.stub_platform_native(force=True))
try:
    import vllm.platforms.cuda
    print("imported", issubclass(vllm.platforms.cuda.CudaPlatform, vllm.platforms.cuda.CudaPlatformBase))
except ImportError as e:
    print("failed", e)
"""


@needs_vllm
@pytest.mark.parametrize("stub", ["stub", "no-stub"])
def test_cuda_platform_imports_on_a_python_only_install_only_with_the_stub(stub):
    """vllm/platforms/cuda.py imports the compiled vllm._C_stable_libtorch at module level: on a
    GPU machine with the Python-only wheel (.whl-vllm), current_platform, and with it TRITON_ATTN,
    would not load. The adapter stubs it there; a fresh process shows both sides on CPU."""
    import subprocess
    import sys

    if not adapter._native_missing_module("vllm._C_stable_libtorch"):
        pytest.skip("vllm._C_stable_libtorch loads here")
    out = subprocess.run(
        [sys.executable, "-c", _CUDA_PLATFORM, stub], capture_output=True, text=True, timeout=120
    ).stdout
    if stub == "stub":
        assert "stubbed ('vllm._C_stable_libtorch',)" in out and "imported True" in out, out
    else:
        assert "failed" in out and ("vllm._C_stable_libtorch" in out or "libcuda" in out), out


@needs_vllm
def test_triton_attn_constructs_on_cpu_and_says_it_needs_a_gpu():
    """TRITON_ATTN's class, support level and kv dtypes come from vLLM here; its kernels need CUDA."""
    cls = get_backend("vllm:TRITON_ATTN")
    if cls.vllm_backend is None:
        pytest.skip(cls.unavailable_reason(torch.device("cpu")))
    assert cls.cudagraph_support.name == "ALWAYS"
    assert cls.supported_kv_cache_dtypes == ("auto", "fp8")
    assert "needs a GPU" in cls.unavailable_reason(torch.device("cpu"))
    # Everything up to the kernel launch builds here: vLLM's builder, Impl, cache and metadata.
    from backend.attention.interface import BatchDescription
    from backend.harness.model import TPLayout
    from backend.harness.session import attention_config

    shape = ModelShape(
        num_heads=8, num_kv_heads=2, head_size=64, num_layers=1, max_model_len=128, max_num_seqs=8, num_blocks=32
    )
    for kv, dtype in (("auto", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
        config = attention_config(shape, TPLayout(1, 0, 8, 2, 64), kv, (1, 2, 4, 8), "cpu")
        builder, impl, cache = cls.builder_cls(config), cls.impl_cls(config), cls.allocate_kv_cache(config)
        assert cache.shape == (2, 32, 16, 2, 64) and cache.dtype == dtype
        table = torch.zeros(2, 8, dtype=torch.int32)
        table[0, 0], table[1, 0] = 1, 2
        md = builder.build(BatchDescription([1, 3], [5, 3], table, torch.tensor([20, 32, 33, 34])))
        assert type(md.vllm).__name__ == "TritonAttentionMetadata"
        assert builder.build_for_capture(8, 1).vllm.num_actual_tokens == 8
        assert type(impl.impl).__name__ == "TritonAttentionImpl"


# ---- fp8 query: what vLLM's Attention layer does before the Impl (docs/VLLM.md) ----------------
def _triton_impl(kv: str):
    cls = get_backend("vllm:TRITON_ATTN")
    if cls.vllm_backend is None:
        pytest.skip(cls.unavailable_reason(torch.device("cpu")))
    from backend.harness.model import TPLayout
    from backend.harness.session import attention_config

    shape = ModelShape(
        num_heads=8, num_kv_heads=2, head_size=64, num_layers=1, max_model_len=128, max_num_seqs=8, num_blocks=32
    )
    config = attention_config(shape, TPLayout(1, 0, 8, 2, 64), kv, (1, 2, 4, 8), "cpu")
    return cls, config


@needs_vllm
@pytest.mark.parametrize(
    "backend,kv,declared,quantized",
    [
        ("FLEX_ATTENTION", "auto", None, False),  # FLEX never declares it (and has no fp8 cache)
        ("TRITON_ATTN", "auto", None, False),  # model-dtype cache: the layer leaves the query alone
        ("TRITON_ATTN", "fp8", None, False),  # as built on CPU: is_cuda() is False, so not declared
        ("TRITON_ATTN", "fp8", True, True),  # as built on CUDA: the layer quantises
        ("TRITON_ATTN", "auto", True, False),  # declared, but the cache is not fp8
    ],
)
def test_query_quantizer_follows_the_impls_declaration_and_the_kv_dtype(backend, kv, declared, quantized):
    """The layer's rule (Attention.__init__, 0.33/0.34): QuantFP8 only when the Impl declares
    supports_quant_query_input and the cache is fp8; the flag is read from vLLM's own Impl."""
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8

    if backend == "FLEX_ATTENTION":
        cls = get_backend("vllm:FLEX_ATTENTION")
        from backend.harness.model import TPLayout
        from backend.harness.session import attention_config

        impl = cls.impl_cls(attention_config(SHAPE, TPLayout(1, 0, 8, 2, 16), kv, SIZES, "cpu"))
    else:
        cls, config = _triton_impl(kv)
        impl = cls.impl_cls(config)
    assert impl.impl.supports_quant_query_input is False  # on CPU, for both
    if declared is not None:
        impl.impl.supports_quant_query_input = declared
    quant = adapter.query_quantizer(impl.impl, kv, impl.ctx.vllm_config)
    assert isinstance(quant, QuantFP8) if quantized else quant is None
    if quantized:
        assert quant.static and quant.group_shape.is_per_tensor()


class _Recorder:
    def __init__(self):
        self.calls = []

    def forward(self, layer, query, key, value, kv_cache, md, output):
        self.calls.append((query.clone(), key.dtype, layer._q_scale.clone()))

    def do_kv_cache_update(self, *args):
        pass


def _triton_fp8_forward(q_scale: float, query: torch.Tensor, declared: bool = True):
    """The adapter's forward for TRITON_ATTN fp8 as built on CUDA (declared), up to vLLM's kernel
    launch, which needs a GPU: what the Impl receives."""
    from backend.attention.interface import BatchDescription

    cls, config = _triton_impl("fp8")
    builder, impl, cache = cls.builder_cls(config), cls.impl_cls(config), cls.allocate_kv_cache(config)
    real = impl.impl
    real.supports_quant_query_input = declared
    impl.query_quant = adapter.query_quantizer(real, "fp8", impl.ctx.vllm_config)
    table = torch.zeros(2, 8, dtype=torch.int32)
    table[0, 0], table[1, 0] = 1, 2
    md = builder.build(BatchDescription([1, 3], [5, 3], table, torch.tensor([20, 32, 33, 34])))
    rec = _Recorder()
    impl.impl = rec
    impl.layer._q_scale.fill_(q_scale)
    kv = torch.randn(4, 2, 64, dtype=torch.bfloat16)
    ones = torch.ones(1)
    impl.forward(query, kv, kv, cache, md, ones, ones, torch.empty_like(query))
    ((seen, key_dtype, seen_scale),) = rec.calls
    return real, seen, key_dtype, seen_scale


@needs_vllm
@pytest.mark.parametrize("q_scale", [1.0, 2.0])
def test_triton_fp8_impl_receives_the_layers_fp8_query(q_scale):
    """On CUDA vLLM's layer hands TRITON_ATTN an e4m3 query, x / _q_scale clamped to +-448, and the
    Impl then passes layer._q_scale as q_descale (FP8_PER_TENSOR and an fp8 query). K/V stay in the
    model dtype (the cache write quantises them). A value past e4m3's range saturates, not NaN."""
    from backend.harness.reference import fp8_round

    torch.manual_seed(0)
    query = torch.randn(4, 8, 64, dtype=torch.bfloat16) * 3
    query[0, 0, 0] = 1000.0
    real, seen, key_dtype, seen_scale = _triton_fp8_forward(q_scale, query)
    assert seen.dtype == torch.float8_e4m3fn and seen.shape == (4, 8, 64)
    assert key_dtype == torch.bfloat16
    assert seen_scale.dim() == 0 and seen_scale.dtype == torch.float32 and float(seen_scale) == q_scale
    expect = fp8_round(query.float(), q_scale, torch.float8_e4m3fn) / q_scale  # saturating
    assert torch.equal(seen.float(), expect)
    assert float(seen[0, 0, 0]) == 448.0
    assert real._kv_quant_mode.name == "FP8_PER_TENSOR"  # so TRITON's forward sets q_descale = _q_scale


@needs_vllm
def test_undeclared_query_quantisation_leaves_the_model_dtype_query():
    """Broken on purpose, the other way: as built on CPU (not declared) the Impl gets the bf16
    query untouched; were the adapter to quantise regardless, this would see fp8."""
    query = torch.randn(4, 8, 64, dtype=torch.bfloat16)
    _, seen, _, _ = _triton_fp8_forward(1.0, query, declared=False)
    assert seen.dtype == torch.bfloat16 and torch.equal(seen, query)


# ---- broken vLLM backends as plugins (tests/mutants/vllm_backends.py): the gate goes red ----------
@needs_vllm
@pytest.mark.parametrize(
    "mutant,filter_expr,red,check",
    [
        # Prefill rows zeroed after vLLM's forward: red where a batch has a prefill row, in every mode
        # (eager is as wrong: the reference check); the pure decode cells stay green.
        (
            "FlexPrefillDropped",
            "mode=FULL,PIECEWISE k=0 batch=decode_7,mixed_small,prefill_only",
            {"mixed_small", "prefill_only"},
            ("reference", "attn_reference"),
        ),
        # One head halved: red on every cell.
        ("FlexHeadScaled", "mode=FULL_DECODE_ONLY k=0,2 batch=decode_7", {"decode_7"}, ("reference", "attn_reference")),
    ],
)
def test_broken_vllm_backend_turns_the_gate_red(mutant, filter_expr, red, check):
    from orchestrator.errors import ExitCode
    from orchestrator.filters import select
    from orchestrator.gate import evaluate
    from orchestrator.matrix import load_matrix

    matrix = load_matrix("matrices/vllm.yaml", devices="cpu", backend_override=f"tests.mutants.vllm_backends:{mutant}")
    cases = select(list(matrix.cases), filter_expr)
    assert cases and all(c.kv_cache_dtype == "auto" for c in cases)  # fp8: FLEX declares none
    results = [run_case(c, device=torch.device("cpu")) for c in cases]
    outcome = evaluate(results)
    assert outcome.exit_code == ExitCode.GATE_FAILED
    for case, r in zip(cases, results):
        assert r.provider.startswith("mutant-vllm:FLEX_ATTENTION")
        if case.batch.name in red:
            assert r.status == Status.FAIL and r.reason.startswith(tuple(f"{c} check failed" for c in check)), (
                case.case_id,
                r.status,
                r.reason,
            )
            assert outcome.classification[case.case_id] == "fail"
        else:
            assert r.status == Status.PASS, (case.case_id, r.reason)
    assert set(outcome.new_failures) == {c.case_id for c in cases if c.batch.name in red}


def test_without_vllms_class_a_swa_backends_sinks_are_unknown_not_absent(monkeypatch):
    """A machine without vllm: vllm:TRITON_ATTN for swa_sinks declares the sinks it cannot check
    (its cases skip with the unavailable line), so a matrix asking for sinks still plans; read as
    absent, `orch plan matrices/vllm-families.yaml` exited 2 there. The same holds where vllm is
    installed: its class is what the load returns, so the load is made to fail here."""
    from backend.adapters.vllm import current, swa

    monkeypatch.setattr(current, "load", lambda name: (None, "unavailable: vllm is not installed"))
    swa.make_swa_backend.cache_clear()
    try:
        cls = swa.make_swa_backend("TRITON_ATTN")
        assert cls.features == ("sinks",)
        assert cls.unavailable_reason(torch.device("cpu")).startswith("unavailable: vllm is not installed")
    finally:
        swa.make_swa_backend.cache_clear()
