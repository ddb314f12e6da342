"""How much of a row's softmax mass the swa_sinks sinks carry, and how far two sink bugs move a
head's output against the per-head tolerance, at the CPU and GPU shapes of matrices/full.yaml and at
every context its swa_sinks batches use (with sinks near N(0, 1) a sink counted twice
moved a head 2.5-3.6% at 100 keys, inside the ~4% threshold).

    python benchmarks/sink_share.py [--markdown]     # CPU only, ~10 s

Per (shape, keys a row attends): a decode row's query and its keys/values drawn ~N(0, 1) as the
checker's step inputs are, every head attended by backend.families.swa_sinks.reference_window_sinks
with the model's sinks, with the sinks of two broken kernels (counted twice: sink + ln 2; added as
exp2(sink) without the log2(e) conversion: sink * ln 2), and with the sinks drawn as they were before. Per
head: the sink's share of the mass, and the RMS error relative to the head's RMS next to the
attn_reference threshold (atol * the row's mean head RMS + rtol * the head's RMS, over the head's
RMS), bf16 tolerances 2e-2 / 2e-2.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from backend.families.swa_sinks import reference_window_sinks, sink_logits

ATOL = RTOL = 2e-2
BUGS = {"twice": lambda s: s + math.log(2), "no_exp2": lambda s: s * math.log(2)}


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    num_heads: int
    num_kv_heads: int
    head_size: int
    window: int
    max_model_len: int
    dtype: str = "bfloat16"


def contexts(device_class: str) -> tuple[Shape, list[int]]:
    """The family's shape and every sequence length its batches in matrices/full.yaml use."""
    from orchestrator.matrix import load_matrix

    m = load_matrix("matrices/full.yaml", devices=device_class, backend_checks=False)
    cases = [c for c in (*m.cases, *(s.case for s in m.skipped)) if c.attention == "swa_sinks"]
    model = cases[0].model
    dims = dict(model.dims)
    shape = Shape(
        device_class,
        model.num_heads,
        model.num_kv_heads,
        model.head_size,
        dims["sliding_window"],
        model.max_model_len,
        model.dtype,
    )
    return shape, sorted({s for c in cases for s in c.batch.seq_lens})


def measure(shape: Shape, n: int, window: int | None, sinks: torch.Tensor, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed * 7919 + n)
    q = torch.randn(1, shape.num_heads, shape.head_size, generator=gen)
    k = torch.randn(n, shape.num_kv_heads, shape.head_size, generator=gen)
    v = torch.randn(n, shape.num_kv_heads, shape.head_size, generator=gen)
    scale = shape.head_size**-0.5
    ok = reference_window_sinks(q, k, v, scale, window, sinks)[0]  # [H, D]
    rms = ok.pow(2).mean(-1).sqrt()
    threshold = (ATOL * rms.mean() + RTOL * rms) / rms
    rep = k.repeat_interleave(shape.num_heads // shape.num_kv_heads, dim=1)
    scores = torch.einsum("hd,shd->hs", q[0], rep) * scale
    if window is not None:
        scores = scores[:, -window:]
    share = torch.exp(sinks) / (torch.exp(sinks) + torch.exp(scores).sum(-1))
    out = {"share": share, "threshold": threshold}
    for bug, wrong in BUGS.items():
        o = reference_window_sinks(q, k, v, scale, window, wrong(sinks))[0]
        out[bug] = (o - ok).pow(2).mean(-1).sqrt() / rms
    return out


def table(device_class: str, pick=None) -> list[dict]:
    """Rows of the table for one shape; `pick(lens) -> lens` narrows the contexts (the test's)."""
    shape, lens = contexts(device_class)
    lens = pick(lens) if pick is not None else lens
    gen = torch.Generator().manual_seed(11)
    drawn = torch.randn(shape.num_heads, generator=gen).to(getattr(torch, shape.dtype)).float()
    now = sink_logits(shape, drawn)
    rows = []
    for n in lens:
        for kind, window in (("window", shape.window), ("full", None)):
            if kind == "window" and n <= shape.window:
                continue  # the same keys as the full layer
            keys = min(n, shape.window) if window else n
            for label, sinks in (("before", drawn), ("now", now)):
                m = measure(shape, n, window, sinks)
                rows.append(
                    {
                        "shape": device_class,
                        "seq_len": n,
                        "layer": kind,
                        "keys": keys,
                        "sinks": label,
                        "share_max": float(m["share"].max()),
                        "share_median": float(m["share"].median()),
                        "heads_20_80": int(((m["share"] > 0.2) & (m["share"] < 0.8)).sum()),
                        "threshold": float(m["threshold"].median()),
                        **{f"{bug}_worst": float(m[bug].max()) for bug in BUGS},
                        **{f"{bug}_heads_red": int((m[bug] > m["threshold"]).sum()) for bug in BUGS},
                        "heads": shape.num_heads,
                    }
                )
    return rows


def markdown(rows: list[dict]) -> str:
    out = [
        "| shape | seq_len | layer (keys) | sinks | sink share: max / median, heads at 20-80% | worst head error: "
        "twice / no exp2 (heads over the threshold) | threshold |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['shape']} | {r['seq_len']} | {r['layer']} ({r['keys']}) | {r['sinks']} | "
            f"{r['share_max']:.1%} / {r['share_median']:.1%}, {r['heads_20_80']}/{r['heads']} | "
            f"{r['twice_worst']:.1%} / {r['no_exp2_worst']:.1%} ({r['twice_heads_red']} / "
            f"{r['no_exp2_heads_red']} of {r['heads']}) | {r['threshold']:.1%} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args(argv)
    rows = [r for dc in ("cpu", "gpu") for r in table(dc)]
    if args.markdown:
        print(markdown(rows), end="")
    else:
        for r in rows:
            print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
