"""The checker: one case in, one honest verdict out (DESIGN.md §5; docs/CHECKER.md).

Its parts, one concern each: case_plan.py (a case's resolved mode, session and step dispatch),
environment.py (the versions and device a result records), timing.py (phase marks), scratch.py
(the step's cache snapshot and the capture-write check), step_data.py (step inputs, context fill,
scales, the reference), sides.py (a step's eager and graph sides and their checks), verdict.py (checks to a status).

    run_case(case, rank=0, world_size=1, device=None, sessions=None) -> CaseResult
    merge_rank_results(results) -> CaseResult          # a gang's verdict: the worst rank
    run_case_local(case, device=None) -> CaseResult     # tp 1 here; tp > 1 a local gloo gang

Never raises for anything a case does: exceptions become ERROR with the traceback tail.
Free of Ray: the same function runs in `orch repro`, under pytest and in a Ray actor.
"""

from __future__ import annotations

import gc
import re
import time
import traceback

import torch

from backend.attention.registry import BackendLoadError, class_family_reason, family_reason, get_backend
from backend.attention.support import unavailable
from backend.case import Case
from backend.harness import memory, step_data, steps
from backend.harness.case_plan import dispatch_plan as _dispatch_plan
from backend.harness.case_plan import session_plan as _session_plan
from backend.harness.case_plan import step_graph
from backend.harness.checks import CheckAccumulator
from backend.harness.churn import churn
from backend.harness.distributed import all_gather_objects, gang_id
from backend.harness.environment import default_device, device_label, versions
from backend.harness.memory import OOM_KIND, CaseMemory, gib, is_oom
from backend.harness.model import TPLayout, clear_weights, layout_reasons
from backend.harness.modes import CUDAGraphMode, UnsupportedModeError
from backend.harness.scratch import SCRATCH, capture_checked, mark_scratch, take_snapshot
from backend.harness.session import CaptureFailed, Session, attention_config
from backend.harness.session_cache import SessionCache, SessionTooLarge
from backend.harness.sides import add_step, eager_side, graph_side
from backend.harness.step_data import fill_context, reference_key, set_capture_scales, set_scales, step_inputs
from backend.harness.steps import batch_reasons, hash_seed, make_step_inputs
from backend.harness.timing import DEVICE_PHASES, PHASES, Clock, Span, finish_timings, seconds
from backend.harness.user_frame import user_frame
from backend.harness.verdict import status_of

# The gang verdict lives in a torch-free module (the driver merges rank results without torch);
# re-exported here for the worker side.
from backend.rank_merge import consensus_reason, merge_rank_results, plan_of, rank_consensus
from backend.result import CaseResult, Status, checks_for

__all__ = [
    "PHASES",
    "SessionCache",
    "_dispatch_plan",
    "_session_plan",
    "clear_process_caches",
    "default_device",
    "merge_rank_results",
    "run_case",
    "run_case_local",
    "versions",
    "warm_kernels",
]

LOG_TAIL_CHARS = 4000
# What CUDA/HIP say when a capturing stream meets a device->host sync; the emulation names the op
# itself (backend/graphs/syncs.py), a GPU does not.
CUDA_CAPTURE_SYNC = re.compile(r"stream is capturing|StreamCapture(Unsupported|Invalidated)", re.IGNORECASE)
CUDA_CAPTURE_HINT = (
    "usually a host read of a device tensor in that line: `.item()`, `.tolist()`, `.cpu()`, "
    "`nonzero`, a Python `if` on a tensor"
)
BUDGET_PREFIX = "out of memory budget"  # SessionTooLarge's reason: refused before anything was built


def run_case(
    case: Case,
    *,
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | None = None,
    sessions: SessionCache | None = None,
) -> CaseResult:
    """Run one case on one rank of its tp gang (the gang must already be initialised for tp > 1).

    Device memory is the worker's, not the case's (backend/harness/memory.py): a case that runs
    out of it (eager, capture or replay) is no verdict on the backend. The worker's cached
    sessions and process caches are dropped and, on a single rank, the case runs once more on
    that clean state; only a case that runs out again when alone is ERROR kind `oom`, with its
    measured needs. A gang's ranks cannot rerun alone (their collectives would pair up wrongly):
    their `oom` goes back to the executor, which reruns the case on a fresh gang
    (orchestrator/executor/verdicts.py)."""
    device = torch.device(device) if device is not None else default_device(rank)
    sessions = sessions if sessions is not None else SessionCache(capacity=1)
    result = _run_case(case, rank, world_size, device, sessions)
    if result.error_kind != OOM_KIND or result.reason.startswith(BUDGET_PREFIX):
        return result  # a session over the budget alone is refused before it is built: no rerun
    held = len(sessions)
    sessions.clear()
    clear_process_caches()
    if device.type == "cuda":
        gc.collect()  # what the process caches held in reference cycles (sessions.clear collected before them)
        torch.cuda.empty_cache()
    left = memory.unreleased(device)
    if left > memory.UNRELEASED_LIMIT:
        # Live tensors something still holds, against blocks the allocator could not unmap: which
        # of the two a recycled worker kept is the first thing its fix needs to know.
        live = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        # Nothing of this process is clean any more: the executor recycles the worker and reruns
        # the case on a fresh one (orchestrator/executor/verdicts.py).
        return result.replace(
            reason=f"{result.reason}; the worker could not give back {gib(left)} ({gib(live)} of it in live "
            "tensors) after dropping its sessions: recycled",
            memory={**result.memory, "unreleased": int(left), "unreleased_live": int(live)},
        )
    if world_size != 1:
        return result
    again = _run_case(case, rank, world_size, device, sessions)
    note = f"out of device memory with {held} cached session(s) ({result.reason}); rerun once on a cleared worker"
    if again.error_kind == OOM_KIND:
        needs = again.memory.get("needs") or again.memory.get("peak_allocated")
        budget = again.memory.get("budget")
        why = f"out of memory when alone: needs at least {gib(needs)}" if needs else "out of memory when alone"
        why += f" of a {gib(budget)} budget" if budget else ""
        return again.replace(reason=f"{why} ({again.reason})", log_tail=(note + "\n" + again.log_tail).strip())
    return again.replace(log_tail=(note + "\n" + again.log_tail).strip())


def clear_process_caches() -> None:
    """Forget what this process memoised across cases (references, step inputs, the snapshot
    scratch, the model's weights): the state of a worker that has run nothing yet, but for its
    SessionCache."""
    step_data.REFERENCES.clear()
    clear_weights()
    SCRATCH.clear()
    mark_scratch(None)
    step_data.INPUTS.clear()
    steps.HOST_PARTS.clear()


def warm_kernels(case: Case, *, device: torch.device, sessions: SessionCache) -> bool:
    """Run a tp 1 case's steps for the kernels they launch and nothing else (backend/harness/precompile.py
    warms Triton's cache with it): its session, the graphs its steps dispatch to, and each step's
    eager and graph run, on the session's seeded-garbage caches. No context is drawn or written, no
    snapshot, reference or check: it needs one session's memory. Which kernel specialisations run
    depends on shapes and integer values (the step plans, sizes, metadata), not on the caches'
    contents. False where the case would not run (skip, invalid); raises what the case raises."""
    if family_reason(case.backend, case.attention):
        return False
    backend_cls = get_backend(case.backend, case.attention)
    if class_family_reason(backend_cls, case.backend_label, case.attention):
        return False
    if (
        case.tp != 1
        or backend_cls.unavailable_reason(device)
        or layout_reasons(case.model, 1)
        or batch_reasons(case.batch, case.model)
    ):
        return False
    layout = TPLayout(1, 0, case.model.num_heads, case.model.num_kv_heads, case.model.head_size)
    if backend_cls.unsupported_reasons(
        attention_config(case.model, layout, case.kv_cache_dtype, case.capture_sizes, device)
    ):
        return False
    try:
        plan = _session_plan(case, backend_cls, 0, device)
    except UnsupportedModeError:
        return False
    session = sessions.get(plan.key, plan.factory, device=device, estimate=plan.estimate)
    plans, _, keys = _dispatch_plan(case, plan.mode, plan.sizes)
    set_capture_scales(session, case.kv_cache_dtype)
    session.ensure_graphs({k for k in keys if k is not None})
    for step, key in zip(plans, keys):
        set_scales(case, session, step.index)
        inputs = make_step_inputs(step, case.model, case.seed, session.device, context=False)
        x = inputs.on(session.device).x
        session.run_eager_step(x, inputs.batches)
        if key is not None:
            session.run_graph_step(key, x, inputs.batches, pad_seed=hash_seed(case.seed, step.index, 31))
    if session.device.type == "cuda":
        torch.cuda.synchronize(session.device)
    return True


def _run_case(case: Case, rank: int, world_size: int, device: torch.device, sessions: SessionCache) -> CaseResult:
    base = CaseResult(
        case_id=case.case_id,
        status=Status.ERROR,
        requested_mode=case.mode,
        repro=case.repro_command(),
        axes=case.axes,
        device=_safe(device_label, device),
        versions=versions(),
        provider=case.backend_label,
        worker=f"rank{rank}",
    )
    t_start = time.perf_counter()
    key = None
    memory = CaseMemory(device, sessions.budget)
    t_plan = time.perf_counter()
    sessions.others = (step_data.cached_bytes, step_data.clear_caches)  # beside the sessions, in the budget
    step_data.set_budget(sessions.budget)
    session, built = None, False
    try:
        if world_size != case.tp:
            return base.replace(
                reason=f"invalid case: tp {case.tp} but the gang has {world_size} ranks", error_kind="exception"
            )
        why = family_reason(case.backend, case.attention)
        if why:
            return base.replace(status=Status.SKIP, reason=f"unsupported: {why}")
        try:
            backend_cls = get_backend(case.backend, case.attention)
        except BackendLoadError as e:
            return base.replace(reason=f"backend: {e}", error_kind="exception")
        why = class_family_reason(backend_cls, case.backend_label, case.attention)
        if why:
            return base.replace(status=Status.SKIP, reason=f"unsupported: {why}")
        base = base.replace(provider=getattr(backend_cls, "name", case.backend_label))
        emulated = getattr(backend_cls, "emulated", None)  # what runs in place of a third party's code
        if callable(emulated) and emulated():
            base = base.replace(versions={**base.versions, "emulated": ", ".join(emulated())})
        kernels = getattr(backend_cls, "kernels", None)
        if kernels:  # "emulated": orch's stand-ins ran, not the backend's kernels
            base = base.replace(versions={**base.versions, "kernels": kernels})
        why = backend_cls.unavailable_reason(device)
        if why:
            return base.replace(status=Status.SKIP, reason=unavailable(why))
        reasons = layout_reasons(case.model, case.tp)
        if reasons:
            return base.replace(status=Status.SKIP, reason="unsupported: " + "; ".join(reasons))
        reasons = batch_reasons(case.batch, case.model)
        if reasons:
            return base.replace(reason="invalid case: " + "; ".join(reasons), error_kind="exception")
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
        planned = _dispatch_plan(case, mode, sizes)
        base = base.replace(
            resolved_mode=mode.name, downgraded=plan.downgraded, step_graphs=tuple(step_graph(k) for k in planned[2])
        )
        if world_size > 1:
            # Before any collective of the case: ranks that planned different graphs would pair
            # their collectives wrongly (a hang, or a silent mix). Every rank sees every plan, so
            # all return the same FAIL; the driver's merge checks the plans again (rank_merge).
            check = rank_consensus(all_gather_objects(plan_of(base)))
            if not check.passed:
                return base.replace(status=Status.FAIL, reason=consensus_reason(check), checks=(check,))
        t0 = time.perf_counter()
        built = key not in sessions
        session = sessions.get(key, plan.factory, device=device, estimate=plan.estimate)
        phases: dict[str, list] = {name: [] for name in PHASES}  # spans (Clock), summed at the end
        phases["memory_s"].append(Span(t_start, t_plan))
        phases["plan_s"].append(Span(t_plan, t0))
        # The runner is made on a session's first graph mode: part of the session, in its span (read
        # after it, its 16-30 ms on a CPU were in no phase).
        graph_kind = "none" if mode == CUDAGraphMode.NONE else session.runner.kind
        phases["session_s"].append(Span(t0, time.perf_counter()))
        base = base.replace(graph_kind=graph_kind)
        result = _run_steps(case, session, planned, base, t_start, phases)
        t_figures = time.perf_counter()
        if result.status == Status.ERROR:
            sessions.drop(key)
        figures = memory.figures(session.memory_bytes(), built)
        if "needs" in figures:
            sessions.note_transient(figures["needs"] - figures.get("session", 0))
        t_end = time.perf_counter()
        timings = dict(result.timings)
        timings["memory_s"] = timings.get("memory_s", 0.0) + (t_end - t_figures)
        result = result.replace(
            log_tail=(notes + "\n" + result.log_tail).strip() if notes else result.log_tail, memory=figures
        )
        timings["result_s"] = timings.get("result_s", 0.0) + (time.perf_counter() - t_end)
        return result.replace(timings=finish_timings(timings, time.perf_counter() - t_start))
    except SessionTooLarge as e:
        return base.replace(
            status=Status.ERROR,
            reason=f"{e}",
            error_kind=OOM_KIND,
            memory={**memory.figures(None, False), "needs": e.need},
            timings={"total_s": time.perf_counter() - t_start},
        )
    except Exception as e:  # noqa: BLE001 - the verdict must come back, whatever the case did
        oom = is_oom(e)  # the harness's memory, wherever it ran out: never the backend's verdict
        capture = not oom and (isinstance(e, CaptureFailed) or type(e).__name__ == "GraphCaptureError")
        # A failed capture leaves the session sound (ensure_graphs raises before any step ran; the
        # runner gives the next capture a fresh pool and stream), so later cases keep its caches
        # and graphs. Anything else may have left state half-written: rebuild.
        if key is not None and not capture:
            sessions.drop(key)
        tail = traceback.format_exc()[-LOG_TAIL_CHARS:]
        line = f"{e}".strip().splitlines()[0] if str(e).strip() else type(e).__name__
        # The backend's own line, not orch's frames above it: in the reason every output prints,
        # and last in the log tail (the lines reports keep).
        frame = user_frame(e)
        at = f" ({frame.where()})" if frame is not None else ""
        reason = f"capture error{at}: {line}" if capture else f"{type(e).__name__}{at}: {line}"
        if capture and CUDA_CAPTURE_SYNC.search(line):  # a real GPU's words: say what usually causes them
            reason += f" ({CUDA_CAPTURE_HINT})"
        if frame is not None:
            tail += f"\nfirst frame outside orch: {frame.where()}" + (f"\n    {frame.source}" if frame.source else "")
        kind = OOM_KIND if oom else "capture" if capture else "exception"
        held = session.memory_bytes() if session is not None else None
        return base.replace(
            status=Status.ERROR,
            reason=reason,
            error_kind=kind,
            log_tail=tail,
            timings={"total_s": time.perf_counter() - t_start},
            memory=memory.figures(held, built),
        )


def _safe(fn, *args) -> str:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - a version probe: any failure reads "unknown"
        return "unknown"


def _run_steps(
    case: Case, session: Session, planned: tuple, base: CaseResult, t_start: float, phases: dict[str, list]
) -> CaseResult:
    """`planned`: _dispatch_plan of the resolved mode and sizes."""
    clock = Clock(session.device)
    t_prepare = clock.now()
    shape = case.model
    plans, dispatches, graph_keys = planned
    set_capture_scales(session, case.kv_cache_dtype)  # before capture: scales no step uses (step_data)
    capture_s = capture_checked(
        session, {k for k in graph_keys if k is not None}
    )  # before any snapshot: capture runs the model
    names = checks_for(session.family.extra_checks)
    acc = {name: CheckAccumulator(name) for name in names}
    state = session.family.step_state()
    phases["prepare_s"].append(Span(t_prepare, clock.now()))  # capture_s is taken out of it below
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
            if graph_key is not None:  # GPU: before the snapshot, so nothing it writes is the step's
                churn(session, plan.num_tokens, graph_key.size)
                t_churn = clock.now()
                phases["churn_s"].append(Span(t0, t_churn))
                t0 = t_churn
            ref_key = reference_key(case, session, plan.index)
            inputs = step_inputs(plan, shape, case.seed, session.device)
            set_scales(case, session, plan.index)
            context, ctx_slots = fill_context(
                session, inputs, reference=eager is None and ref_key not in step_data.REFERENCES
            )
            # The state every request starts the step from (after the context fill, before the snapshot).
            prepared = state.prepare(case, session, inputs, plans) if state is not None else None
            if prepared is not None:
                context = prepared.merge(context)
            t1 = clock.now()
            phases["inputs_s"].append(Span(t0, t1))
            snapshot = take_snapshot(
                session.kv_caches, session, ctx_slots
            )  # eager and the graph run both start from it
            t0 = clock.now()
            phases["snapshot_s"].append(Span(t1, t0))
            seen = None
            if eager is None:
                eager = eager_side(case, session, plan, inputs, snapshot, context, clock, phases, ref_key, prepared)
                session.eager_memo.put(memo_key, eager)
                # the eager path's graph side, judged from eager's second run of this very step
                seen = eager.graph_sides.get(dispatched)
            else:
                shared += 1
            del context
            if seen is None:
                seen = graph_side(case, session, plan, d, graph_key, inputs, snapshot, eager, clock, phases, prepared)
                eager.graph_sides[dispatched] = seen
            del snapshot
        eager_s.append(eager.eager_s)
        replay_s.append(seen.replay_s)
        used.append(seen.used)
        add_step(acc, plan.index, eager, seen)
        kv_jitter = kv_jitter or eager.kv_jitter
        attn_jitter = max(attn_jitter, eager.attn_jitter)

    # The spans first: on a GPU resolving them waits for the device, time its phases already count.
    spent = {k: round(seconds(v), 6) for k, v in phases.items()}
    spent["prepare_s"] = max(0.0, spent["prepare_s"] - capture_s)
    t_result = time.perf_counter()
    checks = tuple(acc[name].outcome() for name in names)
    timings = {
        "capture_s": capture_s,
        "eager_step_s": seconds(eager_s) / len(eager_s),
        "replay_step_s": seconds(replay_s) / len(replay_s),
        **spent,
        "eager_shared_steps": float(shared),
        "graph_shared_steps": float(shared_graph),
    }
    status, reason = status_of(
        checks, session.unverifiable(k for k in graph_keys if k is not None), kv_jitter, attn_jitter
    )
    timings["result_s"] = spent["result_s"] + (time.perf_counter() - t_result)
    if clock.events:  # a GPU: the time its own events measured (orchestrator/gpu_share.py)
        timings["device_s"] = capture_s + sum(spent[k] for k in DEVICE_PHASES)
    timings["total_s"] = time.perf_counter() - t_start  # _run_case adds what follows and other_s
    return base.replace(status=status, reason=reason, checks=checks, capture_sizes_used=tuple(used), timings=timings)


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
            return CaseResult(
                case_id=case.case_id,
                status=Status.SKIP,
                requested_mode=case.mode,
                reason=f"unavailable: tp {case.tp} needs {case.tp} GPUs, {torch.cuda.device_count()} here",
                repro=case.repro_command(),
                axes=case.axes,
                versions=versions(),
            )
        dicts = run_local_gang(
            _gang_rank, case.tp, case.to_dict(), device.type, timeout_s=case.timeout_s + 60, device_type=device.type
        )
    except GangError as e:
        return CaseResult(
            case_id=case.case_id,
            status=Status.ERROR,
            reason=f"gang failed: {str(e).splitlines()[0][:300]}",
            error_kind="crash",
            log_tail=str(e)[-LOG_TAIL_CHARS:],
            requested_mode=case.mode,
            repro=case.repro_command(),
            axes=case.axes,
            versions=versions(),
        )
    return merge_rank_results([CaseResult.from_dict(d) for d in dicts])
