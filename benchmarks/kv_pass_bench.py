"""What one whole-cache pass of the kv check costs on this device, and what a per-slot digest would
cost instead: the measure behind replacing the step's whole-cache snapshot and comparison
(docs/BENCHMARKS.md, issue 45: the largest device item of a small case).

    PYTHONPATH=$PWD python benchmarks/kv_pass_bench.py [--slots 524288] [--row-bytes 2048] [--planes 2]

One layer of full.yaml's GPU cache by default (32768 blocks x 16 slots; K and V planes of 8 heads x
128 bf16: 2.15 GB). Times, each the mean of 10 after a warm-up: the snapshot's copy, the check's
equality (`(a == b).all()` on int64 words, as checks.equal_many does), a per-slot digest with torch
ops (int32 words x weights, summed per slot in int64: exact, no overflow below 4096 words a slot),
and the same digest as one Triton kernel where Triton runs (a GPU). Prints one line each, with the
bandwidth it reached (bytes read and written over the time).
"""

from __future__ import annotations

import argparse
import functools
import time

import torch


def timed(fn, device: torch.device, n: int = 10) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / n


def weights(planes: int, words: int, device: torch.device) -> torch.Tensor:
    """Odd 20-bit weights: a word's change moves its slot's sum by a non-zero multiple."""
    gen = torch.Generator().manual_seed(0)
    return (torch.randint(0, 1 << 19, (planes, words), generator=gen, dtype=torch.int64) * 2 + 1).to(device)


def digest_torch(rows: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """rows [planes, slots, words] int32 -> [slots] int64."""
    return sum((rows[p].to(torch.int64) * w[p]).sum(dim=-1) for p in range(rows.shape[0]))


@functools.cache
def _digest_kernel():
    """The Triton kernel, made once (a @triton.jit made per call compiles per call: its timing
    would be the compile). Triton is imported only here: a CPU box has none."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x, wp, out, n, sp, ss, P: tl.constexpr, W: tl.constexpr, BW: tl.constexpr, BS: tl.constexpr):
        s = tl.program_id(0) * BS + tl.arange(0, BS)
        c = tl.arange(0, BW)
        m = (s[:, None] < n) & (c[None, :] < W)
        acc = tl.zeros([BS], dtype=tl.int64)
        for p in range(P):
            v = tl.load(x + p * sp + s[:, None] * ss + c[None, :], mask=m, other=0).to(tl.int64)
            k = tl.load(wp + p * W + c, mask=c < W, other=0)
            acc += tl.sum(v * k[None, :], axis=1)
        tl.store(out + s, acc, mask=s < n)

    return triton, kernel


def digest_triton(rows: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    triton, kernel = _digest_kernel()
    planes, slots, words = rows.shape
    out = torch.empty(slots, dtype=torch.int64, device=rows.device)
    bs = 8
    kernel[(triton.cdiv(slots, bs),)](
        rows, w, out, slots, rows.stride(0), rows.stride(1), planes, words, triton.next_power_of_2(words), bs
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=32768 * 16)
    ap.add_argument("--row-bytes", type=int, default=8 * 128 * 2)
    ap.add_argument("--planes", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    words = args.row_bytes // 4
    a = torch.randint(-(1 << 31), (1 << 31) - 1, (args.planes, args.slots, words), dtype=torch.int32, device=device)
    b = a.clone()
    w = weights(args.planes, words, device)
    size = a.numel() * 4
    print(f"{device}: one layer {size / 1e9:.2f} GB ({args.planes} planes x {args.slots} slots x {args.row_bytes} B)")
    runs = [
        ("snapshot copy", lambda: b.copy_(a), 2 * size),
        ("equality (a == b).all(), int64", lambda: (a.view(torch.int64) == b.view(torch.int64)).all(), 2 * size),
        ("digest, torch ops", lambda: digest_torch(a, w), size),
    ]
    if device.type == "cuda":
        try:
            same = torch.equal(digest_triton(a, w), digest_torch(a, w))
            runs.append((f"digest, one Triton kernel (equals torch's: {same})", lambda: digest_triton(a, w), size))
        except Exception as e:  # a benchmark: say why and go on
            print(f"digest, Triton: {type(e).__name__}: {e}")
    for name, fn, moved in runs:
        s = timed(fn, device)
        print(f"  {s * 1e3:8.2f} ms  {moved / s / 1e12:5.2f} TB/s  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
