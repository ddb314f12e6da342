"""Warm Triton's on-disk kernel cache in parallel, before the worker needs it.

On a fresh GPU machine the first case of each (backend, kv dtype, batch) spends most of its time
in Triton's JIT (MLIR, LLVM and ptxas: ~24 s of the 290-case tp 1 run's 73 s on the H200, all of it
on one CPU core of the one worker process). Triton keeps what it compiled in a disk cache shared by
every process of the user (~/.triton/cache, or TRITON_CACHE_DIR) and a later process loads a cached
kernel in milliseconds. So `orch run` starts this module at the very beginning of a local GPU run,
before Ray's cluster is up: `jobs` processes run a few representative cases each and throw the
results away; the worker then finds most kernels already compiled.

Representatives are the real cases, their steps run by the checker's own code without the
checks (checker.warm_kernels: the session, its graphs, each step's eager and graph run; no context,
snapshots or reference, so a helper needs one session's memory): which kernel specialisations a case
needs (constexpr block sizes, integer arguments equal to 1 or divisible by 16, the 2D or 3D
attention kernel) follows from its shapes and values, and nothing here has to know them. Per
(backend, kv dtype, model, batch, k, seed, steps, sizes) the FULL and FULL_AND_PIECEWISE cases are
run: eager runs in every case, and between them they capture every graph kind a mode can dispatch
to (mixed FULL, decode FULL, piecewise).

It cannot change a verdict: the helpers share nothing with the workers but Triton's cache files,
which Triton writes atomically (a temporary file renamed into place). Only backends that declare
`jit_kernels = True` are warmed, only tp 1 cases (a tp > 1 rank needs its gang), only where the
device is a GPU, each helper holding one session at most and capped at HELPER_MEMORY_FRACTION of
the device (torch's per-process limit), so that the workers keep the device's memory.

A warm-up that completed leaves a marker in Triton's cache directory, named by a hash of what it
warmed (the representatives, the versions of torch, Triton and AITER, and the source of the jit
backends' modules): a later run with the same marker does nothing (a warm cache needs no helpers
competing with the worker for the GPU), and a cache that was wiped takes the marker with it.
A run can also finish before its helpers do (the worker compiled what they had left: on the H200
a warm run then started the helpers again, 3 processes and sessions beside the worker). The
driver then sends SIGUSR1 instead of stopping them: every tp 1 case ran in the worker, so the
cache holds what the representatives need, and the helpers end and write the marker.

    python -m backend.harness.precompile --cases CASES.json [--jobs 3] [--parent PID] [--deadline-s 300]
                                 [--device cuda|cpu]

CASES.json: a list of Case.to_dict(), in the order the workers are expected to reach them.
One line per case goes to stdout: `precompile: <case id> ran|not-runnable|raised X <seconds>s (helper i/n, at <s>s)`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import inspect
import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterable, Sequence

from backend.case import Case

# Between them, these modes capture every graph kind a case can dispatch to.
WARM_MODES = ("FULL", "FULL_AND_PIECEWISE")
# Per helper: the most of the GPU's memory it may take (a session of full.yaml's GPU shape is
# 4.3 GB of KV cache, ~6% of an H200); the worker keeps the rest.
HELPER_MEMORY_FRACTION = 0.08
DEFAULT_DEADLINE_S = 300.0


def group_of(case: Case) -> tuple:
    """Cases that need the same kernels, bar the cudagraph mode."""
    return (
        case.backend,
        case.kv_cache_dtype,
        case.model,
        case.batch,
        case.spec_tokens,
        case.seed,
        case.steps,
        case.capture_sizes,
    )


def representatives(cases: Iterable[Case], jit_backends: set[str]) -> list[Case]:
    """The tp 1 cases of `jit_backends` to warm, in the order their groups first appear: per group
    its WARM_MODES cases, or its first case when it has none of them."""
    groups: dict[tuple, list[Case]] = {}
    for case in cases:
        if case.tp == 1 and case.backend in jit_backends:
            groups.setdefault(group_of(case), []).append(case)
    chosen: list[Case] = []
    for members in groups.values():
        chosen += [c for c in members if c.mode in WARM_MODES] or members[:1]
    return chosen


def jit_backends(names: Iterable[str]) -> set[str]:
    """The backend names among `names` whose class declares `jit_kernels = True` (one that does
    not load is left to the worker, which reports it)."""
    from backend.attention.capabilities import builtin_families
    from backend.attention.registry import BackendLoadError, get_backend

    out = set()
    for name in set(names):
        for family in builtin_families(name) or ("gqa",):
            try:
                if getattr(get_backend(name, family), "jit_kernels", False):
                    out.add(name)
            except (BackendLoadError, ImportError):
                continue
    return out


def split(cases: Sequence[Case], jobs: int) -> list[list[Case]]:
    """Round-robin over `jobs` helpers: each starts near the front of the workers' order."""
    jobs = max(1, min(jobs, len(cases)))
    return [list(cases[i::jobs]) for i in range(jobs)]


def triton_cache_dir() -> str:
    """Where Triton keeps compiled kernels (its default, or TRITON_CACHE_DIR)."""
    return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def marker_path(reps: Sequence[Case]) -> str:
    """The marker a completed warm-up of `reps` leaves in Triton's cache directory."""
    from backend.attention.registry import get_backend

    h = hashlib.sha256()
    for c in reps:
        h.update(c.case_id.encode())
        h.update(repr(group_of(c)).encode())
    for dist in ("torch", "triton", "amd-aiter", "orch"):
        try:
            h.update(f"{dist}={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{dist}=-".encode())
    for name, family in sorted({(c.backend, c.attention) for c in reps}):
        try:
            with open(inspect.getsourcefile(get_backend(name, family)) or "", "rb") as f:
                h.update(f.read())
        except (OSError, TypeError, ImportError):
            pass
    return os.path.join(triton_cache_dir(), f"orch-precompile-{h.hexdigest()[:24]}.done")


def _alive(pid: int | None) -> bool:
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def warm(case_dicts: list[dict], device: str, helper: str, parent: int | None, deadline: float) -> int:
    """Run the cases' kernels on `device` one after another (checker.warm_kernels: no context,
    reference or checks); stops at the deadline or when `parent` (the orch driver) is gone.
    Returns how many were run (a case that raises counts: it launched what it could)."""
    import torch

    from backend.harness import checker

    dev = torch.device(device)
    if dev.type == "cuda":  # the worker keeps the device: a helper holds one session at most
        torch.cuda.set_device(dev)
        torch.cuda.set_per_process_memory_fraction(HELPER_MEMORY_FRACTION, dev)
    sessions = checker.SessionCache(capacity=1)
    ran = 0
    t_start = time.monotonic()
    for d in case_dicts:
        if time.monotonic() > deadline or not _alive(parent):
            break
        case = Case.from_dict(d)
        t0 = time.monotonic()
        try:
            status = "ran" if checker.warm_kernels(case, device=dev, sessions=sessions) else "not-runnable"
        except Exception as e:  # noqa: BLE001 - a capture error, an OOM: the worker will report it
            status = f"raised {type(e).__name__}"
            sessions.clear()
        ran += 1
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        print(
            f"precompile: {case.case_id} {status} {time.monotonic() - t0:.1f}s "
            f"(helper {helper}, at {time.monotonic() - t_start:.1f}s)",
            flush=True,
        )
    return ran


def _child(case_dicts: list[dict], device: str, helper: str, parent: int | None, deadline: float) -> None:
    if warm(case_dicts, device, helper, parent, deadline) < len(case_dicts):
        sys.exit(3)  # cut short: the warm-up is incomplete (no marker)


def _devices(kind: str, jobs: int) -> list[str]:
    if kind == "cpu":
        return ["cpu"] * jobs
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return []
    n = torch.cuda.device_count()
    return [f"cuda:{i % n}" for i in range(jobs)]  # spread over the visible GPUs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backend.harness.precompile", description=__doc__.splitlines()[0])
    p.add_argument("--cases", required=True, help="JSON list of Case.to_dict()")
    p.add_argument("--jobs", type=int, default=3)
    p.add_argument("--parent", type=int, default=None, help="stop when this pid is gone")
    p.add_argument("--deadline-s", type=float, default=DEFAULT_DEADLINE_S)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = p.parse_args(argv)
    covered: list[bool] = []  # SIGUSR1: the driver's run ran every case itself (the module docstring)
    signal.signal(signal.SIGUSR1, lambda *_: covered.append(True))
    deadline = time.monotonic() + args.deadline_s
    try:
        with open(args.cases, encoding="utf-8") as f:
            cases = [Case.from_dict(d) for d in json.load(f)]
    except (OSError, ValueError, TypeError, KeyError) as e:
        print(f"precompile: cannot read {args.cases}: {type(e).__name__}: {e}", flush=True)
        return 2
    reps = representatives(cases, jit_backends(c.backend for c in cases))
    if not reps or args.jobs < 1:
        print("precompile: nothing to warm (no tp 1 case of a backend with jit_kernels)", flush=True)
        return 0
    devices = _devices(args.device, args.jobs)
    if not devices:
        print("precompile: no GPU here, nothing to warm", flush=True)
        return 0
    marker = marker_path(reps)
    if os.path.exists(marker):
        print(f"precompile: already warm ({marker})", flush=True)
        return 0
    parts = split(reps, len(devices))
    print(f"precompile: {len(reps)} of {len(cases)} cases over {len(parts)} helper(s)", flush=True)
    ctx = multiprocessing.get_context("spawn")  # a fresh CUDA context per helper
    procs = []
    for i, (part, device) in enumerate(zip(parts, devices)):
        proc = ctx.Process(
            target=_child,
            args=([c.to_dict() for c in part], device, f"{i + 1}/{len(parts)}", args.parent, deadline),
            daemon=True,
        )
        proc.start()
        procs.append(proc)
    try:
        while any(proc.is_alive() for proc in procs):
            if covered or not _alive(args.parent) or time.monotonic() > deadline + 5:
                break
            for proc in procs:
                proc.join(timeout=0.5)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=5)
    failed = sum(1 for proc in procs if proc.exitcode != 0)
    # Every helper ran its whole share, or the driver's run ran every case itself.
    complete = bool(covered) or (not failed and _alive(args.parent) and time.monotonic() <= deadline)
    if complete:
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        with open(marker, "w", encoding="utf-8") as f:
            f.write("\n".join(c.case_id for c in reps) + "\n")
    how = "covered by the run, " if covered else ""
    print(
        f"precompile: done ({failed} helper(s) did not exit cleanly; "
        f"{how}{'complete, marker ' + marker if complete else 'incomplete, no marker'})",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
