"""Are a provider's padded output rows finite? (the padded_finite check, and the
padded verify batches.) Direct provider calls, eager and through a CUDA graph, on batches padded
the way the checker's FULL graphs pad them: n real requests of query len q, padded to P requests
and P * q tokens (the capture dummy batch), padded requests with query len 0 and seq_len 0.

    PYTHONPATH=$PWD python benchmarks/gpu_padded_rows.py [--providers torch,aiter-triton]

Prints one line per (provider, kv dtype, q, n, P): non-finite padded rows eager / after replay,
and max |replay - eager| on the real rows. On a CPU-only machine the torch provider runs eagerly.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: repo root importable

from backend.attention.registry import get_backend
from benchmarks.gpu_provider_check import _config, _to
from tests.backend.attn_batches import make_step

# (q per request, real requests, padded requests)
SHAPES = [(1, 7, 8), (2, 7, 8), (3, 5, 8), (4, 7, 8), (2, 1, 2), (2, 60, 64)]
# max_model_len: 512 keeps unified_attention on its 2D kernel; 4096 (full.yaml's GPU shape) lets
# small decode batches take the 3D split-KV path, whose reduce_segments writes every token's row.
MODEL_LENS = (512, 4096)


def nonfinite_rows(x: torch.Tensor) -> int:
    return int((~torch.isfinite(x.float())).flatten(1).any(dim=1).sum())


def probe(provider: str, kv: str, q: int, n: int, p: int, device: torch.device, model_len: int = 512) -> dict:
    backend = get_backend(provider)
    config = _config({"kv_cache_dtype": kv, "max_num_seqs": 64, "max_model_len": model_len}, device)
    reason = backend.unavailable_reason(device) or "; ".join(backend.unsupported_reasons(config))
    if reason:
        return {"status": "skip", "reason": reason}
    qlens, slens = [q] * n, [60 + 5 * i for i in range(n)]
    ks, vs = (0.05, 0.08) if kv == "fp8" else (1.0, 1.0)
    step = _to(
        make_step(
            dataclasses.replace(config, device=torch.device("cpu")), qlens, slens, seed=3, k_scale=ks, v_scale=vs
        ),
        device,
    )
    builder, impl = backend.builder_cls(config), backend.impl_cls(config)
    t, tp = n * q, p * q
    g = torch.Generator().manual_seed(5)
    pad = lambda x: torch.cat([x, torch.randn(tp - t, *x.shape[1:], generator=g).to(x)])
    qq, kk, vv = pad(step.query), pad(step.key), pad(step.value)
    out = torch.full((tp, config.num_heads, config.head_size), float("nan"), dtype=config.dtype, device=device)
    cache0 = step.kv_cache.clone()
    md = builder.build(step.batch, tp, p)
    impl.forward(qq, kk, vv, step.kv_cache, md, step.k_scale, step.v_scale, out)
    if device.type == "cuda":
        torch.cuda.synchronize()
    eager = out.clone()
    r = {
        "status": "ok",
        "eager_nonfinite_padded": nonfinite_rows(eager[t:]),
        "eager_nonfinite_real": nonfinite_rows(eager[:t]),
    }
    if provider == "aiter-triton" and device.type == "cuda":  # the kernel alone, without our mask
        from backend.providers.aiter_loader import load_aiter_triton

        raw_out = torch.full_like(out, float("nan"))
        load_aiter_triton().unified_attention(
            q=qq,
            k=step.kv_cache[0],
            v=step.kv_cache[1],
            out=raw_out,
            cu_seqlens_q=md.query_start_loc,
            max_seqlen_q=min(config.max_num_tokens, config.max_model_len),
            seqused_k=md.seq_lens,
            max_seqlen_k=config.max_model_len,
            softmax_scale=config.scale,
            causal=True,
            window_size=(-1, -1),
            block_table=md.block_table,
            softcap=0.0,
            q_descale=None,
            k_descale=step.k_scale,
            v_descale=step.v_scale,
        )
        torch.cuda.synchronize()
        r["raw_kernel_nonfinite_padded"] = nonfinite_rows(raw_out[t:])
    if device.type != "cuda":
        return r
    cache = cache0.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        impl.forward(qq, kk, vv, cache, builder.build_for_capture(tp, q, "v2"), step.k_scale, step.v_scale, out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    md_c = builder.build_for_capture(tp, q, "v2")
    with torch.cuda.graph(graph):
        impl.forward(qq, kk, vv, cache, md_c, step.k_scale, step.v_scale, out)
    cache.copy_(cache0)
    out.fill_(float("nan"))
    builder.build(step.batch, tp, p)
    graph.replay()
    torch.cuda.synchronize()
    r.update(
        graph_nonfinite_padded=nonfinite_rows(out[t:]),
        graph_nonfinite_real=nonfinite_rows(out[:t]),
        replay_vs_eager_max_abs=float((out[:t].float() - eager[:t].float()).abs().max()),
    )
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--providers", default="torch,aiter-triton")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    bad = 0
    for provider in args.providers.split(","):
        for kv in ("auto", "fp8"):
            for model_len in MODEL_LENS:
                for q, n, p in SHAPES:
                    try:
                        r = probe(provider, kv, q, n, p, device, model_len)
                    except Exception as exc:
                        r = {"status": "error", "reason": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
                    # raw_kernel_*: AITER's behaviour, reported; the provider's rows are what must be finite
                    bad += r.get("status") == "error" or any(
                        v for k, v in r.items() if "nonfinite" in k and "raw" not in k
                    )
                    print(f"{provider:14s} {kv:4s} len={model_len} q={q} n={n} P={p} {json.dumps(r)}", flush=True)
    print(f"cells with non-finite rows or errors: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
