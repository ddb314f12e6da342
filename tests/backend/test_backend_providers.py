"""Every provider that can run here matches the independent reference on vLLM-style batches."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from backend.attention.registry import get_backend
from backend.harness.reference import reference_from_cache
from tests.backend.attn_batches import make_config, make_step, run_backend

# name -> (query_lens, seq_lens, config overrides, k_scale, v_scale)
SCENARIOS = {
    "decode": ([1, 1, 1, 1, 1], [7, 30, 1, 16, 44], {}, 1.0, 1.0),
    "prefill": ([9, 4, 13], [9, 4, 13], {}, 1.0, 1.0),
    "extend": ([5, 3], [21, 40], {}, 1.0, 1.0),
    "mixed": ([1, 6, 1, 12, 1], [33, 6, 2, 25, 60], {}, 1.0, 1.0),
    "long-context": ([1, 4, 1], [255, 200, 256], {"max_model_len": 256, "max_num_seqs": 4}, 1.0, 1.0),
    "gqa-8to1": ([1, 7, 1], [19, 15, 40], {"num_heads": 8, "num_kv_heads": 1}, 1.0, 1.0),
    "mha": ([3, 1], [10, 17], {"num_heads": 4, "num_kv_heads": 4}, 1.0, 1.0),
    "fp8-mixed": ([1, 6, 1, 12], [33, 6, 2, 25], {"kv_cache_dtype": "fp8"}, 0.5, 2.0),
    "fp8-decode": ([1, 1, 1], [50, 3, 64], {"kv_cache_dtype": "fp8"}, 0.25, 0.25),
    "fp16": ([1, 5], [20, 9], {"dtype": torch.float16}, 1.0, 1.0),
}
TOLERANCE = {"auto": 2e-2, "fp8": 0.12}
PROVIDERS = ("torch", "aiter-emulated", "tests.backend.broken_backends:FrozenBranchBackend")


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled-blocks", "contiguous-blocks"])
def test_provider_matches_reference(provider, scenario, shuffle):
    qlens, slens, overrides, ks, vs = SCENARIOS[scenario]
    config = make_config(**overrides)
    backend = get_backend(provider)
    step = make_step(config, qlens, slens, seed=len(scenario), shuffle=shuffle, k_scale=ks, v_scale=vs)
    t = sum(qlens)
    out = run_backend(backend, config, step, num_padded_tokens=t + 3, num_padded_reqs=len(qlens) + 1)
    ref = reference_from_cache(step.query, step.kv_cache, step.batch, config.scale, step.k_scale, step.v_scale)
    tol = TOLERANCE[config.kv_cache_dtype]
    torch.testing.assert_close(out[:t].float(), ref, atol=tol, rtol=tol)
    assert torch.isfinite(out[t:].float()).all(), "padded rows must be finite"


def test_reference_catches_a_wrong_row():
    """The reference check is sensitive: one request's output shifted by one position fails it."""
    config = make_config()
    step = make_step(config, [1, 6], [20, 6])
    out = run_backend(get_backend("torch"), config, step).float()
    ref = reference_from_cache(step.query, step.kv_cache, step.batch, config.scale)
    bad = out.clone()
    bad[1:7] = torch.roll(bad[1:7], 1, dims=0)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(bad, ref, atol=2e-2, rtol=2e-2)


class _NoHostSync(TorchDispatchMode):
    """Raises on the ops a graph capture cannot contain (as the CPU graph emulation does)."""

    FORBIDDEN = frozenset(
        {
            torch.ops.aten._local_scalar_dense.default,
            torch.ops.aten.nonzero.default,
            torch.ops.aten.masked_select.default,
        }
    )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.FORBIDDEN:
            raise RuntimeError(f"host sync in capture: {func}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "provider,qlens,slens",
    [
        ("torch", [1, 6, 1], [30, 6, 9]),
        ("aiter-emulated", [1, 1, 1], [30, 6, 9]),  # decode: the only batches it may capture
    ],
)
def test_forward_has_no_host_sync(provider, qlens, slens):
    config = make_config(kv_cache_dtype="fp8")
    step = make_step(config, qlens, slens, k_scale=0.5, v_scale=0.5)
    backend = get_backend(provider)
    builder, impl = backend.builder_cls(config), backend.impl_cls(config)
    md = builder.build(step.batch)
    out = torch.zeros(md.num_padded_tokens, config.num_heads, config.head_size, dtype=config.dtype)
    with _NoHostSync():
        impl.forward(step.query, step.key, step.value, step.kv_cache, md, step.k_scale, step.v_scale, out)
    ref = reference_from_cache(step.query, step.kv_cache, step.batch, config.scale, step.k_scale, step.v_scale)
    torch.testing.assert_close(out.float(), ref, atol=0.12, rtol=0.12)


def test_no_host_sync_guard_is_live():
    with pytest.raises(RuntimeError, match="host sync"), _NoHostSync():
        torch.ones(3).sum().item()


@pytest.mark.parametrize("provider", ["aiter", "aiter-triton", "aiter-triton-pa"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_gpu_providers_report_a_reason_here(provider, device):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: availability depends on the machine")
    reason = get_backend(provider).unavailable_reason(torch.device(device))
    assert reason and reason.startswith("unavailable:") and "\n" not in reason


def test_support_levels_are_declared_as_vllm_does():
    from backend.attention.interface import AttentionCGSupport as S

    assert get_backend("torch").cudagraph_support is S.ALWAYS
    assert get_backend("aiter").cudagraph_support is S.UNIFORM_BATCH  # vLLM ROCM_AITER_FA today
    assert get_backend("aiter-emulated").cudagraph_support is get_backend("aiter").cudagraph_support
    assert get_backend("aiter-emulated").impl_cls.forward is get_backend("aiter").impl_cls.forward
    assert get_backend("aiter-emulated").name == "aiter-emulated"
    assert get_backend("aiter-triton").cudagraph_support is S.ALWAYS


def test_aiter_emulated_refuses_gpu_shapes_it_cannot_hold():
    """At full.yaml's GPU shape its dense gathers asked an H200 for 132 GiB; on a GPU device it is
    unsupported there (a skip naming the estimate), while CPU runs and tiny GPU shapes stay on."""
    from backend.attention.registry import get_backend
    from tests.backend.attn_batches import make_config

    emu = get_backend("aiter-emulated")
    gpu_shape = dict(
        num_heads=32,
        num_kv_heads=8,
        head_size=128,
        block_size=16,
        max_model_len=4096,
        max_num_seqs=256,
        max_num_tokens=8192,
        num_blocks=64,
    )
    big = make_config(**gpu_shape)
    assert emu.unsupported_reasons(big) == []  # on CPU: allowed
    on_gpu = [r for r in emu.unsupported_reasons(dataclasses.replace(big, device=torch.device("cuda")))]
    assert len(on_gpu) == 1 and "8.0 GiB" in on_gpu[0] and "aiter-triton" in on_gpu[0]
    tiny = dataclasses.replace(make_config(), device=torch.device("cuda"))
    assert emu.unsupported_reasons(tiny) == []


def test_padded_rows_are_zeroed_on_the_device_and_real_rows_kept():
    """aiter-triton's guard for unified_attention's 3D path (NaN in tokens of no request)."""
    from backend.providers.aiter_triton_backend import keep_padded_rows_finite

    out = torch.randn(8, 2, 4, dtype=torch.bfloat16)
    out[3, 1, 2] = float("nan")  # a real row's NaN is the kernel's bug to report, not to hide
    out[6:] = float("nan")
    real = out[:6].clone()
    keep_padded_rows_finite(out, torch.tensor([0, 2, 5, 6, 6], dtype=torch.int32))
    assert torch.equal(out[6:], torch.zeros(2, 2, 4, dtype=torch.bfloat16))
    assert torch.equal(out[:6].isnan(), real.isnan()) and torch.equal(out[:6].nan_to_num(), real.nan_to_num())
