"""The torch provider's gather + attention at the matrix's shapes, timed.

    PYTHONPATH=$PWD python benchmarks/torch_attention_bench.py [--against OLD_torch_ops.py]

Runs backend/providers/torch_ops.py's gather_paged + masked_attention over random paged caches,
chunked as the provider chunks them, at the GPU shapes of full.yaml (mixed_large_chunked: 404
tokens over 4096 positions; decode_200 at 4096 positions, what a FULL replay gathers, and at 2048)
on a GPU, or the CPU shapes on the CPU. `--against` loads another version of torch_ops.py (e.g.
`git show REV:backend/providers/torch_ops.py > old.py`) and prints its time and the largest
difference of its output from this one's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from backend.providers import torch_ops

GPU_SHAPES = [
    (404, 32, 8, 128, 4096, torch.bfloat16),
    (404, 32, 8, 128, 4096, torch.float8_e4m3fn),
    (200, 32, 8, 128, 4096, torch.bfloat16),
    (200, 32, 8, 128, 2048, torch.bfloat16),
]
CPU_SHAPES = [
    (64, 8, 2, 16, 512, torch.bfloat16),
    (256, 8, 2, 16, 512, torch.bfloat16),
    (256, 8, 2, 16, 512, torch.float8_e4m3fn),
]


def _load(path: str):
    spec = importlib.util.spec_from_file_location("torch_ops_against", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    impls = [("this", torch_ops)] + ([("against", _load(args.against))] if args.against else [])
    torch.manual_seed(0)
    for c, h, hkv, d, length, dt in GPU_SHAPES if dev == "cuda" else CPU_SHAPES:
        blocks = c * length // 16 + 64
        cache = torch.randn(blocks, 16, hkv, d, device=dev).to(dt)
        rows = torch.randperm(blocks, device=dev)[: c * (length // 16)].view(c, length // 16).int()
        q = torch.randn(c, h, d, device=dev).bfloat16()
        limit = torch.randint(0, length, (c,), device=dev)
        limit[0] = -1  # a row that attends nothing
        mask = torch.arange(length, device=dev)[None] <= limit[:, None]
        scale = None if dt == torch.bfloat16 else torch.tensor(0.5, device=dev)
        per = max(1, torch_ops.CHUNK_BYTES // (length * hkv * d * 8 + h * length * 12))
        outs = {}
        for name, mod in impls:

            def run():
                out = []
                for s in range(0, c, per):
                    k = mod.gather_paged(cache, rows[s : s + per], length, scale)
                    v = mod.gather_paged(cache, rows[s : s + per], length, scale)
                    out.append(mod.masked_attention(q[s : s + per], k, v, mask[s : s + per], 0.1))
                return torch.cat(out)

            outs[name] = run()
            if dev == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(args.repeat):
                run()
            if dev == "cuda":
                torch.cuda.synchronize()
            ms = (time.perf_counter() - t) / args.repeat * 1000
            print(f"{name:8s} tokens {c} heads {h}/{hkv} d {d} positions {length} {str(dt)[6:]:14s} {ms:8.2f} ms")
        if "against" in outs:
            print(f"         max |this - against| = {(outs['this'] - outs['against']).abs().max().item():.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
