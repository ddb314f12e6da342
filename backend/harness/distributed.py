"""The tensor-parallel gang: torch.distributed process groups for the test model's all-reduce.

gloo on CPU, NCCL (RCCL on ROCm) on GPUs. `run_local_gang` spawns a gang of processes on this
host (127.0.0.1) for `orch repro` and tests; under Ray, each actor of a placement group calls
`init_gang` itself with the rank the executor gives it.
"""

from __future__ import annotations

import os
import queue
import socket
import traceback
import zlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# NVLink multicast (NVLS) hangs or fails on the lent machines; keep it off before NCCL starts (RCCL reads the same NCCL_* names; NVLS does not exist there, so these are no-ops on ROCm).
_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# The gang this process is in: the rendezvous address its process group was formed at, "" alone.
# Every rank of a gang has the same, and a gang formed again (other peers, a fresh port) another:
# what a rank memoises per gang (the checker's eager and graph sides, which skip collectives when
# reused) is then reused by all of its ranks or by none.
_GANG = [""]


def gang_id() -> str:
    return _GANG[0]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_gang(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    *,
    device: torch.device | str,
    timeout_s: float = 120,
) -> None:
    """Join the default process group (no-op for world_size 1). NCCL on cuda, gloo otherwise."""
    for key, value in _NCCL_ENV.items():
        os.environ.setdefault(key, value)
    if world_size <= 1:
        return
    if dist.is_initialized():
        if dist.get_world_size() == world_size and dist.get_rank() == rank:
            return
        raise RuntimeError(f"a process group (rank {dist.get_rank()}/{dist.get_world_size()}) already exists")
    device = torch.device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    _GANG[0] = f"{master_addr}:{master_port}"


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order; [obj] without a process group."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def destroy_gang(together: bool = False) -> None:
    """Leave the process group (no-op without one). `together`: every rank of the gang calls this
    at once (the executor re-forms an idle gang's actors across tp phases), so they meet at a
    barrier first: rank 0 hosts the rendezvous store, and a rank still talking to it when rank 0
    tears it down can block in teardown (the lesson of the gloo test worker). A rank leaving
    alone (a failed one) must not wait for the others."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if together and dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()
    _GANG[0] = ""


def world() -> tuple[int, int]:
    """(rank, world_size) of the current gang; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce_(t: torch.Tensor) -> torch.Tensor:
    """In-place sum over the gang (the row-parallel projection's reduction); identity alone."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


class GangDesync(RuntimeError):
    """The ranks of a gang were not all leaving the same case: a collective of one case was paired
    with another's. Nothing the gang computes after this can be trusted."""


def case_barrier(case_id: str, ok: bool = True) -> bool:
    """Every rank calls this as it leaves a case, on the default group, so a rank that left a
    case early (an exception) meets its peers' stale collective here instead of pairing the next
    case's collectives with it. Hazard: a mismatched pairing is seen as a size mismatch (gloo
    aborts the process: the driver isolates the case), as a tag mismatch (GangDesync), or not at
    all on NCCL (it hangs: the driver's deadline). Returns whether every rank finished the case
    without an exception; True alone (world size 1)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return ok
    tag = zlib.crc32(case_id.encode())
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    # max over [tag, -tag] gives the largest and (negated) smallest tag: equal iff all ranks agree.
    t = torch.tensor([tag, -tag, 0 if ok else 1], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    hi, lo, bad = (int(x) for x in t.tolist())
    if hi != tag or -lo != tag:
        raise GangDesync(f"tp gang out of step at the end of {case_id}: ranks were in different cases")
    return bad == 0


def _gang_entry(
    rank: int, world_size: int, port: int, results: Any, fn: Callable, args: tuple, device_type: str
) -> None:
    # Many ranks on few cores: one intra-op thread per rank avoids oversubscription.
    torch.set_num_threads(1)
    try:
        device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
        init_gang(rank, world_size, "127.0.0.1", port, device=device)
        value = fn(rank, world_size, *args)
        results.put((rank, True, value))
    except BaseException:  # noqa: BLE001 - report, never hang the parent
        results.put((rank, False, traceback.format_exc()[-4000:]))
    finally:
        destroy_gang()


class GangError(RuntimeError):
    """A rank of a local gang died or raised; the message holds its traceback tail."""


def run_local_gang(fn: Callable, world_size: int, *args: Any, timeout_s: float = 600, device_type: str = "cpu") -> list:
    """Run fn(rank, world_size, *args) in world_size spawned processes joined in a gang on
    127.0.0.1 (gloo on CPU; device_type "cuda": rank r on cuda:r over NCCL); returns the ranks'
    return values in rank order. fn and args must be picklable (fn a module-level function).
    Raises GangError if a rank raised, died or timed out."""
    import time

    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_gang_entry, args=(r, world_size, port, results, fn, args, device_type), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    values: dict[int, Any] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) + len(errors) < world_size:
            try:
                rank, ok, value = results.get(timeout=1.0)
            except queue.Empty:
                # A rank that died without reporting (segfault, OOM kill) never puts a result.
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (0, None)]
                if dead:
                    errors.append(f"ranks {dead} died (exit codes {[procs[i].exitcode for i in dead]})")
                    break
                if time.monotonic() > deadline:
                    errors.append(f"gang timed out after {timeout_s:.0f}s")
                    break
                continue
            if ok:
                values[rank] = value
            else:
                # The other ranks may now wait in a collective until the gang timeout: stop them.
                errors.append(f"rank {rank}: {value}")
                break
    finally:
        for p in procs:
            if errors and p.is_alive():
                p.kill()
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise GangError("; ".join(errors))
    return [values[r] for r in range(world_size)]
