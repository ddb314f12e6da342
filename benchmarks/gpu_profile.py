"""Where a case's time goes: run a filtered slice of a matrix in this process (no Ray), in
dispatch-like order (grouped by backend and kv dtype, modes of one batch back to back), under
cProfile, and print per-case phase timings and the top functions by cumulative time.

    PYTHONPATH=$PWD python benchmarks/gpu_profile.py matrices/full.yaml \
        --filter "tp=1 backend=torch,aiter-triton" [--devices gpu] [--limit 40] [--top 30]

The phase timings are the checker's own (CaseResult.timings: session_s, capture_s, inputs_s,
snapshot_s, eager_s, reference_s, checks_s); "other" is total_s minus their sum (graph replays,
step planning, Python around them).

`--solo-rank` profiles one rank of tp > 1 cases alone, in this process, without a gang (no
collectives: the all-reduce is the identity, so the verdicts are meaningless, the per-rank cost is
not); `--threads N` sets torch's intra-op threads (CPU actors run with 1).

`--kernels` runs the slice a second time (warm: sessions, Triton kernels and inputs already
built) under torch.profiler with CUDA activity and prints the floor: the sum of the device time
of every kernel and copy the cases launched (graph replays included) against the slice's wall
time. That ratio is what per-case overhead costs.

`--bare` first runs the slice once without any profiler, in fresh sessions, and prints its wall
time by provider: with Triton's cache already warm on disk (after an `orch run`), what the
worker's cases would cost without Ray, the driver or the store around them; the profiled pass
then starts from fresh sessions and caches again.

`--bare-only` stops after that pass: with `--threads N`, an A/B of torch's intra-op threads on
the same slice, one process each.

`--syncs` runs the slice once more with torch's CUDA sync debug mode on and counts the host syncs
(every `.item()`, `.tolist()`, `torch.equal`, blocking copy ...) per provider, with the backend/
lines that made them: each one stops the host from queueing the next case's work while the GPU
runs this one's, so they are what pipelining cases on one worker has to remove.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
import traceback
import warnings
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.harness.checker import PHASES, SessionCache, run_case
from orchestrator.filters import select
from orchestrator.matrix import load_matrix


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("matrix")
    ap.add_argument("--filter", default="tp=1")
    ap.add_argument("--devices", default="auto")
    ap.add_argument("--limit", type=int, default=0, help="first N cases of the ordered slice (0: all)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument(
        "--solo-rank",
        action="store_true",
        help="tp > 1 cases: run rank 0 alone (no gang; verdicts meaningless, costs per rank)",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    ap.add_argument(
        "--bare",
        action="store_true",
        help="first run the slice unprofiled in fresh sessions: its wall time by provider",
    )
    ap.add_argument("--bare-only", action="store_true", help="--bare and nothing after it (an A/B of --threads)")
    ap.add_argument(
        "--kernels",
        action="store_true",
        help="then run the slice again under torch.profiler: device time against wall time",
    )
    ap.add_argument(
        "--calls",
        action="store_true",
        help="then run the slice again timing the harness's device-heavy helpers (synchronised)",
    )
    ap.add_argument(
        "--poison-all",
        action="store_true",
        help="poison every free block before a replay, not only what the graphs may read (the A/B)",
    )
    ap.add_argument("--by-batch", action="store_true", help="--kernels: one floor per family and batch")
    ap.add_argument(
        "--syncs",
        action="store_true",
        help="then run the slice again counting host syncs (torch's sync debug mode) and where",
    )
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    if args.poison_all:
        from backend.harness.session import Session

        Session.outside_reads = lambda self, keys: None  # type: ignore[method-assign]
    matrix = load_matrix(args.matrix, devices=args.devices)
    cases = select(matrix.cases, args.filter)
    cases.sort(key=lambda c: (c.backend, c.kv_cache_dtype, c.batch.name, c.mode))
    if args.limit:
        cases = cases[: args.limit]
    if args.bare or args.bare_only:
        bare_pass(cases, args.solo_rank)
        if args.bare_only:
            return 0
    sessions = SessionCache()
    totals: dict[str, float] = defaultdict(float)
    profiler = cProfile.Profile()
    t0, cpu0 = time.perf_counter(), time.process_time()
    print(
        f"{'case':58} {'status':6} {'total':>7} "
        + " ".join(f"{p[:-2]:>9}" for p in ("capture_s", *PHASES))
        + "   other"
    )
    for case in cases:
        profiler.enable()
        r = run_case(case, sessions=sessions, world_size=case.tp if args.solo_rank else 1)
        profiler.disable()
        t = r.timings
        parts = [t.get(p, 0.0) for p in ("capture_s", *PHASES)]
        other = t.get("total_s", 0.0) - sum(parts)
        for name, v in zip(("capture_s", *PHASES), parts):
            totals[name] += v
        totals["other"] += other
        totals["total_s"] += t.get("total_s", 0.0)
        print(
            f"{case.case_id:58} {r.status.value:6} {t.get('total_s', 0.0):7.3f} "
            + " ".join(f"{v:9.3f}" for v in parts)
            + f" {other:7.3f}"
            + (f"  {r.reason[:80]}" if r.reason else "")
        )
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(
        f"\n{len(cases)} cases in {wall:.1f} s ({len(cases) / wall:.2f} cases/s), {cpu:.1f} s of CPU in this "
        f"process ({cpu / max(len(cases), 1) * 1000:.0f} ms a case, under the profiler); sessions built {sessions.misses}"
    )
    print("seconds by phase: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(totals.items(), key=lambda kv: -kv[1])))
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue())
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    if args.kernels:
        kernel_floor(cases, sessions, args.solo_rank, args.by_batch)
    if args.calls:
        time_calls(cases, sessions, args.solo_rank)
    if args.syncs:
        count_syncs(cases, sessions, args.solo_rank, args.top)
    return 0


def _by_provider(cases, by_batch: bool = False) -> dict[str, list]:
    groups: dict[str, list] = defaultdict(list)
    for case in cases:
        label = f"{case.model.attention}/{case.batch.name}" if by_batch else case.backend_label
        groups[label].append(case)
    return groups


def bare_pass(cases, solo_rank: bool) -> None:
    """The slice once, unprofiled, in a SessionCache of its own; then the process's checker caches
    are cleared so that what follows starts as fresh as this did."""
    import torch

    from backend.harness.checker import clear_process_caches

    sessions = SessionCache()
    cuda = torch.cuda.is_available()
    t_all = time.perf_counter()
    for label, group in _by_provider(cases).items():
        t0 = time.perf_counter()
        statuses: Counter = Counter()
        for case in group:
            statuses[run_case(case, sessions=sessions, world_size=case.tp if solo_rank else 1).status.value] += 1
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        print(
            f"bare [{label}]: {len(group)} cases in {wall:.2f} s ({wall * 1e3 / max(len(group), 1):.1f} ms a case); "
            + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
        )
    wall = time.perf_counter() - t_all
    print(f"bare: {len(cases)} cases in {wall:.2f} s, no profiler, fresh sessions, sessions built {sessions.misses}\n")
    sessions.clear()
    clear_process_caches()
    if cuda:
        torch.cuda.empty_cache()


def kernel_floor(cases, sessions, solo_rank: bool, by_batch: bool = False) -> None:
    """The slice again, warm, under torch.profiler: summed device time of kernels and memcpys
    (what the cases need from the GPU) against the wall time the checker took."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from backend.harness.checker import clear_process_caches

    clear_process_caches()  # the references and step inputs drawn again, as a fresh worker would
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    groups = _by_provider(cases, by_batch)  # one floor per provider (or batch), then the whole slice
    total_wall = total_device = 0.0
    total_launches = 0
    overall: Counter = Counter()  # the slice's kernels by name (device us), every group summed
    overall_n: Counter = Counter()
    for label, group in groups.items():
        t0 = time.perf_counter()
        with profile(activities=activities) as prof:
            for case in group:
                run_case(case, sessions=sessions, world_size=case.tp if solo_rank else 1)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        device_us = 0.0
        by_name: dict[str, float] = defaultdict(float)
        launches: Counter = Counter()
        for ev in prof.events():
            if getattr(ev, "device_type", None) is not None and ev.device_type.name == "CUDA":
                us = ev.time_range.elapsed_us()
                device_us += us
                by_name[ev.name[:70]] += us
                launches[ev.name[:70]] += 1
        n = sum(launches.values())
        overall.update(by_name)
        overall_n.update(launches)
        total_wall += wall
        total_device += device_us / 1e6
        total_launches += n
        print(
            f"\nkernel floor [{label}]: {len(group)} cases, wall {wall:.2f} s under the profiler, device time "
            f"{device_us / 1e6:.3f} s ({device_us / 1e3 / max(len(group), 1):.2f} ms a case), {n} kernels and "
            f"copies ({n / max(len(group), 1):.0f} a case); wall / device = {wall / max(device_us / 1e6, 1e-9):.1f}"
        )
        for name, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:12]:
            print(f"  {us / 1e3:10.2f} ms {launches[name]:8d} x  {name}")
    print(
        f"\nkernel floor: {len(cases)} cases, wall {total_wall:.2f} s under the profiler, device time "
        f"{total_device:.3f} s ({total_device * 1e3 / max(len(cases), 1):.2f} ms a case), {total_launches} kernels "
        f"and copies; wall / device = {total_wall / max(total_device, 1e-9):.1f}"
    )
    for name, us in sorted(overall.items(), key=lambda kv: -kv[1])[:30]:
        print(f"  {us / 1e3:10.2f} ms {overall_n[name]:8d} x  {name}")


# The helpers a step calls around the backend (module, attribute as the caller imported it).
_HELPERS = (
    ("backend.harness.sides", "poison_free_memory"),
    ("backend.harness.sides", "poison_outputs"),
    ("backend.harness.sides", "kv_integrity"),
    ("backend.harness.checker", "churn"),
    ("backend.harness.checker", "take_snapshot"),
    ("backend.harness.checker", "fill_context"),
    ("backend.harness.checker", "step_inputs"),
    ("backend.harness.checker", "capture_checked"),
    ("backend.harness.checker", "eager_side"),
    ("backend.harness.checker", "graph_side"),
    ("backend.harness.sides", "equal_many"),
    ("backend.harness.step_data", "compute_reference"),
    ("backend.harness.session", "Session.run_graph_step"),
    ("backend.harness.session", "Session.run_eager_step"),
)


def time_calls(cases, sessions, solo_rank: bool) -> None:
    """The slice again (process caches cleared), each helper of _HELPERS wrapped in a device
    synchronise on both sides: its seconds and calls, and the bytes poison_free_memory filled.
    The synchronises cost the host's lead over the GPU: the case times here are no figure."""
    import importlib

    import torch

    from backend.harness.checker import clear_process_caches

    clear_process_caches()
    sessions.clear()  # fresh sessions: a session's eager memo would skip the eager sides and references
    cuda = torch.cuda.is_available()
    spent: dict[str, float] = defaultdict(float)
    calls: Counter = Counter()
    poisoned = [0]
    originals = []

    def wrap(name, fn):
        def timed(*a, **k):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(*a, **k)
            if cuda:
                torch.cuda.synchronize()
            spent[name] += time.perf_counter() - t0
            calls[name] += 1
            if name == "poison_free_memory":
                poisoned[0] += int(out)
            return out

        return timed

    for mod_name, path in _HELPERS:
        owner = importlib.import_module(mod_name)
        *outer, attr = path.split(".")
        for part in outer:  # a class's method: wrapped on the class
            owner = getattr(owner, part)
        fn = getattr(owner, attr, None)
        if fn is None:
            continue
        originals.append((owner, attr, fn))
        setattr(owner, attr, wrap(attr, fn))
    t0 = time.perf_counter()
    try:
        for case in cases:
            run_case(case, sessions=sessions, world_size=case.tp if solo_rank else 1)
        if cuda:
            torch.cuda.synchronize()
    finally:
        for mod, attr, fn in originals:
            setattr(mod, attr, fn)
    wall = time.perf_counter() - t0
    print(f"\ncalls: {len(cases)} cases in {wall:.2f} s with a synchronise around each helper")
    for name, sec in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {sec:8.3f} s {calls[name]:7d} x  {name}")
    if calls["poison_free_memory"]:
        print(
            f"  poison_free_memory filled {poisoned[0] / 2**30:.1f} GiB in all, "
            f"{poisoned[0] / calls['poison_free_memory'] / 2**30:.2f} GiB a replay"
        )


def count_syncs(cases, sessions, solo_rank: bool, top: int) -> None:
    """Host syncs per provider, and the backend/ lines that made them (torch warns on each sync
    in debug mode "warn"; the warning's stack names the line)."""
    import torch

    if not torch.cuda.is_available():
        print("\nsyncs: no CUDA device, nothing to count")
        return
    root = str(Path(__file__).resolve().parents[1])
    sites: Counter = Counter()
    count = [0]

    def on_warning(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        count[0] += 1
        ours = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(root + "/backend/")]
        where = ours[-1] if ours else None
        sites[f"{where.filename[len(root) + 1 :]}:{where.lineno} {where.name}" if where else "outside backend/"] += 1

    groups = _by_provider(cases)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = on_warning
        torch.cuda.set_sync_debug_mode("warn")
        try:
            torch.zeros(1, device="cuda").item()  # a known sync: is the counting working at all?
            if count[0] == 0:
                print("\nsyncs: torch's sync warnings did not reach Python; not counted")
                return
            count[0] = 0
            sites.clear()
            for label, group in groups.items():
                before = count[0]
                for case in group:
                    run_case(case, sessions=sessions, world_size=case.tp if solo_rank else 1)
                n = count[0] - before
                print(f"\nsyncs [{label}]: {n} in {len(group)} cases ({n / max(len(group), 1):.1f} a case)")
        finally:
            torch.cuda.set_sync_debug_mode("default")
    print(f"syncs: {count[0]} in {len(cases)} cases; by line (cases re-run in their sessions share no graph side):")
    for site, n in sites.most_common(top):
        print(f"  {n:7d}  {site}")


if __name__ == "__main__":
    sys.exit(main())
