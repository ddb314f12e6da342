"""What the executor is asked to do: its options (ExecConfig), the deferral of cases whose kernels a
warm-up is still compiling, and which cases share captured graphs. Frozen, Ray-free."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from backend.case import Case
from orchestrator.executor.actors import DEFAULT_RUNNER


@dataclass(frozen=True)
class ExecConfig:
    runner: str = DEFAULT_RUNNER  # "module:function" called per case in the actor
    timeout_s: float | None = None  # overrides Case.timeout_s
    placement_timeout_s: float = 30.0
    setup_timeout_s: float = 120.0  # actor start + rendezvous
    batch_target_s: float = 1.0  # batch cases while their summed estimate stays under this
    max_batch: int = 64
    retries: int = 1
    log_dir: str = ""  # per-actor logs; default a fresh temp dir
    reuse_gangs: bool = True  # split an idle larger gang's actors into the tp needed (no new processes)
    poll_s: float = 0.5
    # What each worker may use of its device (backend/harness/memory.py MemoryBudget's utilization
    # and device_bytes; its share comes from the cluster's workers per GPU): handed to the actors.
    gpu_memory_utilization: float = 0.9
    gpu_memory_bytes: int | None = None
    # Several workers per GPU: what each case was measured to need (case id -> bytes, the store's
    # memory_needs) and the device's size as the run sees it, so that a case needing more than one
    # worker's share runs on a wider worker (packing.slot_width). Empty/None: every tp 1 case one slot.
    memory_needs: Mapping[str, int] = field(default_factory=dict)
    device_bytes: int | None = None
    wait_notice_s: float = 5.0  # a placement pending this long is checked for other drivers' GPUs
    wait_repeat_s: float = 60.0  # how often a run that keeps waiting says so again (sharing.py)


@dataclass(frozen=True)
class Deferral:
    """Cases of these backends go after every other case while `pending()` is true: on a cold
    machine the warm-up helpers are compiling their Triton kernels, so the worker runs the cases
    that need none meanwhile instead of compiling the same kernels itself."""

    backends: frozenset[str]
    pending: Callable[[], bool]


def group_key(case: Case) -> str:
    """Cases that can share captured graphs (same SessionCache entry shapes) on one actor."""
    m = case.model
    family = "" if m.attention == "gqa" else f"{m.attention}{list(m.dims)}|"  # gqa keys as before
    return (
        f"{family}{case.backend}|tp{case.tp}|{case.kv_cache_dtype}|{m.num_heads}x{m.num_kv_heads}x"
        f"{m.head_size}|{m.dtype}|{m.num_layers}|{m.max_model_len}|{len(case.capture_sizes)}"
    )


def config_key(case: Case) -> str:
    """Cases that share eager steps, references and step inputs on one worker: a config's
    cudagraph modes (the same session, batch, speculative tokens, seed, steps and tolerance: the
    harness's eager memo key, backend/harness/checker.py _run_steps). The executor hands them to
    one worker together (Dispatcher.siblings, Attempts.batch)."""
    return (
        f"{group_key(case)}|{case.batch!r}|k{case.spec_tokens}|s{case.seed}|n{case.steps}|"
        f"{case.tolerance!r}|{case.cg_padding!r}"
    )
