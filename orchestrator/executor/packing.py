"""How many workers share one GPU (`--workers-per-gpu N|auto`), worked out without Ray or torch.

A passing case is mostly host work with the GPU idle (docs/EXECUTION.md "GPU memory"), so one
worker per GPU leaves the device and most of the host's cores idle. Several workers per GPU are Ray fractional GPUs
(`num_gpus = 1 / N`, every actor still on one device); each keeps to its memory budget itself
(backend/harness/memory.py), since Ray enforces nothing about memory.

`auto` packs by what the matrix's cases were measured to need (CaseResult.memory "needs", from
the store) and by the host's cores; a matrix with no recorded needs gets one worker per GPU (the
run records them, so the next run packs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orchestrator.errors import InputError

GiB = 1024**3
# `auto`'s cap. Workers of one GPU time-slice its device work (without MPS their contexts never
# run kernels at once), and once the GPU is busy most of the time each worker more only stretches
# the others' steps. The H100's torch slice (16 cores, threads at each worker's share, verdicts
# identical, no out-of-memory rerun): 35.5 s with 1 worker, 22.0 s with 2, 17.5 s with 3 (NVML
# 41% / 73% / 87%); 4 had been slower than 2 while its out-of-memory reruns ran alone at the end.
# docs/BENCHMARKS.md, issue 45's sixth and eighth sessions.
MAX_PER_GPU = 3
# `auto` leaves each worker at least this many of the host's cores for its torch threads (every GPU
# worker runs its share of the node's cores: threads.worker_threads). In the H100 runs of
# the torch slice with the threads set by hand, 4 workers of 4 threads beat 8 workers of 2 (cases
# phase 74 s against 93 s on 16 cores): a case's host work is a few threaded ops at a time.
MIN_THREADS_PER_WORKER = 4
DEFAULT_UTILIZATION = 0.9  # vLLM's gpu_memory_utilization default (backend/harness/memory.py)
# What a worker holds beyond its largest case's needs: its CUDA context and kernels (~0.5 GiB),
# the allocator's fragmentation and a second session while the first is evicted.
WORKER_OVERHEAD = 0.75 * GiB
NEED_MARGIN = 1.25


def parse_workers_per_gpu(value: str | int | None) -> int | str:
    """`--workers-per-gpu`: a positive integer or "auto" (exit 2 otherwise)."""
    if value is None:
        return 1
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    if not text.isdigit() or int(text) < 1:
        raise InputError(f"--workers-per-gpu must be a positive integer or auto, got {value!r}")
    return int(text)


def parse_gib(value: str | float | None, option: str) -> int | None:
    """A size in GiB (`24`, `24GiB`, `24G`) -> bytes; None stays None."""
    if value is None:
        return None
    text = str(value).strip().lower().removesuffix("ib").removesuffix("b").removesuffix("g")
    try:
        gib = float(text)
    except ValueError:
        raise InputError(f"{option} takes a size in GiB (e.g. 24), got {value!r}") from None
    if gib <= 0:
        raise InputError(f"{option} must be > 0 GiB, got {value!r}")
    return int(gib * GiB)


def check_utilization(value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise InputError(f"--gpu-memory-utilization must be in (0, 1], got {value}")
    return value


def worker_bytes(need: int) -> int:
    """A worker's bytes for a case that needs `need` alone: with its context and margin (0: 0)."""
    return int(need * NEED_MARGIN + WORKER_OVERHEAD) if need else 0


@dataclass(frozen=True)
class WorkerNeed:
    """What one worker of a matrix needs: the largest recorded need of its cases."""

    bytes: int  # 0: nothing recorded
    case_id: str  # the case that needs it ("" when nothing was recorded)
    recorded: int  # cases with a recorded need
    cases: int
    median: int = 0  # the median recorded need (0: size workers for the largest)

    def per_worker(self) -> int:
        return worker_bytes(self.bytes)

    def sized(self) -> int:
        """What `auto` sizes a worker for: the median case; the larger ones take several shares
        (slot_width)."""
        return self.median or self.bytes

    def describe(self) -> str:
        if not self.bytes:
            return f"no recorded device memory for these {self.cases} case(s) (a GPU run records it)"
        part = f" ({self.recorded} of {self.cases} cases recorded)" if self.recorded < self.cases else ""
        text = (
            f"largest case needs {self.bytes / GiB:.2f} GiB ({self.case_id}); a worker "
            f"{self.per_worker() / GiB:.2f} GiB with its context and margin{part}"
        )
        if self.median and self.median < self.bytes:
            text += (
                f"; the median case {self.median / GiB:.2f} GiB, a worker {worker_bytes(self.median) / GiB:.2f} "
                f"GiB (larger cases take several workers' shares)"
            )
        return text


def worker_need(case_ids: Iterable[str], needs: Mapping[str, int]) -> WorkerNeed:
    ids = list(case_ids)
    recorded = [(needs[c], c) for c in ids if c in needs]
    top = max(recorded, default=(0, ""))
    values = sorted(n for n, _ in recorded)
    median = values[len(values) // 2] if values else 0
    return WorkerNeed(top[0], top[1], len(recorded), len(ids), median)


def slot_width(need: int, device_bytes: int | None, utilization: float, per_gpu: int) -> int:
    """Slots (1 / per_gpu of a GPU each) a tp 1 case takes: one where its recorded `need` (its
    bytes, 0: none recorded) fits a worker of one share, else as many shares as its worker needs
    with its context and margin, at most the whole GPU. The few cases of a matrix that need much
    more than the rest run on wider workers instead of sizing every worker for them."""
    if per_gpu <= 1 or not need or not device_bytes:
        return 1
    share = int(device_bytes * utilization / per_gpu)
    return max(1, min(per_gpu, -(-worker_bytes(need) // share)))


def config_widths(widths: Mapping[str, int], config_of: Mapping[str, str]) -> dict[str, int]:
    """Case id -> slots, every case of a config at its widest member's: a config's cudagraph modes
    run on one worker and share its session (config_key), so they need what its most needing mode
    recorded. Otherwise the mode that paid the session (the largest need: a wider worker) and the
    modes that reused it (one share) were handed out apart, and each paid its eager steps,
    reference and capture again (the H100's torch slice at 4 per GPU: 156 of 280 cases ran steps
    of their own against 138 with one worker). `config_of`: case id -> its config ("" for none)."""
    widest: dict[str, int] = {}
    for case_id, width in widths.items():
        key = config_of.get(case_id, "")
        if key:
            widest[key] = max(widest.get(key, 0), width)
    return {c: widest.get(config_of.get(c, ""), w) for c, w in widths.items()}


@dataclass(frozen=True)
class Packing:
    per_gpu: int
    why: str


def auto_per_gpu(
    need: WorkerNeed, device_bytes: int | None, utilization: float, cores: int, gpus: int, cap: int = MAX_PER_GPU
) -> Packing:
    """Workers per GPU for `auto`: as many as the device's budget holds at the median recorded
    need (cases that need more run on wider workers: slot_width), no more than the host's cores
    allow (MIN_THREADS_PER_WORKER each; a host too small for two such workers per GPU: one per
    core, one left for the driver and Ray), at most `cap` (more is `--workers-per-gpu N`)."""
    if gpus < 1:
        return Packing(1, "no GPU")
    if not need.bytes or not device_bytes:
        why = need.describe() if not need.bytes else "the device's memory is unknown here"
        return Packing(1, f"1 per GPU: {why}")
    by_memory = int(device_bytes * utilization // worker_bytes(need.sized()))
    by_cores = max(1, cores // (gpus * MIN_THREADS_PER_WORKER))
    if by_cores < 2:  # a small host: the old rule (cores - 1 workers, one thread each)
        by_cores = max(1, (cores - 1) // gpus)
    n = max(1, min(by_memory, by_cores, cap))
    return Packing(
        n,
        f"{n} per GPU: memory allows {by_memory} ({need.describe()}; "
        f"{device_bytes / GiB:.0f} GiB x {utilization:g}), cores {by_cores}, cap {cap}",
    )


@dataclass(frozen=True)
class MemoryOptions:
    """`orch run`'s memory options, validated once at the edge."""

    workers_per_gpu: int | str = "auto"  # N or "auto" (the default: faster than 1 on the H100, same verdicts)
    utilization: float = 0.9
    gpu_memory: int | None = None  # bytes each GPU is taken to have (None: its real size)

    @classmethod
    def parse(cls, workers_per_gpu, utilization, gpu_memory) -> MemoryOptions:
        return cls(
            parse_workers_per_gpu(workers_per_gpu),
            check_utilization(float(utilization)),
            parse_gib(gpu_memory, "--gpu-memory"),
        )
