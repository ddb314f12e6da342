"""Tiny MLA shapes and cases, so the family's suite stays within a minute or two on one core."""

from __future__ import annotations

import dataclasses

import pytest

from backend.case import BatchSpec, Case, ModelShape, Tolerance
from backend.harness.checker import SessionCache

# L = 32, R = 16 (a 48-value latent row), P = 16, V = 16; 4 heads, so tp 2 and 4 shard them.
MLA_DIMS = (("kv_lora_rank", 32), ("qk_nope_head_dim", 16), ("qk_rope_head_dim", 16), ("v_head_dim", 16))
TINY_MLA = ModelShape(
    num_heads=4,
    num_kv_heads=1,
    head_size=48,
    block_size=16,
    dtype="bfloat16",
    num_layers=2,
    max_model_len=128,
    max_num_seqs=8,
    attention="mla",
    dims=MLA_DIMS,
)
CAPTURE_SIZES = (1, 2, 4, 8, 16, 32)
DECODE = BatchSpec("decode3", (1, 1, 1), (40, 20, 70))  # 3 tokens pad to 4
MIXED = BatchSpec("mixed6", (1, 4, 1), (40, 20, 70))  # reordered decodes first: (1, 1, 4)
# fp8_ds_mla: the model dtype's, as the matrix loader gives it (the reference rounds its rows as
# the format stores them, bit for bit: docs/FAMILIES.md "mla_sparse").
TOL = {"auto": Tolerance(2e-2, 2e-2), "fp8": Tolerance(2e-2, 5e-2), "fp8_ds_mla": Tolerance(2e-2, 2e-2)}


def _tiny_case(
    model: ModelShape,
    matrix: str,
    backend: str,
    mode: str,
    kv: str,
    batch: BatchSpec,
    tp: int,
    seed: int,
    changes: dict,
) -> Case:
    case = Case(
        backend=backend,
        tp=tp,
        mode=mode,
        kv_cache_dtype=kv,
        batch=batch,
        seed=seed,
        model=model,
        capture_sizes=CAPTURE_SIZES,
        steps=3,
        tolerance=TOL[kv],
        matrix=matrix,
    )
    return dataclasses.replace(case, **changes) if changes else case


def make_case(
    backend: str = "torch",
    mode: str = "FULL",
    kv: str = "auto",
    batch: BatchSpec = MIXED,
    tp: int = 1,
    seed: int = 0,
    **changes,
) -> Case:
    return _tiny_case(TINY_MLA, "tests/tiny-mla.yaml", backend, mode, kv, batch, tp, seed, changes)


@pytest.fixture(scope="session")
def mla_sessions() -> SessionCache:
    return SessionCache(capacity=64)


# gpt-oss in small: 4 q heads, 2 kv heads, head dim 16, 4 layers alternating window 32 / full,
# sinks, one KV-cache group per layer kind.
SWA_DIMS = (("kv_groups", "hybrid"), ("layer_pattern", "alternate"), ("sinks", 1), ("sliding_window", 32))
TINY_SWA = ModelShape(
    num_heads=4,
    num_kv_heads=2,
    head_size=16,
    block_size=16,
    dtype="bfloat16",
    num_layers=4,
    max_model_len=128,
    max_num_seqs=8,
    attention="swa_sinks",
    dims=SWA_DIMS,
)
# seq lens below, at and above the window, windows starting mid-block (70 - 32 + 1 = 39: block 2, offset 7)
SWA_DECODE = BatchSpec("decode3", (1, 1, 1), (20, 32, 70))
SWA_MIXED = BatchSpec("mixed6", (1, 4, 1), (40, 20, 70))
# 12-token queries: above the 3-D path's longest (8), so the 2-D path runs
SWA_PREFILL = BatchSpec("prefill2", (12, 12), (12, 50))


def make_swa_case(
    backend: str = "torch",
    mode: str = "FULL",
    kv: str = "auto",
    batch: BatchSpec = SWA_MIXED,
    tp: int = 1,
    seed: int = 0,
    **changes,
) -> Case:
    return _tiny_case(TINY_SWA, "tests/tiny-swa.yaml", backend, mode, kv, batch, tp, seed, changes)


def swa_model(**dims) -> ModelShape:
    return dataclasses.replace(TINY_SWA, dims=tuple({**dict(SWA_DIMS), **dims}.items()))


# Qwen3-Next in small: 3 GDN layers (float32, bfloat16, float32 state: two state groups) and 1
# attention layer; 4 value heads over 2 key heads of 16, head size 16; max_num_seqs 8, so decode
# graphs of q = 1 hold 1, 2, 4, 8 requests and of q = 3 hold 1, 2, 3, 6, 8.
GDN_DIMS = (
    ("conv_kernel", 4),
    ("full_attention_interval", 4),
    ("head_k_dim", 16),
    ("num_k_heads", 2),
    ("state_dtype", "mixed"),
)
TINY_GDN = ModelShape(
    num_heads=4,
    num_kv_heads=2,
    head_size=16,
    block_size=16,
    dtype="bfloat16",
    num_layers=4,
    max_model_len=128,
    max_num_seqs=8,
    attention="hybrid_gdn",
    dims=GDN_DIMS,
)
# 5 decodes: graphs of 8 requests at k = 0 and of 6 at k = 2 (padded requests either way)
GDN_DECODE = BatchSpec("decode5", (1, 1, 1, 1, 1), (40, 20, 70, 9, 33))
# decodes, a one-token prompt, a chunk over context, a fresh prompt (recycled slots each step)
GDN_MIXED = BatchSpec("mixed6", (1, 1, 1, 1, 9, 5), (40, 33, 100, 1, 40, 5))
GDN_TOL = {"auto": Tolerance(2e-2, 6e-2), "fp8": Tolerance(2e-2, 8e-2)}


def make_gdn_case(
    backend: str = "torch",
    mode: str = "FULL",
    kv: str = "auto",
    batch: BatchSpec = GDN_DECODE,
    tp: int = 1,
    seed: int = 0,
    **changes,
) -> Case:
    changes.setdefault("tolerance", GDN_TOL[kv])
    return _tiny_case(TINY_GDN, "tests/tiny-gdn.yaml", backend, mode, kv, batch, tp, seed, changes)


def gdn_model(**dims) -> ModelShape:
    return dataclasses.replace(TINY_GDN, dims=tuple({**dict(GDN_DIMS), **dims}.items()))
