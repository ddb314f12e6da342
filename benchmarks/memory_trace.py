"""Where a worker's device memory goes, case by case: run a slice of a matrix in this
process as one GPU worker would (its budget, its allocator settings, one SessionCache), and print
after every case what the allocator holds; every `--drop-every` cases (and after any
out-of-memory) drop every session and process cache and say what the worker still holds. When that
is more than `--leak-gib`, print the largest blocks still allocated with the Python lines that
allocated them (the allocator's history, `--history`).

    PYTHONPATH=$PWD python benchmarks/memory_trace.py matrices/full.yaml \
        --filter "tp=1 backend=torch,aiter-triton,aiter-triton-pa" [--devices gpu] [--history]

Lines: `i status kind | alloc reserved (GiB) | sessions kept/held | segments (expandable)`.
On a CPU device the allocator figures are 0 (host memory is not budgeted): the run checks the
script itself and the verdicts, nothing else.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from backend.harness import memory
from backend.harness.checker import SessionCache, clear_process_caches, run_case
from orchestrator.filters import select
from orchestrator.matrix import load_matrix

G = memory.GiB


def segments() -> tuple[int, int]:
    """(segments, expandable ones) of the allocator now (0, 0 off a GPU)."""
    if not torch.cuda.is_available():
        return 0, 0
    segs = torch.cuda.memory_snapshot()
    return len(segs), sum(1 for s in segs if s.get("is_expandable"))


def held(device) -> tuple[float, float]:
    if torch.device(device).type != "cuda":
        return 0.0, 0.0
    return torch.cuda.memory_allocated(device) / G, torch.cuda.memory_reserved(device) / G


def largest_live(top: int) -> None:
    """The largest allocated blocks and where they were allocated (needs --history)."""
    snap = torch.cuda.memory._snapshot()
    blocks = []
    for seg in snap.get("segments", []):
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated":
                blocks.append((b.get("size", 0), seg.get("segment_pool_id"), b.get("frames") or []))
    blocks.sort(key=lambda t: -t[0])
    by_site: Counter = Counter()
    for size, _, frames in blocks:
        own = [f for f in frames if "/backend/" in f.get("filename", "") or "/orchestrator/" in f.get("filename", "")]
        site = " <- ".join(f"{Path(f['filename']).name}:{f['line']}" for f in own[:3]) or "?"
        by_site[site] += size
    print(f"   live: {len(blocks)} blocks, {sum(b[0] for b in blocks) / G:.2f} GiB; by allocation site:")
    for site, size in by_site.most_common(top):
        print(f"     {size / G:7.3f} GiB  {site}")


def drop(sessions: SessionCache, device, leak_gib: float, history: bool, why: str) -> None:
    n = len(sessions)
    sessions.clear()
    clear_process_caches()
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    a, r = held(device)
    segs, exp = segments()
    print(
        f"-- drop ({why}): {n} sessions dropped; still allocated {a:.2f} reserved {r:.2f} GiB; "
        f"segments {segs} ({exp} expandable)",
        flush=True,
    )
    if history and a > leak_gib:
        largest_live(15)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("matrix")
    ap.add_argument("--filter", default="tp=1")
    ap.add_argument("--devices", default="auto")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--drop-every", type=int, default=60)
    ap.add_argument("--leak-gib", type=float, default=1.0)
    ap.add_argument("--history", action="store_true", help="record the allocator's history (allocation sites)")
    ap.add_argument("--no-expandable", action="store_true", help="leave the allocator's settings as they are")
    ap.add_argument("--gpu-memory", type=float, default=0, help="emulate a card of this many GiB")
    ap.add_argument("--budget-s", type=float, default=0, help="stop after this many seconds (0: no limit)")
    args = ap.parse_args()

    matrix = load_matrix(args.matrix, devices=args.devices)
    cases = select(matrix.cases, args.filter)
    # As a worker meets them: a family's groups (backend x kv dtype), modes of one batch back to back.
    cases.sort(key=lambda c: (c.attention, c.backend, c.kv_cache_dtype, c.batch.name, c.mode))
    if args.limit:
        cases = cases[: args.limit]
    cuda = torch.cuda.is_available() and args.devices != "cpu"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    budget = None
    if cuda:
        if not args.no_expandable:
            print("allocator:", memory.expandable_segments())
        if args.history:
            torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
        budget = memory.apply_budget(memory.MemoryBudget(device_bytes=int(args.gpu_memory * G) or None), device)
        print(f"budget {memory.gib(budget)} of {torch.cuda.get_device_name(0)}")
    sessions = SessionCache(budget=budget)
    statuses: Counter = Counter()
    t0 = time.perf_counter()
    for i, case in enumerate(cases, 1):
        res = run_case(case, sessions=sessions, device=device)
        statuses[res.status.value + (f"/{res.error_kind}" if res.error_kind else "")] += 1
        a, r = held(device)
        segs, exp = segments()
        print(
            f"{i:4d} {res.status.value:5s} {res.error_kind or '-':9s} | {a:6.2f} {r:6.2f} | "
            f"{len(sessions)}/{sessions.held_bytes() / G:6.2f} | {segs} ({exp}) | {case.case_id}"
            + (f"\n     {res.reason[:300]}" if res.error_kind else ""),
            flush=True,
        )
        if res.error_kind == memory.OOM_KIND or "out of memory" in res.reason.lower():
            drop(sessions, device, args.leak_gib, args.history, f"after the out-of-memory of case {i}")
        elif i % args.drop_every == 0:
            drop(sessions, device, args.leak_gib, args.history, f"every {args.drop_every}")
        if args.budget_s and time.perf_counter() - t0 > args.budget_s:
            print(f"stopped after {i} cases: --budget-s {args.budget_s}")
            break
    drop(sessions, device, args.leak_gib, args.history, "end")
    print(f"{sum(statuses.values())} cases in {time.perf_counter() - t0:.1f} s: {dict(statuses)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
