"""What each attention family declares without torch: its own model dimensions, the generic shape
fields it derives from them, its default shapes, and the tp layouts it can shard (DESIGN.md §9).

The matrix loader, the planner and the driver read these (no torch import: `orch plan` starts in
well under a second); the implementations (backend/families/<name>.py, torch) are held to them by
tests/families/test_specs.py, as the providers' torch-free Capabilities are held to their classes.

A family's model is the generic ModelShape (heads, block size, max_model_len, ...) plus its own
`dims`, given in the matrix's model block beside the generic keys:

    gqa        num_kv_heads, head_size (generic fields: no dims of its own)
    mla        kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim; the cache row is
               kv_lora_rank + qk_rope_head_dim values and one "kv head" (vLLM's MLAAttentionSpec),
               so num_kv_heads = 1 and head_size = that row are derived, never written
    swa_sinks  sliding_window, layer_pattern, sinks, kv_groups (gpt-oss: alternating window / full
               layers, a learned sink per query head, one KV-cache group per layer kind)
    mla_sparse mla's, and index_n_heads, index_head_dim, index_topk (DeepSeek V3.2: an indexer picks
               the top-k tokens each query token attends; its keys in a cache plane of their own)
    hybrid_gdn num_k_heads, head_k_dim, conv_kernel, state_dtype, full_attention_interval
               (Qwen3-Next: GatedDeltaNet layers with a per-request state beside full attention;
               the GDN value heads are the generic num_heads x head_size)
"""

from __future__ import annotations

from backend.families.contract.spec import Dim, FamilySpec

# ---- gqa: plain grouped-query paged attention (the family orch started with) -----------------


def _gqa_layout(shape, tp: int) -> list[str]:
    """vLLM's rules: q heads split by tp; kv heads split, or replicated when tp exceeds them."""
    h, kv = shape.num_heads, shape.num_kv_heads
    if tp < 1:
        return [f"tp {tp} < 1"]
    if tp > h:
        return [f"tp {tp} > num_heads {h}"]
    reasons = []
    if h % tp:
        reasons.append(f"num_heads {h} not divisible by tp {tp}")
    if kv <= 0 or h % kv:
        reasons.append(f"num_heads {h} not a multiple of num_kv_heads {kv}")
    elif tp > kv:
        if tp % kv:
            reasons.append(f"tp {tp} not a multiple of num_kv_heads {kv} (kv heads replicated)")
    elif kv % tp:
        reasons.append(f"num_kv_heads {kv} not divisible by tp {tp}")
    return reasons


def _gqa_shape(shape) -> list[str]:
    if shape.num_kv_heads < 1 or shape.num_heads % shape.num_kv_heads:
        return [f"num_heads {shape.num_heads} is not a multiple of num_kv_heads {shape.num_kv_heads}"]
    return []


GQA = FamilySpec(
    name="gqa",
    description="grouped-query paged attention: K and V caches [blocks, block_size, kv_heads, head_size]",
    impl="backend.families.gqa:GQA",
    layout_reasons=_gqa_layout,
    shape_reasons=_gqa_shape,
)


# ---- mla: multi-head latent attention (DeepSeek V3/R1, Kimi K2) ----------------------------------


def _heads_only_layout(shape, tp: int) -> list[str]:
    """q heads split by tp; the cache (one latent row per token, or the family's kv heads when
    tp exceeds them) is replicated on every rank, so heads are the only constraint."""
    h = shape.num_heads
    if tp < 1:
        return [f"tp {tp} < 1"]
    if tp > h:
        return [f"tp {tp} > num_heads {h}"]
    return [f"num_heads {h} not divisible by tp {tp}"] if h % tp else []


MLA = FamilySpec(
    name="mla",
    description="multi-head latent attention: one latent row [kv_c | k_pe] per token, decode absorbed, "
    "prefill decompressed",
    impl="backend.families.mla:MLA",
    dims=(
        Dim("kv_lora_rank", 512, 1, 4096, doc="latent width L (the cache row's kv_c part; V is the latent)"),
        Dim("qk_rope_head_dim", 64, 1, 1024, doc="rope part R of q and of the cache row (k_pe)"),
        Dim("qk_nope_head_dim", 128, 1, 1024, doc="no-rope part P of q; softmax scale (P + R)^-0.5"),
        Dim("v_head_dim", 128, 1, 1024, doc="V per head after W_UV (the attention output's head size)"),
    ),
    derive=lambda d: {"num_kv_heads": 1, "head_size": d["kv_lora_rank"] + d["qk_rope_head_dim"]},
    defaults={
        # DeepSeek-V3 per rank at tp 8 (128 heads / 8): what one MI355X rank runs.
        "gpu": {
            "num_heads": 16,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
        },
        # Small enough for the 2-core CI box; 8 heads keep tp 8 valid (one head a rank).
        # max_model_len 128 and max_num_seqs 64 (the MLA batches: at most 64 requests, sequences
        # of 100): AITER's page-size-1 kv_indices hold max_num_seqs x (1 + k) x max_model_len
        # slots, and the emulated mla_decode_fwd scores every one of them each call (at
        # full.yaml's 256 x 512, the slowest MLA cases on the CPU box by far).
        "cpu": {
            "num_heads": 8,
            "kv_lora_rank": 32,
            "qk_rope_head_dim": 16,
            "qk_nope_head_dim": 16,
            "v_head_dim": 16,
            "max_model_len": 128,
            "max_num_seqs": 64,
        },
    },
    layout_reasons=_heads_only_layout,
)


# ---- mla_sparse: DeepSeek sparse attention (V3.2's DSA): an indexer and a top-k over MLA ---------


def _mla_sparse_shape(shape) -> list[str]:
    dims = dict(shape.dims)
    row = dims.get("kv_lora_rank", 0) + dims.get("qk_rope_head_dim", 0)
    reasons = []
    if dims.get("index_head_dim", 0) > row:
        reasons.append(
            f"index_head_dim {dims.get('index_head_dim')} exceeds the latent row {row} "
            "(the indexer's cache plane is a row of the same width)"
        )
    return reasons


MLA_SPARSE = FamilySpec(
    name="mla_sparse",
    description="DeepSeek sparse attention: MLA over the index_topk tokens a lightning indexer picks per query "
    "token (causal), the indexer's keys in a cache of their own",
    impl="backend.families.mla_sparse:MLASparse",
    dims=(
        *MLA.dims,
        Dim("index_n_heads", 64, 1, 1024, doc="indexer heads Hi (a score is the weighted sum of their ReLU'd dots)"),
        Dim("index_head_dim", 128, 1, 1024, doc="indexer key/query size Di (at most kv_lora_rank + qk_rope_head_dim)"),
        Dim("index_topk", 2048, 1, 1 << 16, doc="K: tokens each query token attends (all of a shorter context)"),
    ),
    derive=MLA.derive,
    defaults={
        # DeepSeek-V3.2's MLA per rank at tp 8, its indexer (64 x 128), top-k 256 so that contexts of a
        # few hundred tokens are above it and short ones below (the model's 2048 needs 2K+ contexts).
        "gpu": {**MLA.defaults["gpu"], "index_n_heads": 64, "index_head_dim": 128, "index_topk": 256, "num_layers": 2},
        # Small for the 2-core CI box: one layer (the family's cost is the gather of every context
        # row), 4 heads (tp 2 keeps two), top-k 16 against contexts of 3 to 100.
        "cpu": {
            "num_heads": 4,
            "kv_lora_rank": 32,
            "qk_rope_head_dim": 16,
            "qk_nope_head_dim": 16,
            "v_head_dim": 16,
            "index_n_heads": 2,
            "index_head_dim": 16,
            "index_topk": 16,
            "num_layers": 1,
            "max_model_len": 128,
            "max_num_seqs": 16,
        },
    },
    layout_reasons=_heads_only_layout,
    shape_reasons=_mla_sparse_shape,
)


# ---- swa_sinks: sliding window + attention sinks over several KV-cache groups (gpt-oss) ----------

LAYER_PATTERNS = ("alternate", "window", "full")
KV_GROUPS = ("hybrid", "merged")


def _swa_shape(shape) -> list[str]:
    reasons = _gqa_shape(shape)
    dims = dict(shape.dims)
    window, pattern = dims.get("sliding_window", 0), dims.get("layer_pattern", "alternate")
    if window >= shape.max_model_len:
        reasons.append(f"sliding_window {window} must be below max_model_len {shape.max_model_len}")
    if pattern == "alternate" and shape.num_layers < 4:
        reasons.append(
            f"layer_pattern alternate needs num_layers >= 4 (two window and two full layers), got {shape.num_layers}"
        )
    if dims.get("kv_groups") == "hybrid" and pattern != "alternate":
        reasons.append(f"kv_groups hybrid needs layers of both kinds (layer_pattern alternate), got {pattern}")
    return reasons


SWA_SINKS = FamilySpec(
    name="swa_sinks",
    description="gpt-oss attention: sliding-window and full layers alternating, a learned sink per query "
    "head, one KV-cache group per layer kind",
    impl="backend.families.swa_sinks:SWASinks",
    dims=(
        Dim("sliding_window", 128, 1, 1 << 20, doc="W: a query at position i sees key j iff 0 <= i - j < W"),
        Dim(
            "layer_pattern",
            "alternate",
            choices=LAYER_PATTERNS,
            doc="alternate: window on even layers, full on odd (gpt-oss); or every layer one kind",
        ),
        Dim("sinks", 1, 0, 1, doc="1: a learned sink logit per query head in every layer"),
        Dim(
            "kv_groups",
            "hybrid",
            choices=KV_GROUPS,
            doc="hybrid: one KV-cache group per layer kind (vLLM's hybrid manager); merged: one group "
            "(--disable-hybrid-kv-cache-manager)",
        ),
    ),
    defaults={
        # gpt-oss: 64 q heads, 8 kv heads, head dim 64, window 128.
        "gpu": {"num_heads": 64, "num_kv_heads": 8, "head_size": 64, "num_layers": 4, "sliding_window": 128},
        # max_model_len 320: the swa batches' longest CPU sequence is 300; the torch provider
        # gathers max_model_len keys a token (a static shape, as a graph needs).
        "cpu": {
            "num_heads": 8,
            "num_kv_heads": 2,
            "head_size": 16,
            "num_layers": 4,
            "sliding_window": 32,
            "max_model_len": 320,
        },
    },
    layout_reasons=_gqa_layout,
    shape_reasons=_swa_shape,
    requires=lambda shape: ("sinks",) if dict(shape.dims).get("sinks") else (),
)


# ---- hybrid_gdn: GatedDeltaNet layers beside full attention, state that lives across steps -------

STATE_DTYPES = ("float32", "bfloat16", "mixed")


def is_attention_layer(shape, layer: int) -> bool:
    """Qwen3-Next's pattern: every full_attention_interval-th layer is full attention, the rest
    GatedDeltaNet (interval 4: layers 0-2 GDN, 3 attention)."""
    return (layer + 1) % dict(shape.dims).get("full_attention_interval", 4) == 0


def _hybrid_layout(shape, tp: int) -> list[str]:
    reasons = _gqa_layout(shape, tp)
    hk = dict(shape.dims).get("num_k_heads", 1)
    if tp >= 1 and hk % tp:
        reasons.append(f"num_k_heads {hk} not divisible by tp {tp} (GDN key heads split by tp)")
    return reasons


def _hybrid_shape(shape) -> list[str]:
    reasons = _gqa_shape(shape)
    dims = dict(shape.dims)
    hk, interval = dims.get("num_k_heads", 1), dims.get("full_attention_interval", 4)
    if shape.num_heads % hk:
        reasons.append(f"num_heads {shape.num_heads} (the GDN value heads) is not a multiple of num_k_heads {hk}")
    if shape.num_layers < interval:
        reasons.append(f"num_layers {shape.num_layers} < full_attention_interval {interval}: no attention layer")
    return reasons


HYBRID_GDN = FamilySpec(
    name="hybrid_gdn",
    description="Qwen3-Next's hybrid: GatedDeltaNet layers (causal conv1d + gated delta rule, a state slot per "
    "request that lives across steps) beside full-attention layers, one KV-cache group per kind",
    impl="backend.families.hybrid_gdn:HybridGDN",
    dims=(
        Dim(
            "num_k_heads",
            16,
            1,
            1024,
            doc="GDN key (and query) heads; the value heads are num_heads, each key "
            "head serving num_heads / num_k_heads of them (GQA-like)",
        ),
        Dim("head_k_dim", 128, 1, 1024, doc="GDN key/query head size; the value head size is head_size"),
        Dim(
            "conv_kernel",
            4,
            2,
            8,
            doc="the causal conv1d's width (SiLU after it); its state is the last "
            "conv_kernel - 1 inputs (+ k under spec decode)",
        ),
        Dim(
            "state_dtype",
            "mixed",
            choices=STATE_DTYPES,
            doc="the recurrent state's dtype (vLLM's mamba_ssm_cache_dtype); mixed: float32 and bfloat16 on "
            "alternating GDN layers, two state groups (vLLM groups layers by spec)",
        ),
        Dim("full_attention_interval", 4, 2, 64, doc="every interval-th layer is full attention (Qwen3-Next: 4)"),
    ),
    defaults={
        # Qwen3-Next's GDN layer (16 key heads, 32 value heads, 128/128); its attention layers at
        # the same width in orch's one head layout (Qwen3-Next: 16 x 256 query heads, 2 kv heads).
        # max_num_seqs 64: state slots are 1 + 64 x (1 + k), 2 MB each in fp32 at this shape.
        "gpu": {
            "num_heads": 32,
            "num_kv_heads": 4,
            "head_size": 128,
            "num_layers": 4,
            "num_k_heads": 16,
            "head_k_dim": 128,
            "max_num_seqs": 64,
            "max_model_len": 2048,
        },
        # Small for the 2-core CI box: 3 GDN layers and 1 attention layer, 4 value / 2 key heads.
        "cpu": {
            "num_heads": 4,
            "num_kv_heads": 2,
            "head_size": 16,
            "num_layers": 4,
            "num_k_heads": 2,
            "head_k_dim": 16,
            "max_num_seqs": 16,
            "max_model_len": 128,
        },
    },
    layout_reasons=_hybrid_layout,
    shape_reasons=_hybrid_shape,
    fresh_prompts_are_prefills=True,
)


# The builtins by name (contract/registry.py names each by its import path here).
SPECS: dict[str, FamilySpec] = {s.name: s for s in (GQA, MLA, SWA_SINKS, HYBRID_GDN, MLA_SPARSE)}
