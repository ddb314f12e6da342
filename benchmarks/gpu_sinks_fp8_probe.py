"""vLLM TRITON_ATTN with an fp8 KV cache, an fp8 query and attention sinks, outside orch: the kernel
call alone (`vllm.v1.attention.ops.triton_unified_attention.unified_attention`, as
`TritonAttentionImpl.forward` makes it) against an fp32 computation of the same rounded inputs.

    python3 benchmarks/gpu_sinks_fp8_probe.py --out $OUT/sinks_fp8_probe.json   # a CUDA GPU, vllm importable
    python3 benchmarks/gpu_sinks_fp8_probe.py --devices cpu                       # the arithmetic model only

Why: orch's swa_sinks cells of vllm:TRITON_ATTN fail `attn_reference` at kv fp8 (every mode, NONE
too) since its sinks carry 20-80% of a row's mass, while orch's torch provider passes the same
cells. Read in vLLM 0.34.0: the online softmax starts its running max M at the head's sink
(`init_softmax_M`), so P = exp(S - M) <= exp(max S - sink); with an fp8 query the kernel runs
P @ V on fp8 tensor cores as `(P * 256).to(e4m3) @ V / 256`, a scale chosen for max P = 1. Once a
sink exceeds a row's largest score by more than ~ln(256 / 2^-6) - ln(1) = 9.7 (less for the
tail), P falls into e4m3's subnormal range, where the relative rounding grows from 2^-4 to 100%.
One prefill sequence, gpt-oss's head shape (64 query heads, 8 KV heads, head dim 64), logits
~N(0, 1), a constant sink per run; for each sink: the kernel with an fp8 query (vLLM's fp8
path), the kernel with a bf16 query (K/V dequantised in the tile, P in bf16), and a torch model
of the fp8 P rounding. Per (row, head): RMS error over the head's RMS, and orch's attn_reference
rule (bad when rms(err) > atol * s + rtol * rms(ref), s the row's mean head RMS, fp8 2e-2 / 5e-2).

Exit 0 when the finding holds (the fp8-query error grows with the sink past orch's threshold
while the bf16-query error stays under it, and the torch model of P's rounding reproduces the
growth), 1 otherwise, 3 without a GPU or vllm (unless --devices cpu).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HEADS, KV_HEADS, D, BLOCK = 64, 8, 64, 16
ATOL, RTOL = 2e-2, 5e-2  # orch's fp8 attn_reference tolerance (docs/CHECKER.md)
E4M3 = None


def quantise(x, dtype):
    """Per-tensor fp8 as vLLM's layer does it: scale = amax / fp8 max; returns (fp8, scale)."""
    import torch

    scale = x.float().abs().amax().clamp(min=1e-12) / torch.finfo(dtype).max
    return (x.float() / scale).to(dtype), scale


def inputs(seq_len: int, query_len: int, device: str, seed: int = 0):
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(query_len, HEADS, D, generator=g).to(device, torch.bfloat16)
    k = torch.randn(seq_len, KV_HEADS, D, generator=g).to(device, torch.bfloat16)
    v = torch.randn(seq_len, KV_HEADS, D, generator=g).to(device, torch.bfloat16)
    return q, k, v


def sink_values(text: str, device):
    """A constant sink for every head ("8"), none ("none"), or "orch": orch's swa_sinks draw for
    gpt-oss's GPU shape (0.5 + ln n_h, n_h log-uniform from 8 to 4096 keys over the heads), the
    sinks under which the matrix's cells failed."""
    import torch

    if text == "none":
        return None
    if text == "orch":
        from types import SimpleNamespace

        from backend.families.swa_sinks import sink_logits

        shape = SimpleNamespace(num_heads=HEADS, max_model_len=4096, dtype="bfloat16")
        return sink_logits(shape, torch.zeros(HEADS)).to(device)
    return torch.full((HEADS,), float(text), device=device)


def reference(q, k, v, sink, context: int):
    """fp32 softmax attention, causal (query i at absolute position context + i), the sink one more
    logit in the denominator per head; q [Q, H, D], k/v [L, Hkv, D] already dequantised."""
    import torch

    qf, kf, vf = q.float(), k.float(), v.float()
    rep = HEADS // KV_HEADS
    kf, vf = kf.repeat_interleave(rep, dim=1), vf.repeat_interleave(rep, dim=1)
    s = torch.einsum("qhd,khd->hqk", qf, kf) * D**-0.5
    pos_q = torch.arange(q.shape[0], device=q.device)[:, None] + context
    pos_k = torch.arange(k.shape[0], device=q.device)[None, :]
    s = s.masked_fill(pos_k > pos_q, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.view(-1, 1, 1).expand(-1, s.shape[1], 1)], dim=-1)
    p = torch.softmax(s, dim=-1)
    if sink is not None:
        p = p[..., :-1]
    return torch.einsum("hqk,khd->qhd", p, vf), s


def model_fp8_p(q, k, v, sink, context: int, fp8):
    """The kernel's arithmetic in torch: P = exp(S - M), M the row max over scores and sink, P @ V
    with P rounded as (P * 256).to(e4m3) / 256, the denominator (L) in fp32."""
    import torch

    qf, kf, vf = q.float(), k.float(), v.float()
    rep = HEADS // KV_HEADS
    kf, vf = kf.repeat_interleave(rep, dim=1), vf.repeat_interleave(rep, dim=1)
    s = torch.einsum("qhd,khd->hqk", qf, kf) * D**-0.5
    pos_q = torch.arange(q.shape[0], device=q.device)[:, None] + context
    pos_k = torch.arange(k.shape[0], device=q.device)[None, :]
    s = s.masked_fill(pos_k > pos_q, float("-inf"))
    m = s.amax(-1, keepdim=True)
    sink_b = sink.view(-1, 1, 1) if sink is not None else None
    if sink is not None:
        m = torch.maximum(m, sink_b)
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True) + (torch.exp(sink_b - m) if sink is not None else 0.0)
    p_rounded = (p * 256.0).to(fp8).float() / 256.0
    return torch.einsum("hqk,khd->qhd", p_rounded, vf) / denom.permute(1, 0, 2)


def judge(out, ref) -> dict:
    """orch's per-head rule on [Q, H, D] outputs; the worst relative head error and the bad share."""
    err = (out.float() - ref.float()).pow(2).mean(-1).sqrt()
    rms = ref.float().pow(2).mean(-1).sqrt()
    s = rms.mean(-1, keepdim=True)
    bad = err > ATOL * s + RTOL * rms
    rel = err / rms.clamp(min=1e-12)
    return {
        "max_rel": round(float(rel.max()), 4),
        "median_rel": round(float(rel.median()), 4),
        "bad_fraction": round(float(bad.float().mean()), 5),
        "bad": int(bad.sum()),
    }


def kernel(q, kc, vc, scales, seq_len: int, context: int, sink, fp8_query: bool, fp8):
    """vLLM's unified_attention on an fp8 paged cache, 2-D path, as TritonAttentionImpl calls it."""
    import torch
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention
    from vllm.v1.kv_cache_interface import KVQuantMode

    device = q.device
    query_len = q.shape[0]
    q_scale, k_scale, v_scale = scales
    if fp8_query:
        q_in, q_descale = (q.float() / q_scale).to(fp8), q_scale.reshape(1).float()
    else:
        q_in, q_descale = q, None
    out = torch.empty(query_len, HEADS, D, dtype=torch.bfloat16, device=device)
    blocks = math.ceil(seq_len / BLOCK)
    table = torch.arange(1, blocks + 1, dtype=torch.int32, device=device)[None, :]
    sinks = None if sink is None else sink.float().contiguous()
    descale_shape = (1, KV_HEADS)
    unified_attention(
        q=q_in,
        k=kc,
        v=vc,
        out=out,
        cu_seqlens_q=torch.tensor([0, query_len], dtype=torch.int32, device=device),
        max_seqlen_q=query_len,
        seqused_k=torch.tensor([seq_len], dtype=torch.int32, device=device),
        max_seqlen_k=seq_len,
        softmax_scale=D**-0.5,
        causal=True,
        window_size=(-1, -1),
        block_table=table,
        softcap=0,
        q_descale=q_descale,
        k_descale=k_scale.reshape(1, 1).float().expand(descale_shape),
        v_descale=v_scale.reshape(1, 1).float().expand(descale_shape),
        sinks=sinks,
        kv_quant_mode=KVQuantMode.FP8_PER_TENSOR,
    )
    torch.cuda.synchronize()
    return out


def paged(x_fp8, seq_len: int):
    """[L, Hkv, D] fp8 -> a paged cache [blocks + 1, BLOCK, Hkv, D] (block 0 the null block)."""
    import torch

    blocks = math.ceil(seq_len / BLOCK)
    cache = torch.zeros(blocks + 1, BLOCK, KV_HEADS, D, dtype=x_fp8.dtype, device=x_fp8.device)
    flat = cache[1:].view(-1, KV_HEADS, D)
    flat[:seq_len] = x_fp8
    return cache


SCENARIOS = (
    ("decode_window", 128, 1),
    ("decode_long", 3000, 1),
    ("prefill_from_0", 256, 256),
    ("chunked_prefill", 2000, 12),
)


def scenario(name: str, seq_len: int, query_len: int, sinks: list[str], device: str) -> list[dict]:
    import torch

    fp8 = torch.float8_e4m3fn
    context = seq_len - query_len
    q, k, v = inputs(seq_len, query_len, device)
    k8, k_scale = quantise(k, fp8)
    v8, v_scale = quantise(v, fp8)
    q8, q_scale = quantise(q, fp8)
    k_deq, v_deq = k8.float() * k_scale, v8.float() * v_scale
    q_deq = q8.float() * q_scale
    rows = []
    for text in sinks:
        sink = sink_values(text, device)
        ref_q8, scores = reference(q_deq, k_deq, v_deq, sink, context)
        ref_qbf, _ = reference(q, k_deq, v_deq, sink, context)
        row_max = scores[..., :seq_len].amax(-1)
        gap = (sink.view(-1, 1) - row_max) if sink is not None else torch.zeros_like(row_max)
        share = torch.softmax(scores, -1)[..., -1] if sink is not None else torch.zeros_like(row_max)
        row = {
            "scenario": name,
            "sink": text,
            "gap_median": round(float(gap.median()), 2),
            "gap_max": round(float(gap.max()), 2),
            "sink_share_median": round(float(share.median()), 3),
            "model_fp8_p": judge(model_fp8_p(q_deq, k_deq, v_deq, sink, context, fp8), ref_q8),
            "model_unrounded": judge(model_fp8_p(q_deq, k_deq, v_deq, sink, context, torch.float32), ref_q8),
        }
        if device == "cuda":
            kc, vc = paged(k8, seq_len), paged(v8, seq_len)
            scales = (q_scale, k_scale, v_scale)
            row["kernel_fp8_query"] = judge(kernel(q, kc, vc, scales, seq_len, context, sink, True, fp8), ref_q8)
            row["kernel_bf16_query"] = judge(kernel(q, kc, vc, scales, seq_len, context, sink, False, fp8), ref_qbf)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="sinks_fp8_probe.json")
    ap.add_argument("--devices", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--sinks", default="none,0,4,8,12,orch")
    a = ap.parse_args(argv)
    import torch

    device = a.devices
    if device == "cuda":
        try:
            if not torch.cuda.is_available():
                print("gpu_sinks_fp8_probe: needs a CUDA GPU (or --devices cpu)", file=sys.stderr)
                return 3
            from backend.adapters.vllm import native

            native.stub_platform_native()  # vllm/platforms/cuda.py imports a compiled module at import
            import vllm.v1.attention.ops.triton_unified_attention  # noqa: F401  (fail here, not mid-run)
        except ImportError as e:
            print(f"gpu_sinks_fp8_probe: {e}", file=sys.stderr)
            return 3
    rows = [
        r
        for name, seq_len, query_len in SCENARIOS
        for r in scenario(name, seq_len, query_len, a.sinks.split(","), device)
    ]
    key = "kernel_fp8_query" if device == "cuda" else "model_fp8_p"
    fails = [r for r in rows if r[key]["bad"]]
    report = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "heads": [HEADS, KV_HEADS, D],
        "tolerance": [ATOL, RTOL],
        "rows": rows,
        "failing": [(r["scenario"], r["sink"]) for r in fails],
    }
    if device == "cuda":
        report["bf16_query_failing"] = [(r["scenario"], r["sink"]) for r in rows if r["kernel_bf16_query"]["bad"]]
        report["model_predicts"] = [(r["scenario"], r["sink"]) for r in rows if r["model_fp8_p"]["bad"]]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
