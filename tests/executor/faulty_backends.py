"""Deliberately broken runners (and, once the checker lands, backends) for the executor's fault tests.

Runner-level faults are chosen by the case's batch name, so one matrix of hand-made cases can mix
them: "ok" passes, "crash" kills the process (os._exit), "segv" segfaults, "hang" sleeps forever,
"cudaerr" raises a device error, "flaky" fails the first time it runs and passes afterwards
(a marker file named by batch.description), "fail" always fails, "failerr" fails the first time and raises afterwards (marker file as for
"flaky"), "slow" sleeps 0.3 s then passes.
"""

from __future__ import annotations

import ctypes
import os
import time

from backend.case import BatchSpec, Case
from backend.result import CaseResult, Status


def make_case(kind: str, idx: int = 0, *, tp: int = 1, timeout_s: float = 300.0, description: str = "") -> Case:
    batch = BatchSpec(kind, (1, 1), (8, 8), description)
    return Case(backend="torch", tp=tp, mode="FULL", kv_cache_dtype="auto", batch=batch, seed=idx, timeout_s=timeout_s)


def fault_runner(case: Case, *, rank: int = 0, world_size: int = 1, device=None, sessions=None) -> CaseResult:
    kind = case.batch.name
    if kind == "crash":
        print(f"about to crash in {case.case_id}", flush=True)
        os._exit(1)
    if kind == "segv":
        print(f"about to segfault in {case.case_id}", flush=True)
        ctypes.string_at(0)
    if kind == "hang":
        time.sleep(10**6)
    if kind == "cudaerr":
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if kind == "slow":
        time.sleep(0.3)
    status = Status.PASS
    if kind == "fail":
        status = Status.FAIL
    if kind == "failerr":
        if os.path.exists(case.batch.description):
            raise RuntimeError("failerr: the retry raised")
        open(case.batch.description, "w").close()
        status = Status.FAIL
    if kind == "flaky":
        marker = case.batch.description
        if not os.path.exists(marker):
            open(marker, "w").close()
            status = Status.FAIL
    if kind == "rankerr":  # rank 1 leaves the case before its collective; rank 0 waits in it
        if rank == 1:
            raise RuntimeError("rankerr: rank 1 left the case early")
        import torch.distributed as dist

        dist.all_reduce(__import__("torch").ones(1))
    if kind == "rank":  # which rank/world/device the gang gave us, and the process group size
        import torch.distributed as dist

        t = __import__("torch").ones(1) * (rank + 1)
        dist.all_reduce(t)
        reason = f"rank={rank} world={world_size} device={device} sum={int(t.item())} pid={os.getpid()}"
        return CaseResult(case.case_id, Status.PASS, reason=reason, requested_mode=case.mode, axes=case.axes)
    return CaseResult(
        case.case_id,
        status,
        reason=f"{kind} pid={os.getpid()}",
        requested_mode=case.mode,
        axes=case.axes,
        timings={"total_s": 0.001},
    )


def fail_runner(case: Case, *, rank: int = 0, world_size: int = 1, device=None, sessions=None) -> CaseResult:
    """Fails every case at once: a run whose gate fails, in seconds."""
    return CaseResult(
        case.case_id,
        Status.FAIL,
        reason=f"fail pid={os.getpid()}",
        requested_mode=case.mode,
        axes=case.axes,
        timings={"total_s": 0.001},
    )


def hold_runner(case: Case, *, rank: int = 0, world_size: int = 1, device=None, sessions=None) -> CaseResult:
    """Passes the tp > 1 cases and holds every tp 1 case until its worker is killed: a run that
    cannot finish by itself, whose gang cases (dispatched first: longest expected first) are
    recorded, so a test can signal its driver midway however fast the machine is."""
    while case.tp == 1:
        time.sleep(1)
    return CaseResult(
        case.case_id,
        Status.PASS,
        reason="held runner",
        requested_mode=case.mode,
        axes=case.axes,
        timings={"total_s": 0.001},
    )


def env_runner(case: Case, *, rank: int = 0, world_size: int = 1, device=None, sessions=None) -> CaseResult:
    """Passes, saying in its reason what the worker's environment has for the variable named by
    batch.description (the actors' env forwarding)."""
    name = case.batch.description
    return CaseResult(
        case.case_id,
        Status.PASS,
        reason=f"{name}={os.environ.get(name)}",
        requested_mode=case.mode,
        axes=case.axes,
        timings={"total_s": 0.001},
    )


def slow_runner(case: Case, *, rank: int = 0, world_size: int = 1, device=None, sessions=None) -> CaseResult:
    """Passes after 0.25 s: a run long enough to be killed in the middle (resume test)."""
    time.sleep(0.25)
    return CaseResult(
        case.case_id,
        Status.PASS,
        reason=f"slow pid={os.getpid()}",
        requested_mode=case.mode,
        axes=case.axes,
        timings={"total_s": 0.25},
    )


def hold_path(gcs_address: str) -> str:
    """Where a test asks the held_runner of its own Ray cluster to stop making progress."""
    import hashlib
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"orch-test-hold-{hashlib.sha1(gcs_address.encode()).hexdigest()[:12]}")


def held_runner(case: Case, *, rank: int = 0, world_size: int = 1, device=None, sessions=None) -> CaseResult:
    """slow_runner that holds (sleeps) once the run's store has `after` results, for as long as the
    hold file of its cluster exists ({"db": path, "after": n}): a run that is certainly in the
    middle when the test kills it, however fast or slow the machine is."""
    import json
    import sqlite3

    import ray

    path = hold_path(ray.get_runtime_context().gcs_address)
    while os.path.exists(path):
        try:
            with open(path) as f:
                hold = json.load(f)
            with sqlite3.connect(f"file:{hold['db']}?mode=ro", uri=True) as con:
                stored = con.execute("SELECT count(*) FROM results").fetchone()[0]
        except (OSError, ValueError, KeyError, sqlite3.Error):
            stored, hold = 0, {}
        if stored < hold.get("after", 5):
            break  # not there yet: run
        time.sleep(0.2)
    return slow_runner(case, rank=rank, world_size=world_size, device=device, sessions=sessions)


# --- backend-level faults: the torch provider with a forward that breaks (via --backend) -------

from backend.providers.torch_backend import TorchBackend, TorchImpl  # noqa: E402 - beside the backend-level faults below


class _CrashImpl(TorchImpl):
    def forward(self, *args, **kwargs):
        print("CrashBackend: os._exit in forward", flush=True)
        os._exit(1)


class _HangImpl(TorchImpl):
    def forward(self, *args, **kwargs):
        time.sleep(10**6)


class _DeviceErrorImpl(TorchImpl):
    def forward(self, *args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


class CrashBackend(TorchBackend):
    impl_cls = _CrashImpl


class HangBackend(TorchBackend):
    impl_cls = _HangImpl


class DeviceErrorBackend(TorchBackend):
    impl_cls = _DeviceErrorImpl


class _CaptureErrorImpl(TorchImpl):
    """Fails only while a graph is being captured, with the text CUDA gives for a host sync there."""

    def forward(self, *args, **kwargs):
        from backend.graphs.base import is_capturing

        if is_capturing():
            raise RuntimeError(
                "CUDA error: operation not permitted when stream is capturing (cudaErrorStreamCaptureInvalidated)"
            )
        return super().forward(*args, **kwargs)


class CaptureErrorBackend(TorchBackend):
    impl_cls = _CaptureErrorImpl
