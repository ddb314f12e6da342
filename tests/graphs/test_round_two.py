"""The emulation's mechanisms one by one (the probes in probes.py show them against real
graphs): host memory found by how it is made, the shared pool and its uninitialised memory, ctypes
launches, and what is refused or rewritten as a GPU would."""

from __future__ import annotations

import ctypes
import itertools
import math

import pytest
import torch

from backend.graphs import GraphCaptureError, make_graph_runner
from backend.graphs.host import is_host, is_pinned_host
from backend.graphs.provenance import host_scope


def test_host_memory_is_found_by_how_it_was_made_without_marks():
    dev = torch.device("cpu")  # the emulated device, named as the session names it
    with host_scope(dev):
        made = {
            "no device": torch.zeros(3),
            "python data": torch.tensor([1, 2]),
            "cpu string": torch.ones(2, device="cpu"),
            "pinned": torch.empty(4, pin_memory=True),
            "device object": torch.zeros(3, device=dev),
        }
        d = torch.arange(4.0, device=dev)
        made.update(
            {
                "cpu() of device": d.cpu(),
                ".to('cpu') of device": d.to("cpu"),
                "host op result": made["no device"].cumsum(0),
                "like a host tensor": torch.zeros_like(made["no device"]),
                "device op result": d * 2,
            }
        )
        h = made["python data"]
        made["to(device) of host"] = h.to(dev)
    host = {name for name, t in made.items() if is_host(t)}
    assert host == {
        "no device",
        "python data",
        "cpu string",
        "pinned",
        "cpu() of device",
        ".to('cpu') of device",
        "host op result",
        "like a host tensor",
    }
    assert is_pinned_host(made["pinned"]) and made["pinned"].is_pinned() is False  # outside the scope: torch's answer
    # Copies where a GPU copies: the host tensor is not aliased by its device copy, nor the reverse.
    assert made["to(device) of host"].data_ptr() != h.data_ptr()
    assert made["cpu() of device"].data_ptr() != d.data_ptr()
    assert not is_host(torch.zeros(2))  # outside a scope nothing is classified


def test_host_work_on_unmarked_host_tensors_runs_once_at_capture():
    runner = make_graph_runner("cpu")
    with host_scope("cpu"):
        lens = torch.tensor([1, 2, 3])
        out = torch.zeros(3, dtype=torch.int64, device=torch.device("cpu"))

    kept = []

    def fn():
        kept.append(lens.cumsum(0).pin_memory())  # host work; the staging outlives the capture
        out.copy_(kept[-1], non_blocking=True)  # the graph's H2D copy
        return out

    graph = runner.capture(fn)
    lens.fill_(10)
    assert graph.replay().tolist() == [1, 3, 6]  # the capture's one result, copied again
    # The same staging dropped after the capture: the copy node reads freed pinned memory.
    kept.clear()
    assert graph.replay().tolist() != [1, 3, 6] and "reads memory nothing kept alive" in graph.freed_reads[0]


def test_a_non_blocking_h2d_copy_of_pageable_host_memory_fails_capture():
    # as recorded on an H100 with torch 2.11 (golden_cuda.json: pageable_h2d_nonblocking)
    with host_scope("cpu"):
        host, dev = torch.ones(3), torch.zeros(3, device=torch.device("cpu"))
    with pytest.raises(GraphCaptureError, match="pageable"):
        make_graph_runner("cpu").capture(lambda: dev.copy_(host, non_blocking=True))


def test_a_blocking_h2d_copy_of_unmarked_host_memory_fails_capture():
    with host_scope("cpu"):
        host, dev = torch.ones(3), torch.zeros(3, device=torch.device("cpu"))
    with pytest.raises(GraphCaptureError, match="blocking host->device copy"):
        make_graph_runner("cpu").capture(lambda: dev.copy_(host))


def test_live_outputs_of_a_pool_never_share_memory_and_every_replay_is_right():
    """The pool reuses only what nobody holds: many graphs whose outputs are kept, captured into
    one pool, each replayed after all the others, each still right."""
    runner = make_graph_runner("cpu")
    x = torch.arange(1.0, 65.0)
    graphs = []
    for i in range(1, 9):

        def fn(i=i):
            t = (x * i).sin()  # temporaries the next captures may be given
            u = t * 2
            return u + i

        graphs.append((i, runner.capture(fn)))
    x.add_(1)
    for _, g in graphs:
        g.replay()
    for i, g in graphs:
        assert torch.allclose(g.outputs, (x * i).sin() * 2 + i), i
    live = list(runner.pool._live.values())
    spans = sorted((b.start, b.end) for b in live)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))


def test_a_freed_temporary_is_given_to_the_next_capture_and_its_replay_writes_there():
    runner = make_graph_runner("cpu")
    x = torch.arange(1.0, 5.0)

    def peer():
        t = x * 3
        return t.sum().reshape(1)

    peer_graph = runner.capture(peer)
    graph = runner.capture(lambda: x * 2)
    x.fill_(1.0)
    out = graph.replay()
    kept = out.clone()
    peer_graph.replay()
    assert torch.equal(kept, torch.full((4,), 2.0)) and torch.equal(out, torch.full((4,), 3.0))


def test_memory_a_capture_allocated_holds_nothing_computed_until_a_replay():
    runner = make_graph_runner("cpu")
    x = torch.arange(4.0)
    stash = {}

    def fn():
        stash["y"] = x + 1
        return stash["y"] * 2

    graph = runner.capture(fn)
    assert all(math.isnan(v) for v in stash["y"].tolist() + graph.outputs.tolist())
    graph.replay()
    assert stash["y"].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_a_ctypes_call_on_host_memory_is_host_work_and_runs_once():
    memset = ctypes.CDLL(None).memset
    memset.argtypes, memset.restype = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t], ctypes.c_void_p
    with host_scope("cpu"):
        host = torch.zeros(4, dtype=torch.uint8)
    x = torch.ones(4, dtype=torch.uint8)
    graph = make_graph_runner("cpu").capture(lambda: (memset(host.data_ptr(), 7, 4), x + 1)[1])
    assert host.tolist() == [7] * 4 and graph.unverifiable == ()  # ran at capture, nothing escaped
    host.zero_()
    graph.replay()
    assert host.tolist() == [0] * 4  # not replayed: host work


def test_a_device_pointer_given_to_ctypes_is_replayed_and_restored_after_capture():
    memcpy = ctypes.CDLL(None).memcpy
    memcpy.argtypes, memcpy.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t], ctypes.c_void_p
    x, out = torch.arange(4.0), torch.full((4,), -1.0)
    graph = make_graph_runner("cpu").capture(lambda: (memcpy(out.data_ptr(), x.data_ptr(), 16), out)[1])
    assert out.tolist() == [-1.0] * 4  # a capture executes nothing: the write is undone
    x.add_(10)
    graph.replay()
    assert out.tolist() == [10.0, 11.0, 12.0, 13.0] and graph.unverifiable == ()


def test_out_resized_inside_capture_is_restored_and_replays():
    x, buf = torch.arange(4.0), torch.empty(0)
    graph = make_graph_runner("cpu").capture(lambda: torch.mul(x, 3, out=buf))
    assert buf.shape == (4,)  # the resize is host work a GPU also does at capture
    x.fill_(2.0)
    assert graph.replay().tolist() == [6.0] * 4


@pytest.mark.parametrize("call", ["cholesky", "inv", "solve"])
def test_linalg_error_checks_fail_capture_and_the_ex_forms_capture(call):
    a = torch.eye(3) * 4
    checked = {
        "cholesky": lambda: torch.linalg.cholesky(a),
        "inv": lambda: torch.linalg.inv(a),
        "solve": lambda: torch.linalg.solve(a, a[0]),
    }[call]
    with pytest.raises(GraphCaptureError, match="_linalg_check_errors"):
        make_graph_runner("cpu").capture(checked)
    ex = {
        "cholesky": lambda: torch.linalg.cholesky_ex(a).L,
        "inv": lambda: torch.linalg.inv_ex(a).inverse,
        "solve": lambda: torch.linalg.solve_ex(a, a[0]).result,
    }[call]
    graph = make_graph_runner("cpu").capture(ex)
    a.mul_(4)
    assert torch.allclose(graph.replay(), ex())
