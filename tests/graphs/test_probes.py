"""The probe corpus on the emulation gives the real-CUDA verdict of tests/graphs/golden_cuda.json,
or its stated conservative verdict (an error naming the construct), or its stated `unverifiable`
(the graph says what it could not follow), never a silent fresh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from backend.graphs import GraphCaptureError, make_graph_runner
from backend.graphs.equivalence import run_program
from backend.graphs.host import host_tensor, is_host, mark_host
from backend.graphs.provenance import host_scope
from tests.graphs.probes import CONSERVATIVE, HOST_WORK, PROGRAMS, ROUND_THREE, ROUND_TWO, UNVERIFIABLE

GOLDEN = json.loads((Path(__file__).parent / "golden_cuda.json").read_text())
BY_NAME = {p.name: p for p in PROGRAMS}


def test_corpus_is_large_and_golden_covers_it():
    assert len(PROGRAMS) >= 25 and len(BY_NAME) == len(PROGRAMS)
    assert set(GOLDEN["verdicts"]) == set(BY_NAME)
    assert set(GOLDEN["verdicts"].values()) == {"fresh", "stale", "capture-error"}
    assert set(CONSERVATIVE) <= set(BY_NAME) and set(UNVERIFIABLE) <= set(BY_NAME)
    # Verdicts reasoned from CUDA semantics, not yet recorded on a GPU (benchmarks/gpu_probes.py
    # records them and writes a golden file without this key); each says why.
    derived = GOLDEN.get("derived", {})
    assert set(derived) <= set(BY_NAME) and all(len(why) > 20 for why in derived.values())
    assert "derived" not in GOLDEN or "not yet recorded" in GOLDEN["derived_note"]
    # Round two: each behaviour of real graphs round two found has a probe, and a control beside it.
    kinds = {
        "host_compute_h2d",
        "pool_shared_output",
        "stash_read_before_replay",
        "linalg_info_check",
        "ctypes_launch",
        "out_resized_preexisting",
        "out_resized_in_capture",
        "bool_mask_setitem_scalar",
    }
    assert kinds <= {p.name for p in ROUND_TWO}
    # Round three: host compute in a custom op's body (the last silent probe), memory a per-call cache
    # evicts after capture, a host copy of a scale from the warm-up, a pointer taken without a launch.
    assert {
        "cpu_compute_in_capture",
        "cpu_compute_in_capture_pageable",
        "cache_entry_evicted",
        "cache_entry_kept",
        "host_float_from_warmup",
        "pointer_taken_no_launch",
    } == {p.name for p in ROUND_THREE}
    # Host tensors in device work inside the capture: each way a GPU treats them (a pageable index
    # copy refused, a 0-dim argument baked, host work run once), made without a device and as numpy
    # memory, beside the control that is fresh on a GPU.
    host_work = {p.name: GOLDEN["verdicts"][p.name] for p in HOST_WORK}
    assert set(host_work.values()) == {"capture-error", "stale", "fresh"}
    assert host_work["pinned_numpy_staging_refreshed"] == "fresh"


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_emulated_verdict_matches_golden(name):
    got = run_program(BY_NAME[name], make_graph_runner("cpu"), "cpu")
    if name in CONSERVATIVE:
        verdict, phrase = CONSERVATIVE[name]
        assert got == verdict
        inst = BY_NAME[name].build(torch.device("cpu"))
        with pytest.raises(GraphCaptureError, match=phrase):
            make_graph_runner("cpu").capture(inst.fn)
    elif name in UNVERIFIABLE:
        assert got == "unverifiable"
        with host_scope("cpu"):
            inst = BY_NAME[name].build(torch.device("cpu"))
        notes = make_graph_runner("cpu").capture(inst.fn).unverifiable
        assert notes and UNVERIFIABLE[name] in notes[0]
    else:
        assert got == GOLDEN["verdicts"][name]
    # The gate's worst case: fresh (safe) under emulation where a real graph is not.
    assert not (got == "fresh" and GOLDEN["verdicts"][name] != "fresh")


def test_host_marks_follow_host_ops_and_keep_pinned():
    from backend.graphs.host import is_pinned_host

    staging = host_tensor(torch.zeros(3), "cpu", pinned=True)
    lens = mark_host(torch.ones(3))
    dev = torch.zeros(3)
    out = {}

    def fn():
        staging.copy_(lens.cumsum(0))
        out["h"] = lens * 2
        dev.copy_(staging, non_blocking=True)
        return dev

    make_graph_runner("cpu").capture(fn)
    assert is_pinned_host(staging) and is_host(out["h"]) and not is_host(dev)
    assert torch.equal(staging, torch.tensor([1.0, 2.0, 3.0]))  # host work ran at capture, once
    assert torch.equal(dev, torch.zeros(3))  # device writes are not executed by a capture


def test_host_tensor_mixed_into_device_op_is_refused():
    h, x = mark_host(torch.ones(4)), torch.ones(4)
    with pytest.raises(GraphCaptureError, match="mixes host tensors with device tensors"):
        make_graph_runner("cpu").capture(lambda: x + h)


def test_d2h_of_a_host_tensor_and_tolist_are_allowed():
    h, x = mark_host(torch.arange(3.0)), torch.arange(3.0)
    graph = make_graph_runner("cpu").capture(lambda: x * len(h.cpu().tolist()))
    x.fill_(1)
    assert torch.equal(graph.replay(), torch.full((3,), 3.0))


TO_CALLS = {
    # (what .to() is given, is the tensor host memory) -> refused inside a capture
    "dtype only": (lambda t, h: t.to(torch.float64), False, False),
    "dtype kwarg": (lambda t, h: t.to(dtype=torch.float16), False, False),
    "a device tensor (same device)": (
        lambda t, h: t.to(torch.zeros(1, dtype=torch.float64, device=t.device)),
        False,
        False,
    ),
    "cpu string": (lambda t, h: t.to("cpu"), False, True),
    "cpu, copy=True": (lambda t, h: t.to("cpu", copy=True), False, True),
    "cpu, dtype, non_blocking, copy positional": (lambda t, h: t.to("cpu", torch.float64, False, True), False, True),
    "dtype, non_blocking, copy positional": (lambda t, h: t.to(torch.float64, False, True), False, False),
    "same-device x.device (conservative)": (lambda t, h: t.to(t.device), False, True),
    "non_blocking to cpu": (lambda t, h: t.to("cpu", non_blocking=True), False, True),
    "a host tensor": (lambda t, h: t.to(h), False, True),
    "host tensor to cpu": (lambda t, h: h.to("cpu"), True, False),
}


@pytest.mark.parametrize("name", TO_CALLS)
def test_to_cpu_of_a_device_tensor_is_a_d2h_copy(name):
    call, _, refused = TO_CALLS[name]
    x, h = torch.arange(3.0), mark_host(torch.zeros(3))

    def fn():
        return x * 2 + call(x, h).sum() * 0

    runner = make_graph_runner("cpu")
    if refused:
        with pytest.raises(GraphCaptureError, match=r"Tensor\.to\(.*\) copies device->host"):
            runner.capture(fn)
    else:
        runner.capture(fn)
    assert "to" not in torch.Tensor.__dict__  # the patch is undone after a capture, failed or not


def test_host_mark_lives_with_the_storage_not_the_marked_object():
    import gc

    alias = mark_host(torch.ones(4), pinned=True).detach()  # shares the storage, no ._base
    gc.collect()
    assert is_host(alias) and is_host(alias[1:].view(3, 1))
    from backend.graphs.host import is_pinned_host

    assert is_pinned_host(alias[2:])
    # Freed storage: a new tensor at a reused address is device memory.
    ptr = alias.untyped_storage().data_ptr()
    del alias
    gc.collect()
    fresh = [torch.empty(4) for _ in range(64)]
    assert not any(is_host(t) for t in fresh if t.untyped_storage().data_ptr() == ptr)
    assert not is_host(torch.ones(4)[1:])  # a view of a device tensor stays device
