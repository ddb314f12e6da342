"""Backend lookup by builtin name or import path; every failure one line."""

from __future__ import annotations

import pytest
import torch

from backend.attention.interface import AttentionBackend
from backend.attention.registry import BUILTIN_BACKENDS, BackendLoadError, get_backend
from backend.harness.reference import reference_from_cache
from tests.backend.attn_batches import make_config, make_step, run_backend


def test_builtin_names_resolve_lazily_to_their_backend():
    assert BUILTIN_BACKENDS == ("torch", "aiter", "aiter-emulated", "aiter-triton", "aiter-triton-pa")
    for name in BUILTIN_BACKENDS:
        backend = get_backend(name)
        assert issubclass(backend, AttentionBackend) and backend.name == name


def test_import_path_loads_a_user_backend_that_is_wrong_only_under_graphs():
    backend = get_backend("tests.backend.broken_backends:FrozenBranchBackend")
    assert backend.name == "frozen-branch"
    # Eager it is correct on a mixed batch (the checker catches it only with FULL graphs).
    config = make_config()
    step = make_step(config, [1, 6, 1], [20, 6, 9])
    out = run_backend(backend, config, step)
    ref = reference_from_cache(step.query, step.kv_cache, step.batch, config.scale)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_frozen_branch_is_wrong_when_its_decode_branch_meets_prefill_rows():
    """What a FULL graph captured on the all-decode dummy batch replays: the decode branch."""
    backend = get_backend("tests.backend.broken_backends:FrozenBranchBackend")
    config = make_config()
    step = make_step(config, [1, 6, 1], [20, 6, 9])
    builder, impl = backend.builder_cls(config), backend.impl_cls(config)
    md = builder.build(step.batch)
    md.max_query_len = 1  # the host value frozen at capture
    out = torch.zeros(8, config.num_heads, config.head_size, dtype=config.dtype)
    impl.forward(step.query, step.key, step.value, step.kv_cache, md, step.k_scale, step.v_scale, out)
    ref = reference_from_cache(step.query, step.kv_cache, step.batch, config.scale)
    assert (out[1:7] == 0).all(), "prefill rows unwritten"
    torch.testing.assert_close(out[[0, 7]].float(), ref[[0, 7]], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "name,message",
    [
        ("no_such_pkg.mod:Backend", "cannot import 'no_such_pkg.mod': No module named 'no_such_pkg'"),
        ("tests.backend.broken_backends:Missing", "module 'tests.backend.broken_backends' has no attribute 'Missing'"),
        (
            "tests.backend.broken_backends:NotABackend",
            "'tests.backend.broken_backends:NotABackend' is not an AttentionBackend subclass: missing builder_cls, impl_cls",
        ),
        ("tests.backend.broken_backends:not_a_class", "is not an AttentionBackend subclass: not a class"),
        ("flash-attn", "unknown backend 'flash-attn'"),
        ("", "empty backend name"),
    ],
)
def test_bad_backends_fail_with_one_line(name, message):
    with pytest.raises(BackendLoadError) as info:
        get_backend(name)
    text = str(info.value)
    assert message in text and "\n" not in text


def test_module_that_raises_on_import_is_a_load_error(tmp_path, monkeypatch):
    (tmp_path / "exploding_backend.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    monkeypatch.chdir(tmp_path)  # import paths resolve from the working directory
    with pytest.raises(BackendLoadError, match=r"^cannot import 'exploding_backend': boom$"):
        get_backend("exploding_backend:Backend")
