"""Small programs that show what a graph runner freezes, each ending in a verdict:

- "fresh": replay after changing inputs equals an eager run on the new inputs;
- "stale": replay shows the capture-time world (a frozen host value, an old buffer);
- "capture-error": capture itself failed (a host sync);
- "unverifiable": the emulation captured it but says it cannot vouch for the replay (the graph's
  `unverifiable` notes, backend/graphs/opaque.py); a real graph never gives it.

The emulated runner must give exactly EXPECTED on CPU; benchmarks/gpu_equivalence.py runs the same
table through real CUDA/HIP graphs, so the two runners are shown to freeze the same things.
Each program: build static state, warm up, capture, change the inputs the way a later step
would, compute the eager reference on the changed state, replay, compare. The state is built under
host_scope, as the session builds its builder and capture metadata: a host tensor is host memory
by how it is made (backend/graphs/provenance.py), unmarked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from backend.graphs.base import GraphCaptureError, GraphRunner
from backend.graphs.provenance import host_scope

Verdict = str  # "fresh" | "stale" | "capture-error" | "unverifiable"


@dataclass
class Instance:
    fn: Callable[[], torch.Tensor]  # the captured callable
    step: Callable[[], None]  # what a later step changes (inputs, host values)
    # eager result on the changed state, no side effects; None: no reference exists (random
    # numbers), and the verdict is "fresh" when two replays give different values, else "stale"
    reference: Callable[[], torch.Tensor] | None
    # Graphs captured before fn into the same pool, replayed after fn's replay and before its
    # output is read (vLLM captures every size into one pool): a later read sees what they wrote
    # where they share memory with fn's output.
    peers: tuple[Callable[[], object], ...] = ()
    # What is compared with the reference instead of fn's replayed output; it runs after step
    # (and, unless `replay` is False, after the replays): e.g. a tensor stashed during capture.
    observe: Callable[[], torch.Tensor] | None = None
    replay: bool = True  # False: observe reads before any replay
    copy_first: bool = False  # copy fn's output before the peers replay (the safe way to read it)
    own_pool: bool = False  # captured on a fresh runner (a fresh pool), not the corpus's shared one
    reset: Callable[[], None] | None = None  # between warm-up and capture (what the warm-up changed)


@dataclass(frozen=True)
class Program:
    name: str
    description: str
    build: Callable[[torch.device], Instance]


def _frozen_slice_bound(device: torch.device) -> Instance:
    x = torch.arange(8, dtype=torch.float32, device=device)
    out = torch.zeros(8, device=device)
    host = {"n": 3}  # e.g. a request count known on the host

    def fn():
        n = host["n"]
        out.zero_()
        out[:n].copy_(x[:n] * 2)
        return out

    def step():
        host["n"] = 6
        x.copy_(torch.arange(8, 16, dtype=torch.float32, device=device))

    def reference():
        r = torch.zeros(8, device=device)
        r[: host["n"]] = x[: host["n"]] * 2
        return r

    return Instance(fn, step, reference)


def _reallocated_buffer(device: torch.device) -> Instance:
    state = {"x": torch.ones(4, device=device)}

    def fn():
        return state["x"] * 2

    def step():
        state["x"] = torch.full((4,), 7.0, device=device)  # a builder allocating a new tensor

    return Instance(fn, step, lambda: state["x"] * 2)


def _inplace_update(device: torch.device) -> Instance:
    buf = torch.zeros(4, device=device)

    def fn():
        buf.add_(1)
        return buf

    def step():
        buf.fill_(5.0)

    return Instance(fn, step, lambda: buf + 1)


def _view_of_buffer(device: torch.device) -> Instance:
    base = torch.zeros(8, device=device)
    view = base[2:6]  # taken before capture, like metadata views of persistent buffers

    def fn():
        return view * 3

    def step():
        base.copy_(torch.arange(8, dtype=torch.float32, device=device))

    return Instance(fn, step, lambda: base[2:6] * 3)


def _host_sync(device: torch.device) -> Instance:
    x = torch.arange(4, dtype=torch.float32, device=device)
    scale = torch.ones(1, device=device)

    def fn():
        return x * scale.item()  # pa_decode's k_scale.item() pattern

    def step():
        scale.fill_(2.0)

    return Instance(fn, step, lambda: x * scale)


def _host_branch(device: torch.device) -> Instance:
    query_lens = torch.tensor([1, 1, 1])  # host-side batch description
    x = torch.arange(4, dtype=torch.float32, device=device)
    host = {"max_query_len": int(query_lens.max())}  # derived before capture, as a builder does

    def fn():
        if host["max_query_len"] > 1:  # the decode-only branch is taken at capture
            return x * 2 + 1
        return x * 2

    def step():
        query_lens.copy_(torch.tensor([1, 5, 1]))
        host["max_query_len"] = int(query_lens.max())

    return Instance(fn, step, lambda: x * 2 + 1 if host["max_query_len"] > 1 else x * 2)


PROGRAMS: tuple[Program, ...] = (
    Program("frozen_slice_bound", "out[:n] = x[:n]*2 with n a host int; n changes after capture", _frozen_slice_bound),
    Program("reallocated_buffer", "the input is rebound to a new tensor after capture", _reallocated_buffer),
    Program("inplace_update", "buf.add_(1) captured; buf set to 5 before replay", _inplace_update),
    Program("view_of_buffer", "a view taken before capture; its base updated in place", _view_of_buffer),
    Program("host_sync", "scale.item() inside the captured callable", _host_sync),
    Program("host_branch", "a Python branch on max_query_len, decode at capture, mixed later", _host_branch),
)

EXPECTED: dict[str, Verdict] = {
    "frozen_slice_bound": "stale",
    "reallocated_buffer": "stale",
    "inplace_update": "fresh",
    "view_of_buffer": "fresh",
    "host_sync": "capture-error",
    "host_branch": "stale",
}


def run_program(program: Program, runner: GraphRunner, device: torch.device | str) -> Verdict:
    with host_scope(device):
        inst = program.build(torch.device(device))
    if inst.own_pool:
        from backend.graphs.select import make_graph_runner

        runner = make_graph_runner(device)
    try:
        peers = []
        for peer in inst.peers:
            runner.warmup(peer, iters=1)
            peers.append(runner.capture(peer))
        runner.warmup(inst.fn, iters=1)
        if inst.reset is not None:
            inst.reset()
        graph = runner.capture(inst.fn)
    except GraphCaptureError:
        return "capture-error"
    if any(getattr(g, "unverifiable", ()) for g in (*peers, graph)):
        return "unverifiable"
    inst.step()
    if inst.reference is None:
        first = _first(graph.replay()).clone()
        second = _first(graph.replay())
        return "stale" if torch.equal(first.cpu(), second.cpu()) else "fresh"
    expected = inst.reference().clone()
    got = None
    if inst.replay:
        got = _first(graph.replay())
        if inst.copy_first:
            got = got.clone()
        for peer in peers:
            peer.replay()
    if inst.observe is not None:
        got = inst.observe()
    fresh = got.shape == expected.shape and torch.allclose(got.float().cpu(), expected.float().cpu())
    return "fresh" if fresh else "stale"


def _first(got: object) -> torch.Tensor:
    return got[0] if isinstance(got, (tuple, list)) else got


def run_all(runner: GraphRunner, device: torch.device | str) -> dict[str, Verdict]:
    return {p.name: run_program(p, runner, device) for p in PROGRAMS}
