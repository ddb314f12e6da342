"""Settles vllm:TRITON_MLA's padded_finite failures (docs/VLLM.md, "TRITON_MLA's padded rows") in
one GPU call: vLLM's own decode_attention_fwd (vllm/v1/attention/ops/triton_decode_attention.py) on
a batch whose last row has seq_len 0, as vLLM's V2 runner pads a FULL decode graph
(input_batch.py: seq_lens[num_reqs:] = 0), against the same row at seq_len 1 on the null block.

    python3 benchmarks/gpu_mla_pad_probe.py --out $OUT/mla_pad_probe.json

Read in the source (CPU): _fwd_kernel_stage2 merges the splits of a row with e_sum = 0.0 and
acc = 0; a row of seq_len 0 has no split with split_kv_end > split_kv_start, so it stores
acc / e_sum = 0 / 0 = NaN (and lse = -inf + log 0). If that is what the run shows, the 15 FULL
decode cells are vLLM's kernel on its own padding (the #57017 class), not orch's padding values.
Exit 0 when the row of seq_len 0 is NaN and the rest finite (the finding), 1 otherwise, 3 without
a GPU or vllm.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run(pad_seq_len: int, device: str = "cuda") -> dict:
    import torch

    from backend.adapters.vllm import native

    native.stub_platform_native()
    from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd

    torch.manual_seed(0)
    heads, lora, rope, page, blocks = 16, 512, 64, 16, 8
    seq_lens = torch.tensor([40, 17, pad_seq_len], dtype=torch.int32, device=device)
    b = seq_lens.numel()
    q = torch.randn(b, heads, lora + rope, dtype=torch.bfloat16, device=device)
    cache = torch.randn(blocks, page, 1, lora + rope, dtype=torch.bfloat16, device=device)
    table = torch.tensor([[1, 2, 3], [4, 5, 0], [0, 0, 0]], dtype=torch.int32, device=device)  # pad: null block
    o = torch.zeros(b, heads, lora, dtype=torch.bfloat16, device=device)
    lse = torch.zeros(b, heads, dtype=torch.bfloat16, device=device)
    splits = 4
    logits = torch.empty(b, heads, splits, lora + 1, dtype=torch.float32, device=device)
    one = torch.ones(1, dtype=torch.float32, device=device)
    decode_attention_fwd(
        q,
        cache,
        cache[..., :lora],
        o,
        lse,
        table,
        seq_lens,
        logits,
        splits,
        (128 + 64) ** -0.5,
        page,
        k_scale=one,
        v_scale=one,
        is_mla=True,
    )
    torch.cuda.synchronize()
    nan = torch.isnan(o.float()).flatten(1).float().mean(1).tolist()
    return {
        "pad_seq_len": pad_seq_len,
        "nan_fraction_per_row": nan,
        "lse_pad_row": float(lse[-1].float().mean()),
        "finite_real_rows": bool(torch.isfinite(o[:2]).all()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="mla_pad_probe.json")
    a = ap.parse_args(argv)
    try:
        import torch

        if not torch.cuda.is_available():
            print("gpu_mla_pad_probe: needs a CUDA GPU", file=sys.stderr)
            return 3
        from backend.adapters.vllm import native

        native.stub_platform_native()  # before vllm's platform module imports its compiled part
        from vllm.v1.attention.ops import triton_decode_attention as t
    except ImportError as e:
        print(f"gpu_mla_pad_probe: {e}", file=sys.stderr)
        return 3
    stage2 = t._fwd_kernel_stage2
    source = inspect.getsource(getattr(stage2, "fn", stage2))  # a Triton JITFunction wraps the Python one
    rows = [run(0), run(1)]
    found = (
        rows[0]["nan_fraction_per_row"][-1] == 1.0
        and rows[0]["finite_real_rows"]
        and rows[1]["nan_fraction_per_row"][-1] == 0.0
    )
    report = {
        "divides_by_e_sum": "acc / e_sum" in source,
        "runs": rows,
        "verdict": "vLLM's stage-2 reduce gives 0/0 = NaN on a seq_len-0 row (its V2 padding); seq_len 1 is finite"
        if found
        else "NOT the 0/0 mechanism: look at orch's padding values",
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
