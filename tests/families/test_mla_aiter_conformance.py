"""AITER API conformance for the MLA providers: the calls aiter_mla.py and aiter_triton_mla.py
make, recorded on CPU, bound against the installed amd-aiter's signatures (read from its source;
tests/backend/test_aiter_conformance.py has the machinery and says why)."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from backend.providers import aiter_loader as L
from backend.providers import aiter_ops_emulated
from tests.backend.test_aiter_conformance import Recorder, conformance_errors
from tests.families.test_mla_ops import BATCHES, make_config, run_op

pytestmark = pytest.mark.skipif(
    L.aiter_package_dir() is None, reason="amd-aiter not installed (pip install -e '.[test]')"
)


def _recording_backend(base: str, impl_attr: str, recorder):
    from backend.attention.registry import get_backend

    cls = get_backend(base, "mla")
    impl = type("RecordingImpl", (cls.impl_cls,), {impl_attr: recorder})
    return type("RecordingBackend", (cls,), {"impl_cls": impl, "__module__": __name__})


@pytest.mark.parametrize("name", BATCHES)
@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_native_mla_calls_bind_to_installed_aiter(name, kv, monkeypatch):
    recorder = Recorder(
        "native",
        {
            "mla_decode_fwd": aiter_ops_emulated.mla_decode_fwd,
            "flash_attn_varlen_func": aiter_ops_emulated.flash_attn_varlen_func,
        },
    )
    backend = _recording_backend("aiter-emulated", "ops", recorder)
    monkeypatch.setattr(sys.modules[__name__], "RecordingBackend", backend, raising=False)
    monkeypatch.setattr("backend.attention.registry.get_backend", lambda n, f="gqa": backend)
    import tests.families.test_mla_ops as ops_tests

    monkeypatch.setattr(ops_tests, "get_backend", lambda n, f="gqa": backend)
    run_op("aiter-emulated", make_config(kv), *BATCHES[name], k_scale=0.05 if kv == "fp8" else 1.0)
    assert recorder.calls, "no AITER call recorded"
    assert [e for c in recorder.calls for e in conformance_errors(c)] == []


@pytest.mark.parametrize("name", BATCHES)
def test_triton_mla_calls_bind_to_installed_aiter(name, monkeypatch):
    from backend.providers import aiter_triton_mla

    if importlib.util.find_spec("triton") is None:  # the wrapper imports nothing of triton itself
        monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace())
    recorder = Recorder(
        "triton",
        {
            "decode_attention_fwd_grouped_rope": lambda *a, **k: None,
            "flash_attn_varlen_func": lambda q, k, v, *a, **kw: q.new_zeros(*q.shape[:-1], v.shape[-1]),
        },
    )
    monkeypatch.setattr(aiter_triton_mla, "load_aiter_triton", lambda: recorder)
    run_op("aiter-triton", make_config(), *BATCHES[name])
    names = {c.name for c in recorder.calls}
    assert names <= {"decode_attention_fwd_grouped_rope", "flash_attn_varlen_func"} and names
    assert [e for c in recorder.calls for e in conformance_errors(c)] == []
