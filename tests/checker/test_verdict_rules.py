"""How failed checks become a verdict: the determinism rule (FLAKY only when eager jitter can
explain every other failure), on real providers with deliberately nondeterministic kernels."""

from __future__ import annotations

import pytest
import torch

from backend.case import BatchSpec
from backend.harness.checker import run_case
from backend.harness.session import LRU
from backend.result import Status
from tests.checker.conftest import DECODE, MIXED, TINY, make_case

BIG_CONTEXT = BatchSpec("decode1", (1,), (40,))

DETERMINISM_SCENARIOS = {
    # name: (backend, batch, status, first failed check named in the reason)
    "jitter only: flaky": ("tests.mutants.jittery:Backend", DECODE, Status.FLAKY, "eager not deterministic"),
    "ulp jitter on a wrong kernel: still a failure": (
        "tests.mutants.jittery:WrongBackend",
        MIXED,
        Status.FAIL,
        "reference check failed",
    ),
    "jitter but the bug is out of reach: flaky": (
        "tests.mutants.jittery:WrongBackend",
        DECODE,
        Status.FLAKY,
        "eager not deterministic",
    ),
}


@pytest.mark.parametrize("mode", ["FULL", "PIECEWISE"])
def test_jitter_mutant_is_graph_safe(mode, monkeypatch):
    """No default-generator RNG in the jitter (on CUDA an eager draw raises once any capture of
    the process failed): capture is legal (emulated here, real CUDA graphs on a GPU) and the
    verdict is FLAKY, not a capture ERROR; the replay differs from eager as a second eager would."""
    for name in ("rand", "randn", "rand_like", "randn_like", "randint", "normal", "bernoulli", "multinomial"):
        real = getattr(torch, name)

        def guarded(*args, _real=real, _name=name, **kwargs):
            if kwargs.get("generator") is None:
                raise AssertionError(f"torch.{_name} on the default generator")
            return _real(*args, **kwargs)

        monkeypatch.setattr(torch, name, guarded)
    r = run_case(make_case("tests.mutants.jittery:Backend", mode, "auto", DECODE))
    assert r.status == Status.FLAKY and r.error_kind == "", (r.reason, r.log_tail[-800:])
    assert r.capture_sizes_used[0] == 4


@pytest.mark.parametrize("name", DETERMINISM_SCENARIOS)
def test_determinism_rule(name):
    backend, batch, status, reason = DETERMINISM_SCENARIOS[name]
    r = run_case(make_case(backend, "NONE", "auto", batch))
    assert r.status == status, (r.reason, [c.summary() for c in r.checks])
    assert r.reason.startswith(reason), r.reason
    det = next(c for c in r.checks if c.name == "determinism")
    assert not det.passed and det.max_abs_err > 0  # the measured jitter is recorded


def _scaled_quantize(factor):
    def quantize_fp8(x, scale, dtype):  # stores x / (scale * factor): reads back `factor` too small
        fmax = torch.finfo(dtype).max
        return (x.float() / (scale.float() * factor)).clamp(-fmax, fmax).to(dtype)

    return quantize_fp8


def _scaled_dequantize(factor):
    def dequantize(x, scale):
        return (
            x.float() * scale.float() * factor if x.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz) else x.float()
        )

    return dequantize


# The providers' shared fp8 code broken in place (as an edit to kv_cache.py would): every name it
# is imported under is patched, the checker's included, so the reference cannot borrow it.
SHARED_QUANTISER_BREAKS = {
    "quantize stores V and K 1.25x too small": (
        "quantize_fp8",
        _scaled_quantize(1.25),
        ("backend.attention.kv_cache", "backend.harness.checker"),
    ),
    "dequantize reads 1.25x too large": (
        "dequantize",
        _scaled_dequantize(1.25),
        (
            "backend.attention.kv_cache",
            "backend.providers.torch_ops",
            "backend.harness.checker",
            "backend.harness.checks",
        ),
    ),
}


@pytest.mark.parametrize("name", SHARED_QUANTISER_BREAKS)
def test_broken_shared_fp8_quantiser_fails_the_reference(name, monkeypatch):
    attr, broken, modules = SHARED_QUANTISER_BREAKS[name]
    for module in modules:
        monkeypatch.setattr(f"{module}.{attr}", broken, raising=False)
    monkeypatch.setattr("backend.harness.step_data.REFERENCES", LRU(64))  # no reference from an unbroken run
    r = run_case(make_case("torch", "NONE", "fp8", DECODE, seed=913))
    assert r.status == Status.FAIL and r.reason.startswith("reference check failed"), r.reason
    ref = next(c for c in r.checks if c.name == "reference")
    assert ref.max_abs_err > 0.01


def test_context_goes_through_the_providers_kv_write(monkeypatch):
    """A write_kv that drops the last token of writes longer than any decode step (max_num_seqs
    tokens): decode writes are right, so only a context written through it can show the bug."""
    import backend.attention.kv_cache as kv_cache

    real = kv_cache.write_kv

    def drops_last(kv, key, value, slot_mapping, k_scale, v_scale):
        n = slot_mapping.shape[0] - (slot_mapping.shape[0] > TINY.max_num_seqs)
        real(kv, key[:n], value[:n], slot_mapping[:n], k_scale, v_scale)

    for module in ("backend.attention.kv_cache", "backend.providers.torch_backend", "backend.families.gqa"):
        monkeypatch.setattr(f"{module}.write_kv", drops_last, raising=False)
    monkeypatch.setattr("backend.harness.step_data.REFERENCES", LRU(64))
    r = run_case(make_case("torch", "NONE", "auto", BIG_CONTEXT, seed=914))
    assert r.status == Status.FAIL and r.reason.startswith("reference check failed"), r.reason
