"""Benchmark the dispatch policies in simulation: ratio of makespan to the lower bound.

    python benchmarks/simulate_bench.py                 # table: mean / worst ratio over seeds
    python benchmarks/simulate_bench.py --json out.json # and every run as JSON
    python benchmarks/simulate_bench.py --quick         # one seed, small scales only

Scales: 512 GPUs (64 x 8) with 20k cases, 64 GPUs (8 x 8) with 2.5k, 8 GPUs (1 x 8) with 300;
sigma (estimate error) 0.25, 0.5, 1.0. "ours-no-reserve" is "ours" with the starvation guard off.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from orchestrator.scheduling import policy as policy_mod
from orchestrator.scheduling.policy import Task
from orchestrator.scheduling.simulate import simulate, synthetic_workload

SCALES = ((512, 64, 20000), (64, 8, 2500), (8, 1, 300))
SIGMAS = (0.25, 0.5, 1.0)
POLICIES = ("ours", "ours-no-reserve", "hash", "static-duration")


def run_one(name: str, tasks, nodes, true):
    if name == "ours-no-reserve":
        policy_mod.Dispatcher.reserve = False
        try:
            return simulate(tasks, nodes, "ours", true)
        finally:
            policy_mod.Dispatcher.reserve = True
    return simulate(tasks, nodes, name, true)


def gang_behind_long_work(seed: int):
    """Where starvation bites: 2 x 8 GPUs busy with 16 long tp1 cases, then a long tp8 gang, then
    1000 short tp1 cases that greedy backfill would run before the gang ever sees 8 free GPUs."""
    rng = random.Random(seed)
    tasks = [Task(f"long{i}", 1, 101.0) for i in range(16)] + [Task("gang", 8, 100.0)]
    tasks += [Task(f"short{i}", 1, 1.0) for i in range(1000)]
    return tasks, {t.id: t.est_s * rng.lognormvariate(0.0, 0.1) for t in tasks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args(argv)
    scales = SCALES[1:] if args.quick else SCALES
    seeds = range(1 if args.quick else args.seeds)
    rows = []
    print(
        f"{'GPUs':>5} {'nodes':>5} {'cases':>6} {'sigma':>5} {'policy':<16} {'ratio mean':>10} {'worst':>7} {'util':>6} {'sim s':>6}"
    )
    for gpus, nodes_n, cases in scales:
        nodes = [gpus // nodes_n] * nodes_n
        for sigma in SIGMAS:
            workloads = [synthetic_workload(cases, seed, sigma) for seed in seeds]
            for name in POLICIES:
                ratios, utils, secs = [], [], []
                for seed, (tasks, true) in zip(seeds, workloads):
                    t0 = time.perf_counter()
                    r = run_one(name, tasks, nodes, true)
                    secs.append(time.perf_counter() - t0)
                    ratios.append(r.ratio)
                    utils.append(r.gpu_utilisation)
                    rows.append(
                        {
                            "gpus": gpus,
                            "nodes": nodes_n,
                            "cases": cases,
                            "sigma": sigma,
                            "seed": seed,
                            "policy": name,
                            **r.to_dict(),
                            "sim_seconds": secs[-1],
                        }
                    )
                print(
                    f"{gpus:>5} {nodes_n:>5} {cases:>6} {sigma:>5} {name:<16} {statistics.mean(ratios):>10.3f} "
                    f"{max(ratios):>7.3f} {statistics.mean(utils):>6.1%} {statistics.mean(secs):>6.2f}"
                )
    print("\ngang behind long work (2 x 8 GPUs, 1017 cases, sigma 0.1):")
    for name in POLICIES:
        ratios = []
        for seed in seeds:
            tasks, true = gang_behind_long_work(seed)
            r = run_one(name, tasks, [8, 8], true)
            ratios.append(r.ratio)
            rows.append({"scenario": "gang-behind-long-work", "seed": seed, "policy": name, **r.to_dict()})
        print(f"  {name:<16} ratio mean {statistics.mean(ratios):.3f} worst {max(ratios):.3f}")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
