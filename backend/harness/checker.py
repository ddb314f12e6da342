"""The checker: one case in, one honest verdict out (DESIGN.md §5; docs/CHECKER.md).

    run_case(case, rank=0, world_size=1, device=None, sessions=None) -> CaseResult
    merge_rank_results(results) -> CaseResult          # a gang's verdict: the worst rank
    run_case_local(case, device=None) -> CaseResult     # tp 1 here; tp > 1 a local gloo gang

Never raises for anything a case does: exceptions become ERROR with the traceback tail.
Free of Ray: the same function runs in `orch repro`, under pytest and in a Ray actor.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import platform
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

import backend
from backend.attention.kv_cache import fp8_dtype, write_kv
from backend.attention.registry import BackendLoadError, get_backend
from backend.attention.support import unavailable
from backend.case import Case
from backend.harness.checks import (CheckAccumulator, Comparison, HeadComparison, all_finite, compare, compare_heads,
                            failure_reason, kv_integrity, max_abs_diff, raw, real_slot_values)
from backend.harness.distributed import gang_id
from backend.host_copy import copy_into
from backend.harness.model import layout_reasons, reference_forward
# The gang verdict lives in a torch-free module (the driver merges rank results without torch);
# re-exported here for the worker side.
from backend.rank_merge import merge_rank_results  # noqa: F401
from backend.harness.modes import (CUDAGraphMode, UnsupportedModeError, capture_plan, dispatch, is_uniform_decode,
                           resolve_capture_sizes, resolve_mode, uniform_decode_query_len)
from backend.harness.reference import fp8_round
from backend.result import (CHECK_ATTN_REFERENCE, CHECK_ATTN_REPLAY, CHECK_DETERMINISM, CHECK_FINITE,
                            CHECK_KV_INTEGRITY, CHECK_NAMES, CHECK_PADDED_FINITE, CHECK_REFERENCE, CHECK_REPLAY,
                            UNVERIFIABLE_PREFIX, CaseResult, Status)
from backend.harness.session import LRU, CaptureFailed, GraphKey, Session, SessionCache, attention_config
from backend.harness.steps import StepInputs, batch_reasons, hash_seed, make_step_inputs, plan_steps

__all__ = ["SessionCache", "merge_rank_results", "run_case", "run_case_local"]

LOG_TAIL_CHARS = 4000
# Where a case's time goes, beyond capture and the timed steps (CaseResult.timings, seconds).
PHASES = ("session_s", "inputs_s", "snapshot_s", "eager_s", "reference_s", "checks_s")
# fp8 scales are drawn per case so a graph that froze an old scale disagrees with eager.
_FP8_SCALE_RANGE = (6.0, 12.0)  # |K|, |V| covered before saturation (inputs are ~N(0, 1))


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    # orch's version from the code that ran (backend/__init__.py), installed or on PYTHONPATH
    out = {"torch": torch.__version__, "python": platform.python_version(), "orch": backend.__version__}
    for label, dist in (("triton", "triton"), ("aiter", "amd-aiter"), ("ray", "ray"), ("vllm", "vllm")):
        try:
            out[label] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def default_device(rank: int = 0) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"{torch.cuda.get_device_name(index)} ({device.type}:{index})"
    return str(device)


class _Clock:
    """Marks between a case's phases (CaseResult.timings). On a GPU a mark is a CUDA event recorded
    on the current stream, never a host sync, so the host queues a step's next work while the
    device still runs the last (#13: these marks were 6,564 synchronize calls, 9 s of the 290-case
    tp 1 slice on the H200); a span between two marks is then the device's time between them,
    read when the case's timings are (its checks have synced by then). On the CPU a mark is
    perf_counter and a span its difference."""

    def __init__(self, device: torch.device):
        self.events = device.type == "cuda"

    def now(self) -> "float | torch.cuda.Event":
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()


class _Span:
    """The time between two marks of a _Clock; float() resolves it (waiting for a GPU event's
    completion once) and keeps the seconds."""

    __slots__ = ("_start", "_end", "_seconds")

    def __init__(self, start, end):
        self._start, self._end, self._seconds = start, end, None

    def __float__(self) -> float:
        if self._seconds is None:
            if isinstance(self._start, float):
                self._seconds = self._end - self._start
            else:
                self._end.synchronize()
                self._seconds = self._start.elapsed_time(self._end) / 1e3
            self._start = self._end = None
        return self._seconds


def _seconds(spans) -> float:
    return sum(float(s) for s in spans)


def run_case(case: Case, *, rank: int = 0, world_size: int = 1, device: torch.device | None = None,
             sessions: SessionCache | None = None) -> CaseResult:
    """Run one case on one rank of its tp gang (the gang must already be initialised for tp > 1).

    Device memory is the worker's, not the case's: when a case runs out of it, the cached sessions
    of earlier cases (GBs of KV cache each at production shapes) are dropped and, on a single rank,
    the case runs once more, so one large case cannot fail the innocent cases after it. A case that
    does not fit an empty device stays an ERROR naming the allocation."""
    device = torch.device(device) if device is not None else default_device(rank)
    sessions = sessions if sessions is not None else SessionCache(capacity=1)
    result = _run_case(case, rank, world_size, device, sessions)
    if result.status == Status.ERROR and _out_of_memory(result) and device.type == "cuda":
        sessions.clear()
        clear_process_caches()
        torch.cuda.empty_cache()
        if world_size == 1:  # a gang's ranks cannot re-run alone: their collectives would pair up wrongly
            again = _run_case(case, rank, world_size, device, sessions)
            note = "out of device memory with cached sessions; re-run on a cleared device"
            return again.replace(log_tail=(note + "\n" + again.log_tail).strip())
    return result


def clear_process_caches() -> None:
    """Forget what this process memoised across cases (references, step inputs, the snapshot
    scratch): the state of a worker that has run nothing yet, but for its SessionCache."""
    _REFERENCES.clear()
    _SCRATCH.clear()
    _mark_scratch(None)
    _INPUTS.clear()


@dataclass(frozen=True)
class _SessionPlan:
    mode: CUDAGraphMode  # resolved
    sizes: tuple[int, ...]  # capture sizes as resolved with the mode
    notes: str  # what resolution changed, for the log
    downgraded: bool
    key: tuple  # the SessionCache key
    factory: Callable[[], Session]


def _session_plan(case: Case, backend_cls, rank: int, device: torch.device) -> _SessionPlan:
    """The resolved mode and sizes of a case and the session it runs in (raises
    UnsupportedModeError)."""
    res = resolve_mode(case.mode, backend_cls.cudagraph_support,
                       backend_name=getattr(backend_cls, "name", case.backend_label), spec_tokens=case.spec_tokens)
    # vLLM settles the sizes with the mode (resolve_cudagraph_mode_and_sizes): with k > 0 and a
    # FULL decode mode the V1 runner rounds them to multiples of 1 + k.
    capture = resolve_capture_sizes(case.capture_sizes, res.resolved, case.spec_tokens, case.model.capture_style)
    mode, sizes = res.resolved, capture.sizes
    # Not keyed by mode: graphs inside a session are keyed by (runtime mode, size, uniform
    # decode), which every cudagraph mode captures identically, so modes share one session (its
    # KV caches are GBs at production shapes, and building one dominated GPU cases).
    # Static buffers must hold the largest graph the mode captures: with k > 0 a split-mode
    # decode graph (requests * (1 + k) tokens) can lie above the largest capture size.
    top = max((s.size for s in capture_plan(mode, sizes, case.model.max_num_seqs,
                                            uniform_decode_query_len(case.spec_tokens))), default=0)
    max_tokens = top if top > max(sizes, default=0) else 0
    k = case.spec_tokens if getattr(backend_cls, "sizes_by_spec_tokens", False) else 0
    key = (case.backend, case.model, case.tp, rank, case.kv_cache_dtype, sizes, max_tokens, k, str(device))

    def factory() -> Session:
        return Session(backend_cls, case.model, case.tp, rank, case.kv_cache_dtype, sizes, device,
                       max_tokens=max_tokens, spec_tokens=k)

    return _SessionPlan(mode, sizes, "; ".join(n for n in (res.message, capture.note) if n), res.downgraded, key,
                        factory)


def _dispatch_plan(case: Case, mode: CUDAGraphMode, sizes: tuple[int, ...]):
    """A case's step plans, the graph each step dispatches to, and the graph keys they need."""
    q = uniform_decode_query_len(case.spec_tokens)
    plans = plan_steps(case.batch, case.model, sizes, max(case.steps, 1), case.seed, spec_tokens=case.spec_tokens)
    dispatches = [dispatch(mode, p.num_tokens, is_uniform_decode(p.query_lens, q), sizes,
                           case.model.max_num_seqs, q) for p in plans]
    keys = [GraphKey(d.runtime_mode, d.padded_tokens, d.uniform_decode, q if d.uniform_decode else 1)
            if d.runtime_mode != "NONE" else None for d in dispatches]
    return plans, dispatches, keys


def warm_kernels(case: Case, *, device: torch.device, sessions: SessionCache) -> bool:
    """Run a tp 1 case's steps for the kernels they launch and nothing else (backend/harness/precompile.py
    warms Triton's cache with it): its session, the graphs its steps dispatch to, and each step's
    eager and graph run, on the session's seeded-garbage caches. No context is drawn or written, no
    snapshot, reference or check: it needs one session's memory. Which kernel specialisations run
    depends on shapes and integer values (the step plans, sizes, metadata), not on the caches'
    contents. False where the case would not run (skip, invalid); raises what the case raises."""
    backend_cls = get_backend(case.backend)
    if case.tp != 1 or backend_cls.unavailable_reason(device) or layout_reasons(case.model, 1) \
            or batch_reasons(case.batch, case.model):
        return False
    from backend.harness.model import TPLayout

    layout = TPLayout(1, 0, case.model.num_heads, case.model.num_kv_heads, case.model.head_size)
    if backend_cls.unsupported_reasons(attention_config(case.model, layout, case.kv_cache_dtype,
                                                        case.capture_sizes, device)):
        return False
    try:
        plan = _session_plan(case, backend_cls, 0, device)
    except UnsupportedModeError:
        return False
    session = sessions.get(plan.key, plan.factory, device=device)
    plans, _, keys = _dispatch_plan(case, plan.mode, plan.sizes)
    session.ensure_graphs({k for k in keys if k is not None})
    _set_scales(case, session)
    for step, key in zip(plans, keys):
        inputs = make_step_inputs(step, case.model, case.seed, session.device, context=False)
        x = inputs.on(session.device).x
        session.run_eager_step(x, inputs.batch)
        if key is not None:
            session.run_graph_step(key, x, inputs.batch, pad_seed=hash_seed(case.seed, step.index, 31))
    if session.device.type == "cuda":
        torch.cuda.synchronize(session.device)
    return True


def _out_of_memory(result: CaseResult) -> bool:
    return "OutOfMemoryError" in result.reason or "out of memory" in result.reason


def _run_case(case: Case, rank: int, world_size: int, device: torch.device, sessions: SessionCache) -> CaseResult:
    base = CaseResult(case_id=case.case_id, status=Status.ERROR, requested_mode=case.mode,
                      repro=case.repro_command(), axes=case.axes, device=_safe(device_label, device),
                      versions=versions(), provider=case.backend_label, worker=f"rank{rank}")
    t_start = time.perf_counter()
    key = None
    try:
        if world_size != case.tp:
            return base.replace(reason=f"invalid case: tp {case.tp} but the gang has {world_size} ranks",
                                error_kind="exception")
        try:
            backend_cls = get_backend(case.backend)
        except BackendLoadError as e:
            return base.replace(reason=f"backend: {e}", error_kind="exception")
        base = base.replace(provider=getattr(backend_cls, "name", case.backend_label))
        emulated = getattr(backend_cls, "emulated", None)  # what runs in place of a third party's code
        if callable(emulated) and emulated():
            base = base.replace(versions={**base.versions, "emulated": ", ".join(emulated())})
        why = backend_cls.unavailable_reason(device)
        if why:
            return base.replace(status=Status.SKIP, reason=unavailable(why))
        reasons = layout_reasons(case.model, case.tp)
        if reasons:
            return base.replace(status=Status.SKIP, reason="unsupported: " + "; ".join(reasons))
        reasons = batch_reasons(case.batch, case.model)
        if reasons:
            return base.replace(reason="invalid case: " + "; ".join(reasons), error_kind="exception")
        from backend.harness.model import TPLayout

        layout = TPLayout(case.tp, rank, case.model.num_heads, case.model.num_kv_heads, case.model.head_size)
        config = attention_config(case.model, layout, case.kv_cache_dtype, case.capture_sizes, device)
        reasons = backend_cls.unsupported_reasons(config)
        if reasons:
            return base.replace(status=Status.SKIP, reason="unsupported: " + "; ".join(reasons))
        try:
            plan = _session_plan(case, backend_cls, rank, device)
        except UnsupportedModeError as e:
            return base.replace(status=Status.SKIP, reason=f"unsupported: {e}")
        mode, sizes, notes, key = plan.mode, plan.sizes, plan.notes, plan.key
        base = base.replace(resolved_mode=mode.name, downgraded=plan.downgraded)
        t0 = time.perf_counter()
        session = sessions.get(key, plan.factory, device=device)
        phases: dict[str, list] = {name: [] for name in PHASES}  # spans (_Clock), summed at the end
        phases["session_s"].append(_Span(t0, time.perf_counter()))
        graph_kind = "none" if mode == CUDAGraphMode.NONE else session.runner.kind
        base = base.replace(graph_kind=graph_kind)
        result = _run_steps(case, session, mode, sizes, base, t_start, phases)
        if result.status == Status.ERROR:
            sessions.drop(key)
        return result.replace(log_tail=(notes + "\n" + result.log_tail).strip() if notes else result.log_tail)
    except Exception as e:  # noqa: BLE001 - the verdict must come back, whatever the case did
        capture = isinstance(e, CaptureFailed) or type(e).__name__ == "GraphCaptureError"
        # A failed capture leaves the session sound (ensure_graphs raises before any step ran; the
        # runner gives the next capture a fresh pool and stream), so later cases keep its caches
        # and graphs. Anything else may have left state half-written: rebuild.
        if key is not None and not capture:
            sessions.drop(key)
        tail = traceback.format_exc()[-LOG_TAIL_CHARS:]
        line = f"{e}".strip().splitlines()[0] if str(e).strip() else type(e).__name__
        reason = f"capture error: {line}" if capture else f"{type(e).__name__}: {line}"
        return base.replace(status=Status.ERROR, reason=reason, error_kind="capture" if capture else "exception",
                            log_tail=tail, timings={"total_s": time.perf_counter() - t_start})


def _padded_rows(session: Session, key: GraphKey, n: int) -> torch.Tensor | None:
    """The padded output rows [size - n, hidden] of the FULL graph just replayed (its static
    output, valid until the next replay), or None. Piecewise graphs run attention on real rows
    only, so their padded rows are not the backend's output and are not checked."""
    graph = getattr(session.graphs.get(key), "graph", None)
    out = getattr(graph, "outputs", None)
    return out[n:key.size] if isinstance(out, torch.Tensor) else None


def _safe(fn, *args) -> str:
    try:
        return fn(*args)
    except Exception:
        return "unknown"


def _set_scales(case: Case, session: Session) -> None:
    gen = torch.Generator().manual_seed(hash_seed(case.seed, 977))
    fp8 = case.kv_cache_dtype == "fp8"
    fmax = torch.finfo(fp8_dtype(session.device)).max if fp8 else 1.0
    lo, hi = _FP8_SCALE_RANGE
    for ks, vs in zip(session.model.k_scales, session.model.v_scales):
        for t in (ks, vs):
            value = (lo + (hi - lo) * torch.rand(1, generator=gen)) / fmax if fp8 else torch.ones(1)
            copy_into(t, value)  # in place: graphs hold these tensors


def _fill_context(session: Session, inputs: StepInputs, reference: bool = True
                  ) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]], torch.Tensor]:
    """Write every request's context K/V into the rank's caches through the providers' KV write
    (kv_cache.write_kv, which every provider's forward uses for new tokens: its quantiser is under
    test for the context too); return the context as the reference's own fp8 rounding sees it
    (fp32, all kv heads; empty lists when `reference` is False). One write per layer and K/V for
    the whole batch. Also returns the slots written (int64, on the device)."""
    heads = session.layout.kv_heads  # a range: the rank's kv heads are a slice (a view, no copy)
    kv_heads = slice(heads.start, heads.stop)
    lens = [int(t.numel()) for t in inputs.ctx_slots]
    slots = inputs.on(session.device).ctx_slots
    ref_k, ref_v = [], []
    for layer, cache in enumerate(session.kv_caches):
        scales = (session.model.k_scales[layer], session.model.v_scales[layer])
        # make_step_inputs keeps the unsplit draw: one KV write per layer, no cat of its views
        values = [inputs.ctx_k_flat[layer], inputs.ctx_v_flat[layer]]
        if slots.numel():
            write_kv(cache, values[0][:, kv_heads], values[1][:, kv_heads], slots, *scales)
        for out, v, scale in zip((ref_k, ref_v), values, scales):
            out.append(list(torch.split(fp8_round(v, scale, cache.dtype), lens)) if reference else [])
    return ref_k, ref_v, slots


def _reference(case: Case, session: Session, inputs: StepInputs, ref_k, ref_v
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference output [T, hidden] fp32 and its attention outputs [layers, T, H, D] (every
    head; kept in the model dtype, which holds them exactly: the reference rounds them to it)."""
    cache_dtype = session.kv_caches[0].dtype
    scales = {"k": session.model.k_scales, "v": session.model.v_scales}

    def kv_round(layer: int, which: str, t: torch.Tensor) -> torch.Tensor:
        return fp8_round(t, scales[which][layer], cache_dtype)

    q_scale = _query_scale(session)
    q_round = None if q_scale is None else (lambda layer, q: fp8_round(q, q_scale, cache_dtype))

    # On the session's device (fp32): GPU shapes would make a host reference the slowest part.
    attn: list[torch.Tensor] = []
    out = reference_forward(session.reference_weights, case.model, inputs.on(session.device).x, ref_k, ref_v,
                            inputs.plan.query_lens, kv_round, attn, q_round=q_round)
    return out, torch.stack(attn).to(getattr(torch, case.model.dtype))


@dataclass
class _EagerStep:
    """One step's eager side, shared by every cudagraph mode of a (batch, seed): modes share a
    session, and the eager output, the reference check and determinism do not depend on the mode
    (dispatch only decides how the graph side runs). Kept in Session.eager_memo."""

    out: torch.Tensor  # eager output [T, hidden]
    attention: torch.Tensor  # eager attention outputs [layers, T, Hl, D]
    reference: Comparison  # eager vs the fp32 reference
    attn_reference: HeadComparison  # eager attention vs the reference's, per head
    finite: Comparison
    deterministic: bool
    jitter: float  # max |eager - eager again| on the output (0 when bitwise equal; inf for NaN)
    attn_jitter: float  # the same on the attention outputs
    kv_jitter: bool  # the two eager runs left different real-slot bytes
    real_kv: list[torch.Tensor]  # per layer: the cache at the step's real slots after eager
    eager_s: "_Span"  # the first eager run (float() gives seconds)
    # The graph sides compared with this eager side, by (runtime mode, graph key): they go when it
    # goes (an eager side evicted and computed again starts with none).
    graph_sides: dict = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class _GraphStep:
    """One step's graph side as the checks saw it (outcomes only, no tensors), shared by the
    cudagraph modes that dispatch the step to the same runtime path: FULL, FULL_DECODE_ONLY and
    FULL_AND_PIECEWISE replay one FULL graph for a uniform decode step; FULL_DECODE_ONLY runs a
    mixed step eagerly as NONE does, FULL_AND_PIECEWISE through the piecewise graphs as PIECEWISE
    does. Same session (caches, builder, graphs), same inputs, same path: the same outcome, so a
    later mode reuses it (kept on the step's _EagerStep) as every mode reuses the eager side."""

    replay: Comparison  # graph output vs eager
    attn_replay: HeadComparison
    finite: Comparison  # of the graph output
    padded: Comparison | None  # the FULL graph's padded rows, when it had some
    padded_detail: str
    detail: str  # "FULL graph of 8 tokens for 7"
    used: int  # the graph's size (0: eager)
    replay_s: "_Span"
    kv_ok: bool
    kv_detail: str


def _add_step(acc: dict[str, CheckAccumulator], step: int, eager: _EagerStep, g: _GraphStep) -> None:
    """One step's outcomes into the checks' accumulators."""
    acc[CHECK_REFERENCE].add_comparison(step, eager.reference)
    acc[CHECK_REPLAY].add_comparison(step, g.replay, record_bitwise=True, detail=g.detail)
    _add_heads(acc[CHECK_ATTN_REFERENCE], step, eager.attn_reference)
    _add_heads(acc[CHECK_ATTN_REPLAY], step, g.attn_replay, record_bitwise=True, detail=g.detail)
    fe, fg = eager.finite, g.finite
    bad = fe if not fe.ok else fg
    acc[CHECK_FINITE].add(step, fe.ok and fg.ok, mismatch=max(fe.mismatch_frac, fg.mismatch_frac),
                          first_bad=bad.first_bad, detail="eager" if not fe.ok else "graph")
    if g.padded is not None:
        acc[CHECK_PADDED_FINITE].add(step, g.padded.ok, mismatch=g.padded.mismatch_frac,
                                     first_bad=g.padded.first_bad, detail=g.padded_detail)
    acc[CHECK_KV_INTEGRITY].add(step, g.kv_ok, detail=g.kv_detail)
    acc[CHECK_DETERMINISM].add(step, eager.deterministic, max_abs=eager.jitter,
                               detail=f"two eager runs differ (max_abs {eager.jitter:.3g}"
                                      f"{', and their KV writes' if eager.kv_jitter else ''})")


# Reference outputs of recent steps, per process. The reference is the unsharded fp32 model on the
# step's inputs: it depends on the shape, kv dtype (how new K/V are rounded), batch, seed and step,
# not on the backend, mode or tp rank, so every backend's eager output of a step is checked
# against one computation of it (~0.3 s per step of a 200-request decode batch on the H200).
# Bounded by bytes (an entry is the step's output and attention outputs: KBs on the CPU shape, up
# to ~13 MB at the GPU's): at 64 entries the 290-case tp 1 GPU slice, whose providers run their
# batches interleaved, evicted most of them before the next provider came back to the same step
# (aiter-triton-pa recomputed 1.9 s of references, #13).
REFERENCES_BYTES = 2 * 2**30
_REFERENCES = LRU(REFERENCES_BYTES, size=lambda ref: sum(t.numel() * t.element_size() for t in ref))


# The step's cache snapshot is scratch (restored from by the eager side, consumed by kv_integrity,
# discarded after the step): one set of per-layer buffers per process, refilled in place each step
# instead of a fresh clone (half the cost on the CPU, where a fresh allocation of this size is
# page-faulted in every time; no allocator churn of GBs per step on a GPU). Keyed by the caches'
# shapes, dtypes and device: a session of another shape or kv dtype replaces it.
_SCRATCH: dict[tuple, list[torch.Tensor]] = {}
# The session whose caches the scratch equals byte for byte (a weak reference), or None. A step
# that passes kv_integrity's "nothing changed outside the real slots" leaves the scratch equal to
# the caches (kv_integrity copies the real slots into it and compares the rest), so the next
# step's snapshot only needs the slots its context fill wrote, not a whole-cache copy (#13: 4.3 GB
# a step at full.yaml's GPU shape). Anything else that may write the caches (a capture, a step
# that wrote outside its slots, an exception, another session on the same buffers) leaves None.
_SCRATCH_OWNER: list = [None]
# Above this fraction of the cache's slots, one contiguous copy is cheaper than gather + scatter.
_PARTIAL_SNAPSHOT_MAX = 0.25


def _scratch_in_sync(session: Session) -> bool:
    owner = _SCRATCH_OWNER[0]
    return owner is not None and owner() is session


def _mark_scratch(session: Session | None) -> None:
    _SCRATCH_OWNER[0] = weakref.ref(session) if session is not None else None


def _snapshot(caches: list[torch.Tensor], session: Session | None = None,
              written: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The caches' state now, in the scratch buffers. With `session` whose caches the scratch
    still equals but for the slots `written` (int64, on the caches' device), only those are copied."""
    key = tuple((tuple(c.shape), c.dtype, str(c.device)) for c in caches)
    bufs = _SCRATCH.get(key)
    in_sync = session is not None and written is not None and _scratch_in_sync(session) and bufs is not None
    _mark_scratch(None)  # until the step that uses it has verified it again
    if bufs is None:
        _SCRATCH.clear()  # before allocating: one copy of the caches at a time
        bufs = _SCRATCH[key] = [torch.empty_like(c, memory_format=torch.contiguous_format) for c in caches]
    num_slots = caches[0].shape[1] * caches[0].shape[2]
    partial = in_sync and written.numel() <= _PARTIAL_SNAPSHOT_MAX * num_slots and all(c.is_contiguous() for c in caches)
    for b, c in zip(bufs, caches):
        if partial:
            if written.numel():
                b.view(2, num_slots, -1)[:, written] = c.view(2, num_slots, -1)[:, written]
        else:
            b.copy_(c)
    return bufs


# Step inputs of recent steps, per process. They are a function of (step plan, model shape, seed,
# device) only, so the five cudagraph modes, both kv dtypes and every backend of one (batch, seed)
# draw the same ones: drawn once (the context K/V draw was a fifth of a rank's case time on the
# 2-core machine, #13). Read-only for every user (the KV write, the runs and the reference copy
# out of them). Bounded by bytes, by device: on the CPU 256 MB (entries up to 32 MB, so the small
# batches share theirs); on a GPU a fifth of the device's memory, entries up to a quarter of that
# (full.yaml's GPU shape draws 32 GB of context over its 45 distinct steps, 6.4 GB for one
# decode_200 step: at 256 MB every GPU case drew its own, 11 s of the 290-case tp 1 run's 40 s).
_INPUTS_BYTES = 256 * 2**20
GPU_INPUTS_FRACTION = 5  # of the device's total memory


def new_inputs_cache(budget: int = _INPUTS_BYTES, max_entry: int | None = None) -> LRU:
    """Step inputs by (plan, shape, seed, device), at most `budget` bytes; an entry above
    `max_entry` (default budget / 8) is not kept (it would evict the small batches that share theirs)."""
    return LRU(budget, size=lambda inputs: inputs.nbytes,
               max_item=budget // 8 if max_entry is None else max_entry)


_INPUTS = new_inputs_cache()
_INPUTS_SIZED_FOR_GPU = False


def _inputs_cache_for(device: torch.device) -> LRU:
    """The process's step-inputs cache, sized for `device` the first time a GPU uses it (a worker
    has one device; CPU workers keep the default)."""
    global _INPUTS, _INPUTS_SIZED_FOR_GPU
    if device.type == "cuda" and not _INPUTS_SIZED_FOR_GPU:
        budget = torch.cuda.get_device_properties(device).total_memory // GPU_INPUTS_FRACTION
        _INPUTS = new_inputs_cache(budget, max_entry=budget // 4)
        _INPUTS_SIZED_FOR_GPU = True
    return _INPUTS


def _step_inputs(plan, shape, seed: int, device: torch.device) -> StepInputs:
    cache = _inputs_cache_for(device)
    key = (plan, shape, seed, str(device))
    inputs = cache.get(key)
    if inputs is None:
        inputs = make_step_inputs(plan, shape, seed, device)
        cache.put(key, inputs)  # not kept when above the cache's max_item
    return inputs


def _query_scale(session: Session) -> float | None:
    """The static scale with which the backend rounds its query to the cache's fp8 before
    attention (`query_fp8_scale()` on its Impl: vLLM's layer quantises the query for an Impl that
    declares supports_quant_query_input), or None: the query stays in the model dtype."""
    fn = getattr(session.impl, "query_fp8_scale", None)
    return fn() if callable(fn) else None


def _reference_key(case: Case, session: Session, step: int) -> tuple:
    return (case.model, case.kv_cache_dtype, case.batch, case.spec_tokens, case.seed, case.steps,
            session.capture_sizes, step,  # the step plan depends on the (resolved) sizes
            str(session.device), session.kv_caches[0].dtype, _query_scale(session))


def _eager_side(case: Case, session: Session, inputs: StepInputs, snapshot: list[torch.Tensor], ref_k, ref_v,
                clock: "_Clock", phases: dict[str, list], ref_key: tuple) -> _EagerStep:
    """Eager twice from the caches' state `snapshot` (determinism), the reference, and what eager
    wrote; leaves the caches as `snapshot` again."""
    caches = session.kv_caches
    on_device = inputs.on(session.device)
    real_slots, x = on_device.real_slots, on_device.x
    t1 = clock.now()
    first = session.run_eager_step(x, inputs.batch)
    out_e = first.out
    t2 = clock.now()
    real_kv = [real_slot_values(c, real_slots) for c in caches]
    for c, s in zip(caches, snapshot):
        c.copy_(s)
    second = session.run_eager_step(x, inputs.batch)
    same_out = torch.equal(raw(out_e), raw(second.out)) and torch.equal(raw(first.attention), raw(second.attention))
    kv_jitter = not all(torch.equal(raw(real_slot_values(c, real_slots)), raw(r)) for c, r in zip(caches, real_kv))
    jitter, attn_jitter = (0.0, 0.0) if same_out else (max_abs_diff(out_e, second.out),
                                                      max_abs_diff(first.attention, second.attention))
    deterministic = same_out and not kv_jitter
    for c, s in zip(caches, snapshot):
        c.copy_(s)
    t3 = clock.now()
    ref = _REFERENCES.get(ref_key)
    if ref is None:
        ref = _reference(case, session, inputs, ref_k, ref_v)
        _REFERENCES.put(ref_key, ref)
    ref_out, ref_attn = ref
    reference = compare(out_e, ref_out, case.tolerance, case.model.head_size, row_scaled_atol=True)
    heads = session.layout.q_heads
    attn_reference = compare_heads(first.attention, ref_attn[:, :, heads.start:heads.stop], case.tolerance,
                                   head_offset=heads.start)
    t4 = clock.now()
    phases["eager_s"].append(_Span(t1, t3))
    phases["reference_s"].append(_Span(t3, t4))
    return _EagerStep(out_e, first.attention, reference, attn_reference, all_finite(out_e, case.model.head_size),
                      deterministic, jitter, attn_jitter, kv_jitter, real_kv, _Span(t1, t2))


def _graph_side(case: Case, session: Session, plan, d, graph_key, inputs: StepInputs, snapshot: list[torch.Tensor],
                eager: _EagerStep, clock: "_Clock", phases: dict[str, list]) -> _GraphStep:
    """Run the step as the mode dispatches it (eager for NONE, else replay `graph_key`) from the
    caches' state `snapshot` and check it against the eager side."""
    shape, tol = case.model, case.tolerance
    caches = session.kv_caches
    on_device = inputs.on(session.device)
    x = on_device.x
    t1 = clock.now()
    padded = None
    if d.runtime_mode == "NONE":
        graph_side = session.run_eager_step(x, inputs.batch)
        used = 0
    else:
        graph_side = session.run_graph_step(graph_key, x, inputs.batch, pad_seed=hash_seed(case.seed, plan.index, 31))
        used = d.padded_tokens
        padded = _padded_rows(session, graph_key, x.shape[0])
    t2 = clock.now()
    out_g = graph_side.out
    replay = compare(out_g, eager.out, tol, shape.head_size, row_scaled_atol=True)
    attn_replay = compare_heads(graph_side.attention, eager.attention, tol, head_offset=session.layout.q_heads.start)
    finite = all_finite(out_g, shape.head_size)
    fp = all_finite(padded, shape.head_size) if padded is not None and padded.shape[0] else None
    real_slots = on_device.real_slots
    kv_ok, kv_detail, outside_ok = True, "", True
    for layer, (after, before, eager_real) in enumerate(zip(caches, snapshot, eager.real_kv)):
        k = kv_integrity(after, before, eager_real, real_slots,
                         (session.model.k_scales[layer], session.model.v_scales[layer]), tol)
        outside_ok = outside_ok and not k.outside_changed
        if not k.ok and kv_ok:
            kv_ok = False
            kv_detail = (f"layer {layer}: {k.outside_changed} slots written outside the step's "
                         f"{real_slots.numel()} real slots (first slot {k.first_outside})"
                         if k.outside_changed else
                         f"layer {layer}: real slots differ from eager (max_abs {k.real_max_abs:.3g})")
    if outside_ok:  # kv_integrity left the scratch equal to the caches (_SCRATCH_OWNER)
        _mark_scratch(session)
    phases["checks_s"].append(_Span(t2, clock.now()))
    return _GraphStep(
        replay=replay, attn_replay=attn_replay, finite=finite, padded=fp,
        padded_detail=f"padded row {x.shape[0] + fp.first_bad[0]} of the {d.padded_tokens}-token graph"
                      if fp is not None and fp.first_bad else "",
        detail=f"{d.runtime_mode} graph of {d.padded_tokens} tokens for {plan.num_tokens}",
        used=used, replay_s=_Span(t1, t2), kv_ok=kv_ok, kv_detail=kv_detail)


def _run_steps(case: Case, session: Session, mode: CUDAGraphMode, sizes: tuple[int, ...], base: CaseResult,
               t_start: float, phases: dict[str, list]) -> CaseResult:
    """`sizes`: the capture sizes after resolution (resolve_capture_sizes), not case.capture_sizes."""
    clock = _Clock(session.device)
    shape = case.model
    plans, dispatches, graph_keys = _dispatch_plan(case, mode, sizes)
    capture_s = session.ensure_graphs({k for k in graph_keys if k is not None})  # before any snapshot: capture runs the model
    if capture_s:
        _mark_scratch(None)  # capture ran the model on the caches
    _set_scales(case, session)
    acc = {name: CheckAccumulator(name) for name in CHECK_NAMES}
    eager_s, replay_s, used, shared, shared_graph = [], [], [], 0, 0
    again = case.case_id in session.cases_run  # a case run again reuses no graph side
    session.cases_run.add(case.case_id)
    kv_jitter, attn_jitter = False, 0.0
    for plan, d, graph_key in zip(plans, dispatches, graph_keys):
        t0 = clock.now()
        # gang_id: a rank reuses what it memoised only in the gang it memoised it in (a reuse skips
        # collectives; every rank of the gang must skip them alike).
        memo_key = (case.batch, case.spec_tokens, case.seed, case.steps, case.tolerance, plan.index, gang_id())
        eager = session.eager_memo.get(memo_key)
        dispatched = (d.runtime_mode, graph_key)
        seen = eager.graph_sides.get(dispatched) if eager is not None and not again else None
        if seen is not None:
            # An earlier mode of this batch ran this step down the same path (the same graph, or
            # eager for NONE) from the same inputs in this session: its outcome is this step's.
            shared, shared_graph = shared + 1, shared_graph + 1
        else:
            ref_key = _reference_key(case, session, plan.index)
            inputs = _step_inputs(plan, shape, case.seed, session.device)
            ref_k, ref_v, ctx_slots = _fill_context(session, inputs,
                                                    reference=eager is None and ref_key not in _REFERENCES)
            t1 = clock.now()
            phases["inputs_s"].append(_Span(t0, t1))
            snapshot = _snapshot(session.kv_caches, session, ctx_slots)  # eager and the graph run both start from it
            t0 = clock.now()
            phases["snapshot_s"].append(_Span(t1, t0))
            if eager is None:
                eager = _eager_side(case, session, inputs, snapshot, ref_k, ref_v, clock, phases, ref_key)
                session.eager_memo.put(memo_key, eager)
            else:
                shared += 1
            del ref_k, ref_v
            seen = _graph_side(case, session, plan, d, graph_key, inputs, snapshot, eager, clock, phases)
            eager.graph_sides[dispatched] = seen
            del snapshot
        eager_s.append(eager.eager_s)
        replay_s.append(seen.replay_s)
        used.append(seen.used)
        _add_step(acc, plan.index, eager, seen)
        kv_jitter = kv_jitter or eager.kv_jitter
        attn_jitter = max(attn_jitter, eager.attn_jitter)

    checks = tuple(acc[name].outcome() for name in CHECK_NAMES)
    spent = {k: round(_seconds(v), 6) for k, v in phases.items()}  # resolves the spans first
    timings = {
        "capture_s": capture_s,
        "eager_step_s": _seconds(eager_s) / len(eager_s),
        "replay_step_s": _seconds(replay_s) / len(replay_s),
        "total_s": time.perf_counter() - t_start,
        **spent,
        "eager_shared_steps": float(shared),
        "graph_shared_steps": float(shared_graph),
    }
    failed = [c for c in checks if not c.passed]
    common = dict(checks=checks, capture_sizes_used=tuple(used), timings=timings)
    # The CPU emulation could not follow these graphs (a launch behind the dispatcher): it cannot
    # vouch for a pass, nor for a failure of the graph side alone; counted apart (gate.py, #32).
    notes = session.unverifiable(k for k in graph_keys if k is not None)
    if notes and all(_graph_only(c) for c in failed):
        also = f"; graph-side checks failed: {', '.join(c.name for c in failed)}" if failed else ""
        return base.replace(status=Status.PASS, reason=UNVERIFIABLE_PREFIX + notes[0] + also, **common)
    if not failed:
        return base.replace(status=Status.PASS, reason="", **common)
    det = next((c for c in failed if c.name == CHECK_DETERMINISM), None)
    real = [c for c in failed if c.name != CHECK_DETERMINISM
            and not (det and _explained_by_jitter(c, det, kv_jitter, attn_jitter))]
    if real:
        note = f" (eager also not deterministic, max_abs {det.max_abs_err:.3g})" if det else ""
        return base.replace(status=Status.FAIL, reason=failure_reason(real[0]) + note, **common)
    others = [c.name for c in failed if c.name != CHECK_DETERMINISM]
    note = f" (also failed: {', '.join(others)})" if others else ""
    return base.replace(status=Status.FLAKY, reason=f"eager not deterministic at step {det.step}{note}", **common)


def _graph_only(check) -> bool:
    """A failure of the graph run's values alone (eager and the reference agree); a write outside
    the real slots is never one of these."""
    return check.name in (CHECK_REPLAY, CHECK_ATTN_REPLAY, CHECK_PADDED_FINITE) or \
        (check.name == CHECK_FINITE and check.detail == "graph") or \
        (check.name == CHECK_KV_INTEGRITY and "outside" not in check.detail)


# A check failure counts as eager jitter only when its error is within this factor of the jitter
# measured between two eager runs: a wrong kernel that also jitters by an ulp must stay FAIL.
JITTER_FACTOR = 4.0


def _explained_by_jitter(check, det, kv_jitter: bool, attn_jitter: float = 0.0) -> bool:
    """Whether a failed check could be the nondeterminism `det` measured rather than a bug
    (`attn_jitter`: the same measure on the attention outputs, for the per-head checks)."""
    if check.name in (CHECK_FINITE, CHECK_PADDED_FINITE):
        return False  # NaN/Inf is never rounding jitter
    if check.name == CHECK_KV_INTEGRITY:
        return kv_jitter and "outside" not in check.detail  # writes outside the real slots are a bug
    if check.max_abs_err is None or det.max_abs_err is None:
        return False
    jitter = attn_jitter if check.name in (CHECK_ATTN_REFERENCE, CHECK_ATTN_REPLAY) else det.max_abs_err
    return check.max_abs_err <= JITTER_FACTOR * jitter


def _add_heads(acc: CheckAccumulator, step: int, h: HeadComparison, *, record_bitwise: bool = False,
               detail: str = "") -> None:
    """A per-head attention comparison into its accumulator; the failing layer and the worst head
    go in the detail."""
    where = f"layer {h.layer}, worst head {h.worst_head}" if h.layer is not None else ""
    acc.add_comparison(step, h.comparison, record_bitwise=record_bitwise,
                       detail=", ".join(p for p in (where, detail) if p))



def _gang_rank(rank: int, world_size: int, case_dict: dict, device_type: str) -> dict:
    case = Case.from_dict(case_dict)
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    return run_case(case, rank=rank, world_size=world_size, device=device).to_dict()


def run_case_local(case: Case, *, device: torch.device | None = None) -> CaseResult:
    """tp 1: in this process. tp > 1: a local gang of tp spawned processes (gloo on CPU, NCCL
    on cuda:0..tp-1), merged. A gang that dies becomes ERROR (error_kind "crash")."""
    device = torch.device(device) if device is not None else default_device()
    if case.tp <= 1:
        return run_case(case, device=device)
    from backend.harness.distributed import GangError, run_local_gang

    try:
        if device.type == "cuda" and torch.cuda.device_count() < case.tp:
            return CaseResult(case_id=case.case_id, status=Status.SKIP, requested_mode=case.mode,
                              reason=f"unavailable: tp {case.tp} needs {case.tp} GPUs, {torch.cuda.device_count()} here",
                              repro=case.repro_command(), axes=case.axes, versions=versions())
        dicts = run_local_gang(_gang_rank, case.tp, case.to_dict(), device.type, timeout_s=case.timeout_s + 60,
                               device_type=device.type)
    except GangError as e:
        return CaseResult(case_id=case.case_id, status=Status.ERROR, reason=f"gang failed: {str(e).splitlines()[0][:300]}",
                          error_kind="crash", log_tail=str(e)[-LOG_TAIL_CHARS:], requested_mode=case.mode,
                          repro=case.repro_command(), axes=case.axes, versions=versions())
    return merge_rank_results([CaseResult.from_dict(d) for d in dicts])
