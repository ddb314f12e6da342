"""What the old interface (backend/adapters/vllm/old.py) reads from one of the seed's releases,
printed as one JSON object. Run in a process of its own, under ORCH_VLLM=RELEASE (a process imports
one vllm): tests/adapters/test_vllm_seed.py asks it about 0.10.2 and 0.11.0."""

from __future__ import annotations

import json
import types

import torch

from backend.adapters import vllm as adapter
from backend.adapters.vllm import current, old
from backend.attention.registry import get_backend
from backend.case import ModelShape
from backend.harness.model import TPLayout
from backend.harness.session import attention_config

CPU = torch.device("cpu")


def _config(kv: str, head_size: int = 64):
    shape = ModelShape(
        num_heads=8, num_kv_heads=2, head_size=head_size, num_layers=1, max_model_len=128, max_num_seqs=8, num_blocks=32
    )
    return attention_config(shape, TPLayout(1, 0, 8, 2, head_size), kv, (1, 2, 4, 8), "cpu")


def main() -> None:
    facts: dict = {"installed": adapter.installed_version()}
    iface, why = adapter.current_interface()
    facts["interface"] = iface.name if iface else why
    cls = get_backend("vllm:ROCM_AITER_FA")
    facts["unavailable_cpu"] = cls.unavailable_reason(CPU)
    facts["support"] = cls.cudagraph_support.name
    # The current interface's reading of the same class: the new attribute is absent, so it would
    # fall back to NEVER (a silent mis-declaration the old interface must not make).
    facts["support_read_as_current"] = current.support_level(cls.vllm_backend, None).name
    bare = types.SimpleNamespace(get_builder_cls=lambda: type("NoSupportBuilder", (), {}))
    facts["support_missing"] = old.support_level("ROCM_AITER_FA", bare)[1]
    facts["kernels"] = cls.kernels
    facts["kv_dtypes"] = list(cls.supported_kv_cache_dtypes)
    facts["dtypes"] = [str(d).removeprefix("torch.") for d in cls.supported_dtypes]
    facts["ops"] = {
        name: hasattr(getattr(torch.ops, ns), op)
        for name, (ns, op) in {
            "vllm.flash_attn_varlen_func": ("vllm", "flash_attn_varlen_func"),
            "aiter.paged_attention_v1": ("aiter", "paged_attention_v1"),
        }.items()
    }
    from vllm.platforms import current_platform

    facts["is_rocm"] = current_platform.is_rocm()
    facts["emulated"] = list(cls.emulated())
    caches = {}
    for kv in ("auto", "fp8"):
        cache = cls.allocate_kv_cache(_config(kv))
        caches[kv] = [list(cache.shape), str(cache.dtype).removeprefix("torch.")]
    facts["cache"] = caches
    facts["vllm_shape"] = list(cls.vllm_backend.get_kv_cache_shape(32, 16, 2, 64))
    facts["head16"] = cls.unsupported_reasons(_config("auto", head_size=16))
    builder = cls.builder_cls(_config("auto"))
    table = torch.zeros(2, 8, dtype=torch.int32)
    table[0, 0], table[1, 0] = 1, 2
    from backend.attention.interface import BatchDescription

    md = builder.build(BatchDescription([1, 3], [5, 3], table, torch.tensor([20, 32, 33, 34])), 8, 4)
    facts["metadata"] = {
        "type": type(md.vllm).__name__,
        "num_actual_tokens": md.vllm.num_actual_tokens,
        "cu_seq_lens": md.vllm.cu_seq_lens.tolist(),
        "max_query_len": md.vllm.max_query_len,
    }
    cap = builder.build_for_capture(8, 0, "v1")
    facts["capture"] = {
        "num_actual_tokens": cap.vllm.num_actual_tokens,
        "max_query_len": cap.vllm.max_query_len,
        "num_actual_kv_tokens": cap.vllm.num_actual_kv_tokens,
    }
    flex = get_backend("vllm:FLEX_ATTENTION")  # the old interface beyond the seed: pure torch, runs here
    facts["flex"] = {
        "support": flex.cudagraph_support.name,
        "kv_dtypes": list(flex.supported_kv_cache_dtypes),
        "unavailable_cpu": flex.unavailable_reason(CPU),
    }
    facts["names"] = {
        name: get_backend(f"vllm:{name}").unavailable_reason(CPU)
        for name in ("TRITON_ATTN", "TRITON_ATTN_VLLM_V1", "NOPE", "TRITON_MLA")
    }
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
