"""Backends loaded by import path (tests.matrix.plugins:Name) to exercise the loader's skips."""

from __future__ import annotations

from backend.attention.interface import AttentionBackend


class NoFp8Backend(AttentionBackend):
    name = "no-fp8"
    supported_kv_cache_dtypes = ("auto",)


class NowhereBackend(AttentionBackend):
    name = "nowhere"

    @classmethod
    def unavailable_reason(cls, device):
        return f"needs a unicorn, not {device.type}"


class CrashingCheckBackend(AttentionBackend):
    name = "crashing-check"

    @classmethod
    def unavailable_reason(cls, device):
        raise RuntimeError("probe exploded")


NOT_A_CLASS = 42


from backend.providers.torch_swa import TorchSWABackend  # noqa: E402 - beside the plugin backends below


class NoSinksBackend(TorchSWABackend):
    """A swa_sinks provider without sinks (as vLLM's ROCM_ATTN): the matrix must refuse it where
    the model has sinks."""

    name = "no-sinks"
    features = ()
