"""Expected wall time of one case: a small analytic model, refined by past durations.

The scheduler only needs the order and rough ratios of case costs (longest expected first,
GPU-seconds per gang), so the model is deliberately simple: gang start-up, graph captures, eager
and replay steps and the reference, each linear in the work one rank does; every constant is named
below (docs/SCHEDULING.md "Cost model"). One observed duration is a noisy sample, so history pulls
the model only part of the way toward it, and `estimate_all` rescales cases without history by the
median observed/model ratio, calibrating a matrix to the machine from one earlier run.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

from backend.case import Case

# Fixed per-case overhead: build backend, allocate KV cache, seed inputs.
BASE_S = 0.05
# Gang startup: process-group rendezvous and first collective; grows with ranks (log-ish in
# practice, linear is a safe upper shape for tp <= 8).
GANG_STARTUP_S = 0.4
# One graph capture (warm-up forward + record) per layer-piece; a FULL graph is one piece spanning
# all layers, PIECEWISE is layers+1 pieces per size (split at each attention call).
CAPTURE_PIECE_S = 0.002
CAPTURE_PER_LAYER_S = 0.004
# Per-token-per-layer dense work (QKV + output projections) at hidden size 256 on one rank.
DENSE_S_PER_TOKEN_LAYER = 2e-5
# Attention work per (query token x context token x layer x local head x head dim).
ATTN_S_PER_UNIT = 2e-10
# fp8 KV: quantise on write, dequantise on read (both eager and reference).
FP8_FACTOR = 1.3
# All-reduce after each layer's output projection, per extra rank.
ALLREDUCE_S_PER_LAYER_RANK = 2e-4
# Fraction of the way the model moves toward an observed duration.
HISTORY_WEIGHT = 0.75
# What a config's later cudagraph mode costs, as a fraction of its estimate, when it runs right
# after another mode of the config on the same worker (Dispatcher.siblings): the worker reuses the
# first mode's step inputs, eager steps, reference and session (backend/harness/checker.py). A
# factor, not the model's terms: the model prices per-case work, not the host time a memo saves,
# and the store's timings say what a case cost as it ran, not what it would have cost alone. In
# the H100 figures a lone case's inputs + eager + reference are about half of it.
LATER_MODE_FACTOR = 0.5

_DECODE_FULL_MODES = ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def capture_counts(case: Case) -> tuple[int, int]:
    """(full graphs, piecewise graphs) the worker captures for this case's requested mode.

    Split modes capture FULL decode graphs only for sizes a pure-decode batch can have
    (<= max_num_seqs tokens), as vLLM does.
    """
    sizes = case.capture_sizes
    decode_sizes = sum(1 for s in sizes if s <= case.model.max_num_seqs)
    mode = case.mode
    if mode == "NONE":
        return 0, 0
    if mode == "PIECEWISE":
        return 0, len(sizes)
    if mode == "FULL":
        return len(sizes), 0
    if mode == "FULL_DECODE_ONLY":
        return decode_sizes, 0
    if mode == "FULL_AND_PIECEWISE":
        return decode_sizes, len(sizes)
    raise ValueError(f"unknown cudagraph mode {mode!r}")


def model_seconds(case: Case) -> float:
    """The analytic estimate alone (no history). Always > 0."""
    m = case.model
    tp = max(1, case.tp)
    layers = max(1, m.num_layers)
    tokens = max(1, case.batch.num_tokens)
    context = max(1, sum(case.batch.seq_lens))
    local_heads = max(1, m.num_heads // tp)

    dense = DENSE_S_PER_TOKEN_LAYER * tokens * layers * (m.hidden_size / tp) / 256.0
    # Each query token attends to its own sequence; tokens*context over-counts mixed batches but
    # keeps the order right and is cheap.
    attn = ATTN_S_PER_UNIT * tokens * (context / max(1, case.batch.num_reqs)) * layers * local_heads * m.head_size
    if case.kv_cache_dtype == "fp8":
        attn *= FP8_FACTOR
    allreduce = ALLREDUCE_S_PER_LAYER_RANK * layers * (tp - 1)
    step = dense + attn + allreduce

    full, piecewise = capture_counts(case)
    capture = full * (CAPTURE_PIECE_S + CAPTURE_PER_LAYER_S * layers) + piecewise * (layers + 1) * (
        CAPTURE_PIECE_S + CAPTURE_PER_LAYER_S
    )
    steps = max(1, case.steps)
    # 1 warm-up + eager and replay per step + the fp32 reference (~ one eager step, unsharded).
    run = (1 + 2 * steps) * step + steps * (dense + attn) * tp
    startup = BASE_S + GANG_STARTUP_S * (tp - 1)
    return startup + capture + run


def gang_startup_seconds(case: Case) -> float:
    """The gang start-up model_seconds charges a tp > 1 case (0 for tp 1). No recorded duration
    holds it (a worker times its cases, not its gang's forming), so history never replaces it (the
    machine's calibration scales it as it scales the rest): it keeps a gang's cases ahead of
    narrower ones of similar work, and a run from changing its gang's width back and forth (each
    change re-forms a gang and drops its sessions)."""
    return GANG_STARTUP_S * (max(1, case.tp) - 1)


def _work_seconds(case: Case) -> float:
    return model_seconds(case) - gang_startup_seconds(case)


def blend(model_s: float, observed_s: float | None, weight: float = HISTORY_WEIGHT) -> float:
    """Move the model estimate `weight` of the way toward an observation (exponential smoothing)."""
    if observed_s is None or observed_s <= 0:
        return model_s
    return (1.0 - weight) * model_s + weight * observed_s


def estimate_seconds(case: Case, history: Mapping[str, float] | None = None) -> float:
    """Expected seconds for `case` on one worker (its gang for tp > 1); history keyed by case_id."""
    observed = history.get(case.case_id) if history else None
    return blend(_work_seconds(case), observed) + gang_startup_seconds(case)


def calibration_factor(cases: Sequence[Case], history: Mapping[str, float] | None) -> float:
    """Median observed/model ratio over cases with history (the gang start-up left out, as the
    observations leave it out); 1.0 when there is none."""
    if not history:
        return 1.0
    ratios = [history[c.case_id] / _work_seconds(c) for c in cases if history.get(c.case_id, 0) > 0]
    return statistics.median(ratios) if ratios else 1.0


def estimate_all(cases: Sequence[Case], history: Mapping[str, float] | None = None) -> dict[str, float]:
    """Estimates for a whole matrix: per-case blend, and the model rescaled to this machine by the
    median observed/model ratio so cases without history are on the same scale as those with; a
    gang case's start-up (gang_startup_seconds) on top of the blend, rescaled too."""
    scale = calibration_factor(cases, history)
    out: dict[str, float] = {}
    for c in cases:
        observed = history.get(c.case_id) if history else None
        out[c.case_id] = blend(_work_seconds(c) * scale, observed) + gang_startup_seconds(c) * scale
    return out


def grouped_estimates(
    cases: Sequence[Case],
    estimates: Mapping[str, float],
    config_of: Callable[[Case], str],
    history: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Estimates once a config's cases run together on one worker (Dispatcher.siblings): the
    longest of each config keeps its estimate (it pays the shared work), each other case without
    history LATER_MODE_FACTOR of it. A case with history keeps its blend: its observed duration
    already says whether it shared work."""
    by_config: dict[str, list[Case]] = {}
    for c in cases:
        by_config.setdefault(config_of(c), []).append(c)
    out = dict(estimates)
    for members in by_config.values():
        if len(members) < 2:
            continue
        lead = max(members, key=lambda c: (estimates[c.case_id], c.case_id))
        for c in members:
            if c is not lead and not (history and history.get(c.case_id, 0) > 0):
                out[c.case_id] = estimates[c.case_id] * LATER_MODE_FACTOR
    return out
