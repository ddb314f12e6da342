"""A case's plan before anything runs: the mode and capture sizes it resolves to, the session it
runs in (its SessionCache key, factory and size estimate), and the graph each of its steps
dispatches to. The checker runs cases from it; precompile warms kernels from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from backend.case import Case
from backend.families.contract import family as family_of
from backend.harness.model import TPLayout
from backend.harness.modes import (
    CUDAGraphMode,
    capture_plan,
    dispatch,
    is_uniform_decode,
    resolve_capture_sizes,
    resolve_mode,
    uniform_decode_query_len,
)
from backend.harness.session import GraphKey, Session, attention_config, estimate_bytes
from backend.harness.steps import plan_steps


@dataclass(frozen=True)
class SessionPlan:
    mode: CUDAGraphMode  # resolved
    sizes: tuple[int, ...]  # capture sizes as resolved with the mode
    notes: str  # what resolution changed, for the log
    downgraded: bool
    key: tuple  # the SessionCache key
    factory: Callable[[], Session]
    estimate: int = 0  # its bytes before it is built (session.estimate_bytes)


def session_plan(case: Case, backend_cls, rank: int, device: torch.device) -> SessionPlan:
    """The resolved mode and sizes of a case and the session it runs in (raises
    UnsupportedModeError)."""
    res = resolve_mode(
        case.mode,
        backend_cls.cudagraph_support,
        backend_name=getattr(backend_cls, "name", case.backend_label),
        spec_tokens=case.spec_tokens,
    )
    # vLLM settles the sizes with the mode (resolve_cudagraph_mode_and_sizes): with k > 0 and a
    # FULL decode mode the V1 runner rounds them to multiples of 1 + k.
    capture = resolve_capture_sizes(case.capture_sizes, res.resolved, case.spec_tokens, case.model.capture_style)
    mode, sizes = res.resolved, capture.sizes
    # Not keyed by mode: graphs inside a session are keyed by (runtime mode, size, uniform
    # decode), which every cudagraph mode captures identically, so modes share one session (its
    # KV caches are GBs at production shapes, and building one dominated GPU cases).
    # Static buffers must hold the largest graph the mode captures: with k > 0 a split-mode
    # decode graph (requests * (1 + k) tokens) can lie above the largest capture size.
    top = max(
        (
            s.size
            for s in capture_plan(mode, sizes, case.model.max_num_seqs, uniform_decode_query_len(case.spec_tokens))
        ),
        default=0,
    )
    max_tokens = top if top > max(sizes, default=0) else 0
    k = case.spec_tokens if getattr(backend_cls, "sizes_by_spec_tokens", False) else 0
    key = (
        case.backend,
        case.model,
        case.tp,
        rank,
        case.kv_cache_dtype,
        sizes,
        max_tokens,
        k,
        str(device),
        case.cg_padding,
    )

    def factory() -> Session:
        return Session(
            backend_cls,
            case.model,
            case.tp,
            rank,
            case.kv_cache_dtype,
            sizes,
            device,
            max_tokens=max_tokens,
            spec_tokens=k,
            cg_padding=case.cg_padding,
        )

    layout = TPLayout(case.tp, rank, case.model.num_heads, case.model.num_kv_heads, case.model.head_size)
    config = attention_config(case.model, layout, case.kv_cache_dtype, sizes, device)
    return SessionPlan(
        mode,
        sizes,
        "; ".join(n for n in (res.message, capture.note) if n),
        res.downgraded,
        key,
        factory,
        estimate_bytes(backend_cls, config, case.model.num_layers),
    )


def dispatch_plan(case: Case, mode: CUDAGraphMode, sizes: tuple[int, ...]):
    """A case's step plans, the graph each step dispatches to, and the graph keys they need."""
    q = uniform_decode_query_len(case.spec_tokens)
    plans = plan_steps(case.batch, case.model, sizes, max(case.steps, 1), case.seed, spec_tokens=case.spec_tokens)
    fresh_prefill = family_of(case.attention).fresh_prompts_are_prefills

    def uniform(p) -> bool:  # V2: a row without context (a prompt's first chunk) is not a decode
        return is_uniform_decode(p.query_lens, q) and not (
            fresh_prefill and any(s == ql for ql, s in zip(p.query_lens, p.seq_lens))
        )

    dispatches = [dispatch(mode, p.num_tokens, uniform(p), sizes, case.model.max_num_seqs, q) for p in plans]
    keys = [
        GraphKey(d.runtime_mode, d.padded_tokens, d.uniform_decode, q if d.uniform_decode else 1)
        if d.runtime_mode != "NONE"
        else None
        for d in dispatches
    ]
    return plans, dispatches, keys


def step_graph(key: GraphKey | None) -> str:
    """The graph a step dispatches to, as CaseResult.step_graphs names it ("NONE": eager)."""
    if key is None:
        return "NONE"
    decode = f" decode{f' q{key.query_len}' if key.query_len > 1 else ''}" if key.uniform_decode else ""
    return f"{key.runtime_mode} {key.size}{decode}"
