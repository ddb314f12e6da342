"""The CPU graph emulation: replay equals eager on fresh inputs, and it freezes what a graph freezes."""

from __future__ import annotations

import math

import pytest
import torch

from backend.graphs import GraphCaptureError, make_graph_runner
from backend.graphs.emulated import EmulatedGraphRunner


@pytest.fixture
def runner():
    return EmulatedGraphRunner()


def test_make_graph_runner_on_cpu_is_emulated():
    assert make_graph_runner(torch.device("cpu")).kind == "emulated"
    assert make_graph_runner("cpu").kind == "emulated"


class _PagedDecode:
    """A small attention-like step over persistent buffers: gather K/V by block table, masked
    softmax by seq_lens, fp8 cache read with a live scale, output written into a static buffer."""

    def __init__(self, reqs=3, heads=2, dim=8, blocks=6, block_size=4, max_blocks=2):
        g = torch.Generator().manual_seed(0)
        self.q = torch.randn(reqs, heads, dim, generator=g)
        self.k_cache = torch.randn(blocks, block_size, heads, dim, generator=g).to(torch.float8_e4m3fn)
        self.v_cache = torch.randn(blocks, block_size, heads, dim, generator=g)
        self.k_scale = torch.ones(1)
        self.block_table = torch.tensor([[1, 2], [3, 0], [4, 5]], dtype=torch.int32)
        self.seq_lens = torch.tensor([7, 3, 8], dtype=torch.int32)
        self.out = torch.zeros(reqs, heads, dim)
        self.block_size, self.max_blocks, self.dim = block_size, max_blocks, dim

    def __call__(self):
        bt = self.block_table.long()
        k = self.k_cache[bt].float() * self.k_scale  # [reqs, max_blocks, block, heads, dim]
        v = self.v_cache[bt]
        k = k.flatten(1, 2)  # [reqs, ctx, heads, dim]
        v = v.flatten(1, 2)
        scores = torch.einsum("rhd,rchd->rhc", self.q, k) / math.sqrt(self.dim)
        pos = torch.arange(self.max_blocks * self.block_size, device=self.q.device)
        mask = pos[None, :] < self.seq_lens[:, None].long()  # [reqs, ctx]
        scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        self.out.copy_(torch.einsum("rhc,rchd->rhd", scores.softmax(-1), v))
        return self.out


def test_attention_like_step_replays_equal_to_eager_with_fresh_inputs(runner):
    step = _PagedDecode()
    runner.warmup(step)
    graph = runner.capture(step)
    g = torch.Generator().manual_seed(1)
    for seq_lens, table, scale in [
        ([2, 5, 8], [[5, 4], [1, 0], [2, 3]], 0.5),
        ([8, 1, 4], [[1, 3], [2, 4], [5, 0]], 2.0),
    ]:
        step.q.copy_(torch.randn(step.q.shape, generator=g))
        step.v_cache.copy_(torch.randn(step.v_cache.shape, generator=g))
        step.k_cache.copy_(torch.randn(step.k_cache.shape, generator=g).to(torch.float8_e4m3fn))
        step.seq_lens.copy_(torch.tensor(seq_lens))
        step.block_table.copy_(torch.tensor(table))
        step.k_scale.fill_(scale)
        got = graph.replay().clone()
        assert got.data_ptr() != step.out.data_ptr() and graph.outputs is step.out
        expected = step().clone()
        assert torch.equal(got, expected)


def test_replay_returns_same_output_object_and_is_overwritten(runner):
    x = torch.ones(3)
    graph = runner.capture(lambda: x * 2)
    first = graph.replay()
    x.fill_(5)
    second = graph.replay()
    assert first is second and torch.equal(first, torch.full((3,), 10.0))


def test_inplace_out_and_view_ops(runner):
    base = torch.zeros(6)
    acc = torch.zeros(3)
    out = torch.empty(6)
    view = base[1:4]  # view taken before capture

    def fn():
        acc.add_(view)  # in-place op on a pre-existing buffer
        torch.mul(base, 3, out=out)  # out= variant
        tail = out.view(2, 3)[1]  # view created during capture, of a captured output
        return acc, tail * 1

    graph = runner.capture(fn)
    base.copy_(torch.arange(6.0))
    acc.fill_(100)
    acc_out, tail = graph.replay()
    assert acc_out is acc and torch.equal(acc, torch.tensor([101.0, 102.0, 103.0]))
    assert torch.equal(out, torch.arange(6.0) * 3) and torch.equal(tail, torch.tensor([9.0, 12.0, 15.0]))
    graph.replay()
    assert torch.equal(acc, torch.tensor([102.0, 104.0, 106.0]))  # every replay runs it again


def test_capture_does_not_mutate_pre_existing_tensors_like_a_gpu(runner):
    buf = torch.zeros(4)
    kv = torch.zeros(2, 4)

    def fn():
        buf.add_(1)
        kv[0].copy_(buf)  # write through a view created during capture
        return buf

    runner.capture(fn)
    assert torch.equal(buf, torch.zeros(4)) and torch.equal(kv, torch.zeros(2, 4))


def test_host_scalars_and_shapes_are_frozen(runner):
    x = torch.arange(8.0)
    host = {"n": 2, "scale": 3.0}
    graph = runner.capture(lambda: x[: host["n"]] * host["scale"])
    host.update(n=5, scale=10.0)
    x.add_(1)
    assert torch.equal(graph.replay(), torch.tensor([3.0, 6.0]))  # old n and scale, new data


def test_fp8_conversion_and_random_ops_replay(runner):
    x = torch.randn(16)
    noise_src = {}

    def fn():
        q = x.to(torch.float8_e4m3fn)
        noise_src["n"] = torch.randn(4, device=x.device)  # device memory: a torch.device names it
        return q.float(), noise_src["n"]

    graph = runner.capture(fn)
    x.copy_(torch.linspace(-2, 2, 16))
    deq, noise = graph.replay()
    assert torch.equal(deq, torch.linspace(-2, 2, 16).to(torch.float8_e4m3fn).float())
    before = noise.clone()
    graph.replay()
    assert not torch.equal(before, noise)  # documented: random ops draw again at each replay


HOST_SYNCS = {
    "item": lambda x: x.sum().item(),
    "float": lambda x: float(x[0]),
    "python_if": lambda x: x * 2 if x.sum() > 0 else x,
    "nonzero": lambda x: torch.nonzero(x),
    "bool_mask_index": lambda x: x[x > 0],
    "bool_mask_assign_tensor": lambda x: x.__setitem__(x > 0, x[:1]),  # a device value: index_put_, nonzero
    "masked_select": lambda x: torch.masked_select(x, x > 0),
    "unique": lambda x: torch.unique(x),
    "tolist": lambda x: x.tolist(),
    "repeat_interleave": lambda x: torch.repeat_interleave(x.long()),
    "repeat_interleave_self": lambda x: x.repeat_interleave(x.long()),
}


@pytest.mark.parametrize("name", sorted(HOST_SYNCS))
def test_host_sync_in_capture_raises_and_runner_stays_usable(runner, name):
    x = torch.arange(4.0)
    with pytest.raises(GraphCaptureError, match="host sync during graph capture"):
        runner.capture(lambda: HOST_SYNCS[name](x))
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]  # tolist is restored after the failed capture
    graph = runner.capture(lambda: x + 1)
    x.fill_(1)
    assert torch.equal(graph.replay(), torch.full((4,), 2.0))


def test_graph_safe_alternatives_capture(runner):
    x = torch.arange(4.0)
    y = torch.zeros(4)

    def fn():
        y.copy_(x)
        y[x > 2] = 7.0  # a boolean mask with a scalar: masked_fill_ on a GPU, no sync
        return torch.where(x > 1, x, torch.zeros_like(x)) + x.masked_fill(x < 1, 5.0) + y

    graph = runner.capture(fn)
    x.copy_(torch.tensor([3.0, 0.0, 2.0, 1.0]))
    assert torch.equal(graph.replay(), torch.tensor([13.0, 5.0, 6.0, 2.0]))


def test_other_capture_failure_is_wrapped(runner):
    def broken():
        raise KeyError("missing buffer")

    with pytest.raises(GraphCaptureError, match="KeyError"):
        runner.capture(broken)


def test_flex_attention_hop_is_recorded_through_its_dense_implementation(runner):
    """The flex_attention HOP (vLLM's FLEX_ATTENTION run eagerly on CPU) replays with live mask
    tensors and a live query. Its dense path upcasts bf16 with `to.dtype`, whose schema marks a
    possible alias: treated as a view, the replay reused the capture's query (a false red on
    every FULL cell of vllm:FLEX_ATTENTION)."""
    import torch.nn.attention.flex_attention as fa
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    old = fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True  # eager flex without its torch.compile wrapper
    try:
        doc, lens = torch.tensor([0, 1, 2, 3]), torch.tensor([2, 3, 4, 5])

        def mask(b, h, q, kv):
            return kv < lens[doc[q]]

        bm = BlockMask.from_kv_blocks(
            torch.ones(1, 1, 1, dtype=torch.int32),
            torch.zeros(1, 1, 1, 1, dtype=torch.int32),
            BLOCK_SIZE=(16, 16),
            mask_mod=mask,
            seq_lengths=(4, 8),
            compute_q_blocks=False,
        )
        q, k, v = (torch.randn(1, 1, n, 8, dtype=torch.bfloat16) for n in (4, 8, 8))
        out = torch.zeros(1, 1, 4, 8, dtype=torch.bfloat16)

        def fn():
            out.copy_(flex_attention(q, k, v, block_mask=bm))
            return out

        runner.warmup(fn, 1)
        graph = runner.capture(fn)
        lens.copy_(torch.tensor([5, 6, 7, 8]))
        doc.copy_(torch.tensor([3, 2, 1, 0]))
        q.copy_(torch.randn(1, 1, 4, 8, dtype=torch.bfloat16))
        graph.replay()
        replayed = out.clone()
        fn()
        assert torch.equal(replayed, out)
    finally:
        fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = old


def test_capture_does_not_import_dynamo():
    """The recorder opts out of TorchDispatchMode's Dynamo guard: importing torch._dynamo cost
    every worker process 1.5-4.4 s at its first capture on the 2-core machine."""
    import subprocess
    import sys
    from pathlib import Path

    probe = (
        "import sys, torch\n"
        "from backend.graphs.emulated import EmulatedGraphRunner\n"
        "x = torch.randn(4, 4)\n"
        "g = EmulatedGraphRunner().capture(lambda: (x * 2).float().sum(0))\n"
        "x.fill_(1.0)\n"
        "assert torch.equal(g.replay(), torch.full((4,), 8.0))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
