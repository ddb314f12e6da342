"""The worker actor: one per GPU (or CPU slot), long-lived, runs batches of cases.

The actor redirects its own stdout/stderr (fd level, so C++/CUDA messages too) to a log file the
driver can read after a crash. It resolves its runner by import path (default the checker), keeps
one SessionCache so captured graphs are reused across cases that share shapes, and never raises
for a case: an exception becomes an ERROR CaseResult. What it cannot survive (os._exit, segfault,
a hang) the driver handles from outside (executor.py).
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.scheduling.policy import WARM_GROUPS

DEFAULT_RUNNER = "backend.harness.checker:run_case"
# Multicast paths have broken NCCL on the lent machines; every actor runs without them.
ACTOR_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CPU_ACTOR_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# The torch threads a worker runs (intra-op; inter-op the same, at most 4): its share of its node's
# cores (threads.worker_threads), set by the driver in actor_env and applied by limit_threads.
THREADS_ENV = "ORCH_WORKER_THREADS"
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
MAX_INTEROP = 4
LOG_TAIL_BYTES = 4000
# Modules Ray's worker processes import before they take an actor (the raylet's
# `preload_python_modules`, set by cluster.connect for the embedded cluster; a cluster started with
# `ray start` takes it from RAY_preload_python_modules). It pays on a head kept running: its idle
# workers imported torch long before a run asks for an actor; in an embedded run the import still
# lands inside the first actor's start (docs/BENCHMARKS.md). Nothing here may touch a device: the
# worker does not know its GPU yet, and CPU workers set their thread count in CaseWorker._load.
WORKER_PRELOAD = ("torch",)
# The driver's settings the actors take over when the driver has them: a joined cluster's workers
# are its nodes' processes, with the nodes' environment, so without this a run into a head kept
# running compiled every Triton kernel again in the head's default cache, not in the warm cache
# the driver named (docs/BENCHMARKS.md).
# ORCH_VLLM: the vLLM release the driver imports (backend/adapters/vllm/release.py), the workers' too.
FORWARDED_ENV = ("TRITON_CACHE_DIR", "TRITON_HOME", "ORCH_VLLM")


@dataclass(frozen=True)
class WorkerInfo:
    label: str  # e.g. "gpu3@10.0.0.5" or "cpu-w2"; goes into CaseResult.worker
    node_id: str
    ip: str
    pid: int
    accelerator_ids: tuple[str, ...]  # physical GPU ids Ray gave us
    device: str  # "cuda:0" (of the visible set) or "cpu"
    log_path: str
    free_port: int = 0  # a port free on this node (rank 0 of a gang offers it for the rendezvous)
    preloaded: tuple[str, ...] = ()  # WORKER_PRELOAD modules already imported when the actor started


def actor_env(device_kind: str, threads: int = 1) -> dict[str, str]:
    """Environment the actor sets on itself first thing in __init__ (before anything imports
    torch or NCCL reads it). Not a Ray runtime_env: an actor with its own runtime_env cannot use
    Ray's prestarted workers and waits for the runtime-env agent (seconds per gang:
    docs/EXECUTION.md). FORWARDED_ENV comes from the driver's environment.
    Import-path backends/runners (tests.mutants.x:Cls) resolve in workers as in the driver: Ray
    puts the driver's working directory on the workers' sys.path, and the actor adds it again
    with PYTHONPATH for its own subprocesses."""
    env = dict(ACTOR_ENV)
    env.update({name: os.environ[name] for name in FORWARDED_ENV if name in os.environ})
    if device_kind == "cpu":
        env.update(CPU_ACTOR_ENV)
        threads = 1
    else:  # a GPU worker's share of its node's cores, for torch and the OpenMP/MKL pools alike
        env.update({name: str(threads) for name in THREAD_VARS})
    env[THREADS_ENV] = str(max(1, threads))
    root = os.getcwd()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return env


def apply_env(env: dict[str, str]) -> None:
    os.environ.update(env)
    for p in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if p not in sys.path:
            sys.path.insert(0, p)


def limit_threads() -> tuple[int, int]:
    """Apply the worker's thread share (THREADS_ENV) to torch, before torch runs anything: intra-op
    threads, and inter-op threads where torch still allows it (once its inter-op pool started it
    refuses). Returns (intra, inter) as torch has them; (0, 0) when torch is not imported yet (the
    runner's import then reads OMP_NUM_THREADS, and _load applies it again)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return (0, 0)
    n = max(1, int(os.environ.get(THREADS_ENV, "1") or 1))
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(min(n, MAX_INTEROP))
    except RuntimeError:  # already set, or inter-op work already ran: keep what torch has
        pass
    return (torch.get_num_threads(), torch.get_num_interop_threads())


def read_tail(path: str, nbytes: int = LOG_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - nbytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def resolve(path: str) -> Callable[..., Any]:
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CaseWorker:
    """Ray actor class (wrapped with ray.remote by gangs.py, with num_gpus/num_cpus/placement)."""

    def __init__(
        self,
        *,
        runner: str,
        device_kind: str,
        log_dir: str,
        label: str,
        env: dict[str, str] | None = None,
        memory: dict[str, Any] | None = None,
    ):
        preloaded = tuple(m for m in WORKER_PRELOAD if m in sys.modules)
        apply_env(env if env is not None else actor_env(device_kind))
        threads = limit_threads()  # torch is usually preloaded (WORKER_PRELOAD): before any work
        import ray

        os.makedirs(log_dir, exist_ok=True)
        self.log_path = os.path.join(log_dir, f"{label}-{os.getpid()}.log")
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        ctx = ray.get_runtime_context()
        gpu_ids = tuple(str(g) for g in ctx.get_accelerator_ids().get("GPU", ()))
        self.device_kind = device_kind
        # Ray narrowed CUDA_/HIP_VISIBLE_DEVICES to our GPU: it is device 0 of the visible set.
        self.device = "cuda:0" if (device_kind == "gpu" and gpu_ids) else "cpu"
        ip = ray.util.get_node_ip_address()
        where = f"gpu{','.join(gpu_ids)}@{ip}" if gpu_ids else f"{label}@{ip}"
        self.info_ = WorkerInfo(
            where, ctx.get_node_id(), ip, os.getpid(), gpu_ids, self.device, self.log_path, preloaded=preloaded
        )
        self.runner_path = runner
        self._runner: Callable[..., Any] | None = None
        self._sessions: Any = None
        self._memory = dict(memory or {})  # backend.harness.memory.MemoryBudget's fields
        self._budget: int | None = None  # bytes, once applied to the device (_load)
        self._gang: tuple[int, int] = (0, 1)
        self._nvml: bool | None = None  # torch.cuda.utilization works here (None: not tried yet)
        self.threads = threads
        print(
            f"[orch] worker {where} pid {os.getpid()} device {self.device} runner {runner} "
            f"preloaded {','.join(preloaded) or '-'} threads {os.environ.get(THREADS_ENV, '?')} "
            f"(torch {threads[0]} intra-op, {threads[1]} inter-op)",
            flush=True,
        )

    def info(self) -> WorkerInfo:
        import dataclasses

        return dataclasses.replace(self.info_, free_port=_free_port())

    def setup_gang(self, rank: int, world_size: int, master_addr: str, master_port: int, timeout_s: float) -> int:
        """Join the tp process group (gloo on CPU, NCCL on GPU). Returns rank (for the driver's check)."""
        from backend.harness.distributed import init_gang

        self._gang = (rank, world_size)
        init_gang(rank, world_size, master_addr, master_port, device=self.device, timeout_s=timeout_s)
        print(f"[orch] rank {rank}/{world_size} joined {master_addr}:{master_port}", flush=True)
        return rank

    def leave_gang(self) -> WorkerInfo:
        """Leave the tp process group (all ranks of the gang are called together) so the driver
        can re-form this actor into a gang of another size; returns info() with a fresh port.
        The session cache is dropped: its sessions were built for the old tp's shapes."""
        from backend.harness.distributed import destroy_gang

        destroy_gang(together=True)
        print(f"[orch] rank {self._gang[0]}/{self._gang[1]} left its gang", flush=True)
        self._gang = (0, 1)
        if self._sessions is not None:
            from backend.harness.checker import SessionCache

            self._sessions = SessionCache(capacity=WARM_GROUPS, budget=self._budget)
        return self.info()

    def _load(self) -> Callable[..., Any]:
        if self._runner is None:
            self._runner = resolve(self.runner_path)
            if self.runner_path.startswith("backend.harness.checker:"):
                from backend.harness.checker import SessionCache
                from backend.harness.memory import MemoryBudget, apply_budget, expandable_segments, gib

                if self.device != "cpu":
                    print(f"[orch] allocator: {expandable_segments()}", flush=True)
                # The worker's memory budget, enforced by its own allocator (None on CPU).
                self._budget = apply_budget(MemoryBudget.from_dict(self._memory), self.device)
                if self._budget is not None:
                    print(f"[orch] memory budget {gib(self._budget)} ({self._memory})", flush=True)
                self._sessions = SessionCache(capacity=WARM_GROUPS, budget=self._budget)
            self.threads = limit_threads()
        return self._runner

    def _utilization(self) -> float | None:
        """The GPU's utilisation as NVML last sampled it (percent, torch.cuda.utilization), read
        after each case; None on CPU, or for good once it fails (no NVML, no pynvml)."""
        if self.device == "cpu" or self._nvml is False:
            return None
        try:
            util = float(sys.modules["torch"].cuda.utilization(0))
        except Exception:  # noqa: BLE001 - optional: no pynvml / NVML here, the run goes on without it
            self._nvml = False
            return None
        self._nvml = True
        return util

    def _barrier(self, case_id: str, ok: bool) -> str:
        """'' when the gang left the case in step, else why not (the batch stops on this gang)."""
        from backend.harness.distributed import case_barrier

        try:
            case_barrier(case_id, ok)
        except Exception as e:  # noqa: BLE001 - GangDesync, or the collective itself failed
            print(f"[orch] gang barrier after {case_id}: {type(e).__name__}: {e}", flush=True)
            return f"not run: tp gang out of step after {case_id} ({type(e).__name__}); gang recycled"
        return ""

    def run_batch(self, cases: list[dict[str, Any]], needs: list[int] | None = None) -> list[dict[str, Any]]:
        """Run cases in order on this rank; one result dict per case (exceptions become ERROR).
        `needs`: the bytes each case was recorded to need (several workers per GPU; 0: unknown),
        room for which the worker's sessions make before the case (SessionCache.expect)."""
        from backend.case import Case
        from backend.result import CaseResult, Status

        runner = self._load()
        rank, world = self._gang
        out = []
        desync = ""
        for i, d in enumerate(cases):
            case = Case.from_dict(d)
            if self._sessions is not None:  # every case: one that never got its session leaves no need behind
                self._sessions.expect(needs[i] if needs else 0)
            if desync:  # the gang is out of step: later cases are not run on it (driver requeues)
                out.append(
                    CaseResult(
                        case_id=case.case_id,
                        status=Status.NOT_RUN,
                        reason=desync,
                        error_kind="gang",
                        requested_mode=case.mode,
                        axes=case.axes,
                        worker=self.info_.label,
                    ).to_dict()
                )
                continue
            t0 = time.monotonic()
            print(f"[orch] case {case.case_id} rank {rank}", flush=True)
            raised = False
            try:
                kwargs: dict[str, Any] = {"rank": rank, "world_size": world, "device": self.device}
                if self._sessions is not None:
                    kwargs["sessions"] = self._sessions
                res = runner(case, **kwargs)
            except BaseException as e:  # noqa: BLE001 - a case must never take the actor's loop down
                raised = True
                tb = traceback.format_exc()
                print(tb, flush=True)
                first = (str(e).strip().splitlines() or [""])[0]
                res = CaseResult(
                    case_id=case.case_id,
                    status=Status.ERROR,
                    reason=f"{type(e).__name__}: {first}",
                    requested_mode=case.mode,
                    error_kind="exception",
                    log_tail=tb[-LOG_TAIL_BYTES:],
                    repro=case.repro_command(),
                    axes=case.axes,
                    timings={"total_s": time.monotonic() - t0},
                )
            if world > 1:
                desync = self._barrier(case.case_id, not raised)
                if desync and not raised:  # its collectives may have paired with the wrong case
                    res = CaseResult(
                        case_id=case.case_id,
                        status=Status.NOT_RUN,
                        reason=desync,
                        error_kind="gang",
                        requested_mode=case.mode,
                        axes=case.axes,
                    )
            changes: dict[str, Any] = {"worker": self.info_.label}
            util = self._utilization()
            if util is not None:
                changes["timings"] = {**res.timings, "gpu_util": util}
            if not res.device:
                changes["device"] = self.device
            out.append(res.replace(**changes).to_dict())
        return out
