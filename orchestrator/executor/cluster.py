"""Connect to Ray (embedded or an existing cluster) and describe the worker slots it offers.

A *slot* is what one worker actor occupies: one GPU, or on CPU-only clusters a fraction of a core
(CPU_PER_WORKER) so that a tp 8 gang fits on a 2-core machine. The dispatcher sees each node as a
count of slots.
"""

from __future__ import annotations

import enum
import os
import socket
from dataclasses import dataclass

from backend.attention.capabilities import local_gpu_count
from orchestrator.errors import InfraError, InputError
from orchestrator.executor.actors import WORKER_PRELOAD

# Embedded Ray: explicit sizes, because the defaults have hung on the lent GPU machine (DESIGN §7).
OBJECT_STORE_BYTES = 512 * 1024**2
# CPU workers: fractional so tp 8 gangs fit on 2 cores; they run one torch thread each.
CPU_PER_WORKER = 0.25
CONNECT_TIMEOUT_S = 3.0


class DeviceKind(str, enum.Enum):
    """What the workers run on: GPUs, or CPU workers with graphs emulated. It is the plain string
    wherever it is shown, stored or compared (enum.StrEnum's behaviour, which Python 3.10 lacks)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    GPU = "gpu"
    CPU = "cpu"


@dataclass(frozen=True)
class NodeSlots:
    node_id: str  # Ray NodeID hex
    ip: str
    slots: int
    # CPU nodes whose slot count was not asked for: the node's cores. Once a gang runs there, more
    # gangs start only while their ranks fit in the cores (pool.GangPool.free): on 2 cores, two tp 1
    # workers rather than eight, a tp 4 gang alone. Fewer processes each import torch, warm up and
    # build their sessions once for more cases. 0 = no cap (GPU slots, or --workers given).
    cores: int = 0
    # The node's CPUs as Ray counts them: GPU workers divide them between the node's slots
    # (threads.worker_threads). 0: unknown (one thread per worker).
    cpus: int = 0


@dataclass(frozen=True)
class ClusterInfo:
    address: str  # "local" (embedded) or what we joined
    device_kind: DeviceKind  # a plain "gpu" | "cpu" is taken as its DeviceKind
    nodes: tuple[NodeSlots, ...]
    cpu_per_worker: float = CPU_PER_WORKER
    owned: bool = False  # we started it, so we shut it down
    workers_per_gpu: int = 1  # GPU slots per device (--workers-per-gpu): a slot is 1 / N of a GPU

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_kind", DeviceKind(self.device_kind))

    @property
    def total_slots(self) -> int:
        return sum(n.slots for n in self.nodes)

    @property
    def banner(self) -> str:
        if self.device_kind == DeviceKind.CPU:
            return f"no GPU: CPU workers, graphs emulated ({self.total_slots} workers on {len(self.nodes)} node(s))"
        per = f", {self.workers_per_gpu} per GPU" if self.workers_per_gpu > 1 else ""
        return f"{self.total_slots} GPU worker(s){per} on {len(self.nodes)} node(s), {self.threads_note()}"

    def threads_note(self) -> str:
        """The torch threads each GPU worker runs (threads.worker_threads), per distinct node shape:
        '4 torch threads each (16 cores / 4 workers)'."""
        from orchestrator.executor.threads import worker_threads

        shapes = sorted({(n.cpus, n.slots) for n in self.nodes})
        parts = [f"{worker_threads(c, s, 1)} torch threads each ({c or '?'} cores / {s} workers)" for c, s in shapes]
        return "; ".join(parts)

    def describe_devices(self) -> str:
        if self.device_kind == DeviceKind.GPU and self.workers_per_gpu > 1:
            return f"{self.total_slots // self.workers_per_gpu}x gpu ({self.workers_per_gpu} workers each)"
        return f"{self.total_slots}x {self.device_kind}"


def _check_reachable(address: str) -> None:
    """Fail in seconds, not after Ray's long reconnect loop, when nothing listens at HOST:PORT."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("ray://")
    if not host or not port.isdigit():
        raise InputError(f"--address must be local, auto or HOST:PORT, got {address!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        raise InfraError(f"Ray cluster unreachable at {address}: {e.strerror or e}") from None


def node_slots(
    device_kind: str,
    workers: int | None,
    cpu_per_worker: float,
    min_slots: int = 1,
    per_gpu: int = 1,
    max_gpus: int | None = None,
) -> tuple[NodeSlots, ...]:
    """Slots per alive node. GPU: `per_gpu` per GPU (--workers-per-gpu), `workers` in all at most.
    CPU: `workers` (default max(cores, min_slots), so the largest gang of the matrix fits) spread
    over nodes as far as their CPUs allow. `max_gpus` (`orch run --max-gpus`): this run's share of
    a cluster other drivers use too, in GPUs (in workers on a cluster without GPUs); the slots are
    counted from the first nodes, and Ray places each gang wherever its bundles are free."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    alive.sort(key=lambda n: n["NodeID"])
    out: list[NodeSlots] = []
    cap = max_gpus * (per_gpu if device_kind == "gpu" else 1) if max_gpus is not None else 10**9
    if device_kind == "gpu":
        left = min(workers if workers is not None else 10**9, cap)
        for n in alive:
            k = min(int(n["Resources"].get("GPU", 0)) * per_gpu, left)
            left -= k
            if k > 0:
                out.append(NodeSlots(n["NodeID"], n["NodeManagerAddress"], k, cpus=int(n["Resources"].get("CPU", 0))))
        return tuple(out)
    total_cpu = sum(n["Resources"].get("CPU", 0) for n in alive)
    want = min(workers if workers is not None else default_cpu_workers(int(total_cpu), min_slots), cap)
    caps = [int(n["Resources"].get("CPU", 0) / cpu_per_worker) for n in alive]
    # Largest gang first on one node, then round robin, so every node gets work.
    counts = [0] * len(alive)
    if caps:
        first = max(range(len(alive)), key=lambda i: caps[i])
        counts[first] = min(caps[first], min_slots, want)
        want -= counts[first]
    while want > 0 and any(c < cap for c, cap in zip(counts, caps)):
        for i in range(len(alive)):
            if want > 0 and counts[i] < caps[i]:
                counts[i] += 1
                want -= 1
    for n, k in zip(alive, counts):
        if k > 0:
            cores = int(n["Resources"].get("CPU", 0)) if workers is None else 0
            out.append(
                NodeSlots(n["NodeID"], n["NodeManagerAddress"], k, cores, cpus=int(n["Resources"].get("CPU", 0)))
            )
    return tuple(out)


def default_cpu_workers(cores: int, min_slots: int) -> int:
    """CPU workers without --workers: one per core, but at least the largest tp of the run (a
    gang's ranks are workers: full.yaml's tp 8 starts 8 on 2 cores, no more than 2 ranks running
    at once; NodeSlots.cores)."""
    return max(cores or 1, min_slots)


@dataclass(frozen=True)
class LocalLayout:
    """The workers an embedded `orch run` starts on this machine, worked out without Ray (for
    `orch plan`; node_slots gives the same on the embedded cluster)."""

    device_kind: DeviceKind
    workers: int
    cores: int  # CPU without --workers: ranks running at once; 0: no cap

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_kind", DeviceKind(self.device_kind))

    @property
    def parallel(self) -> int:
        """Ranks that run at once."""
        return min(self.workers, self.cores) if self.cores else self.workers

    def describe(self) -> str:
        if self.device_kind == DeviceKind.GPU:
            return f"{self.workers} GPU worker(s)"
        capped = (
            f", at most {self.parallel} running at once ({self.cores} cores)" if self.parallel < self.workers else ""
        )
        return f"{self.workers} CPU worker(s){capped}"


def local_layout(
    device_kind: DeviceKind | str, workers: int | None, min_slots: int, *, cpus: int, gpus: int
) -> LocalLayout:
    if device_kind == "gpu":
        return LocalLayout(DeviceKind.GPU, min(gpus, workers) if workers is not None else gpus, 0)
    cap = int(cpus / CPU_PER_WORKER)  # node_slots: a node holds at most this many CPU workers
    if workers is not None:
        return LocalLayout(DeviceKind.CPU, min(workers, cap), 0)
    return LocalLayout(DeviceKind.CPU, min(default_cpu_workers(cpus, min_slots), cap), cpus)


def embedded_init_kwargs(num_gpus: int, *, preload: bool = True) -> dict:
    """ray.init's keywords for the embedded cluster (connect's `local`; benchmarks/cluster_bench.py
    times this same start, and with preload=False the start before the worker preload)."""
    # address="local": a new cluster even where another Ray runs on this machine (a `ray start`
    # head, another user's run); without it ray.init joins that one and rejects num_cpus.
    kw: dict = dict(
        address="local",
        num_cpus=os.cpu_count() or 1,
        num_gpus=num_gpus,
        include_dashboard=False,
        object_store_memory=OBJECT_STORE_BYTES,
        log_to_driver=False,
        configure_logging=False,
    )
    if preload:
        kw["_system_config"] = {"preload_python_modules": list(WORKER_PRELOAD)}
    return kw


def connect(
    address: str = "local",
    *,
    devices: str = "auto",
    workers: int | None = None,
    min_slots: int = 1,
    workers_per_gpu: int = 1,
    max_gpus: int | None = None,
) -> ClusterInfo:
    """Start embedded Ray (`local`) or join (`auto`, HOST:PORT, or RAY_ADDRESS) and count slots.

    Reuses an already-initialised Ray in this process (tests share one session cluster).
    """
    import ray

    if workers is not None and workers < 1:
        raise InputError(f"--workers must be >= 1, got {workers}")
    if workers_per_gpu < 1:
        raise InputError(f"--workers-per-gpu must be >= 1 or auto, got {workers_per_gpu}")
    owned = False
    if not ray.is_initialized():
        if address == "local" and not os.environ.get("RAY_ADDRESS"):
            ray.init(**embedded_init_kwargs(0 if devices == "cpu" else local_gpu_count()))
        else:
            target = os.environ.get("RAY_ADDRESS", "auto") if address in ("local", "auto") else address
            if target != "auto":
                _check_reachable(target)
            try:
                ray.init(address=target, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, TimeoutError) as e:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise InfraError(f"Ray cluster unreachable at {target}: {first}") from None
        owned = True
    has_gpu = ray.cluster_resources().get("GPU", 0) >= 1
    if devices == "gpu" and not has_gpu:
        if owned:
            ray.shutdown()
        raise InfraError("--devices gpu but the Ray cluster has no GPU")
    kind = DeviceKind.GPU if has_gpu and devices != "cpu" else DeviceKind.CPU
    per_gpu = workers_per_gpu if kind == DeviceKind.GPU else 1
    nodes = node_slots(kind, workers, CPU_PER_WORKER, min_slots, per_gpu=per_gpu, max_gpus=max_gpus)
    if not nodes:
        if owned:
            ray.shutdown()
        raise InfraError(f"the Ray cluster offers no {kind} worker slots")
    return ClusterInfo(address=address, device_kind=DeviceKind(kind), nodes=nodes, owned=owned, workers_per_gpu=per_gpu)


def held_by_others(info: ClusterInfo, ours: float) -> tuple[float, float]:
    """(held by other jobs, total) of the resource our workers take (GPU, or CPU for CPU
    workers): what other drivers on this cluster hold now. `ours`: what our placed gangs reserve."""
    import ray

    key = "GPU" if info.device_kind == DeviceKind.GPU else "CPU"
    total = float(ray.cluster_resources().get(key, 0.0))
    free = float(ray.available_resources().get(key, 0.0))
    return max(0.0, total - free - ours), total


def disconnect(info: ClusterInfo) -> None:
    import ray

    if info.owned and ray.is_initialized():
        ray.shutdown()
