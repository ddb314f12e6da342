"""Check the GPU kernel providers against backend/harness/reference.py, eager and under a CUDA graph.

    PYTHONPATH=$PWD python benchmarks/gpu_provider_check.py [--out provider_check.json]

Per (provider, spec): max abs error vs the fp32 reference (eager), and, on a GPU, max abs
difference of a CUDA-graph replay vs eager (the graph is captured on the padded batch, then the
buffers are rewritten and replayed), or the capture error (aiter-triton-pa: pa_decode calls
k_scale.item()). On a CPU-only machine the torch provider runs eagerly and the GPU-only providers
are listed with their unavailable reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: repo root importable

from backend.attention.interface import AttentionCGSupport
from backend.attention.registry import get_backend
from backend.harness.reference import reference_from_cache
from tests.backend.attn_batches import make_config, make_step

PROVIDERS = ("torch", "aiter-triton", "aiter-triton-pa")
GPU_SHAPE = dict(num_heads=32, num_kv_heads=8, head_size=128, block_size=16)
# name -> (query_lens, seq_lens, config overrides, k_scale, v_scale)
SPECS = {
    "decode": ([1] * 16, [17 + 31 * i for i in range(16)], {}, 1.0, 1.0),
    "prefill": ([40, 17, 64], [40, 17, 64], {}, 1.0, 1.0),
    "mixed": ([1, 33, 1, 7, 1], [300, 33, 5, 120, 511], {}, 1.0, 1.0),
    "long-context": ([1, 1, 16], [4000, 3000, 4096], {"max_model_len": 4096, "max_num_seqs": 4}, 1.0, 1.0),
    "gqa-16to1": ([1, 9, 1], [100, 9, 60], {"num_kv_heads": 2}, 1.0, 1.0),
    "fp8-mixed": ([1, 12, 1], [200, 12, 77], {"kv_cache_dtype": "fp8"}, 0.05, 0.08),
}


def _config(overrides: dict, device: torch.device):
    base = dict(max_model_len=512, max_num_seqs=16, max_num_tokens=256)
    if device.type == "cuda":
        base.update(GPU_SHAPE)
    else:  # CPU: tiny heads so the script stays fast
        base.update(num_heads=4, num_kv_heads=2, head_size=16, block_size=16)
        overrides = {k: (min(v, 2) if k == "num_kv_heads" else v) for k, v in overrides.items()}
    base.update(overrides)
    return dataclasses.replace(make_config(**base), device=device)


def _to(step, device):
    for field in ("query", "key", "value", "kv_cache", "k_scale", "v_scale"):
        setattr(step, field, getattr(step, field).to(device))
    return step


def check(provider: str, spec: str, device: torch.device) -> dict:
    qlens, slens, overrides, ks, vs = SPECS[spec]
    backend = get_backend(provider)
    config = _config(overrides, device)
    reason = backend.unavailable_reason(device) or "; ".join(backend.unsupported_reasons(config))
    if reason:
        return {"status": "skip", "reason": reason}
    step = make_step(
        dataclasses.replace(config, device=torch.device("cpu")), qlens, slens, seed=1, k_scale=ks, v_scale=vs
    )
    step = _to(step, device)
    builder, impl = backend.builder_cls(config), backend.impl_cls(config)
    t = sum(qlens)
    padded = -(-t // 8) * 8
    pad = lambda x: torch.cat([x, x.new_zeros(padded - t, *x.shape[1:])])
    q, k, v = pad(step.query), pad(step.key), pad(step.value)
    out = torch.zeros(padded, config.num_heads, config.head_size, dtype=config.dtype, device=device)
    md = builder.build(step.batch, padded, len(qlens))
    cache0 = step.kv_cache.clone()
    impl.forward(q, k, v, step.kv_cache, md, step.k_scale, step.v_scale, out)
    ref = reference_from_cache(step.query, step.kv_cache, step.batch, config.scale, step.k_scale, step.v_scale)
    eager = out[:t].float().clone()
    result = {
        "status": "ok",
        "max_abs_err": (eager - ref).abs().max().item(),
        "finite": bool(torch.isfinite(out.float()).all()),
    }
    support = backend.cudagraph_support
    decode_only = all(x == 1 for x in qlens)
    if device.type != "cuda":
        result["graph"] = "skipped: no GPU"
    elif support is AttentionCGSupport.NEVER or (support < AttentionCGSupport.ALWAYS and not decode_only):
        result["graph"] = f"not capturable at {support.name} for this batch"
    else:
        result.update(_graph_vs_eager(impl, builder, step, q, k, v, out, cache0, eager, padded, len(qlens)))
    return result


def _graph_vs_eager(impl, builder, step, q, k, v, out, cache0, eager, padded, num_reqs) -> dict:
    t = eager.shape[0]
    cache = cache0.clone()
    md = builder.build(step.batch, padded, num_reqs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            impl.forward(q, k, v, cache, md, step.k_scale, step.v_scale, out)  # warm-up
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            impl.forward(q, k, v, cache, md, step.k_scale, step.v_scale, out)
    except Exception as exc:  # e.g. pa_decode's k_scale.item() invalidates the capture
        torch.cuda.synchronize()
        return {"graph": f"capture error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    cache.copy_(cache0)
    out.fill_(float("nan"))
    builder.build(step.batch, padded, num_reqs)  # rewrite the persistent buffers, as a step would
    graph.replay()
    torch.cuda.synchronize()
    diff = (out[:t].float() - eager).abs().max().item()
    return {"graph": "cuda", "replay_vs_eager_max_abs": diff, "replay_bitwise": diff == 0.0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="", help="write the results as JSON here")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    results: dict[str, dict[str, dict]] = {}
    for provider in args.providers.split(","):
        results[provider] = {}
        for spec in SPECS:
            try:
                r = check(provider, spec, device)
            except Exception as exc:
                r = {
                    "status": "error",
                    "reason": f"{type(exc).__name__}: {exc}".splitlines()[0],
                    "trace": traceback.format_exc()[-2000:],
                }
            results[provider][spec] = r
            line = {k: v for k, v in r.items() if k != "trace"}
            print(f"{provider:16s} {spec:14s} {json.dumps(line)}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": str(device), "torch": torch.__version__, "results": results}, f, indent=2)
    return 1 if any(r["status"] == "error" for p in results.values() for r in p.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
