"""Where the time before the first case goes: Ray's embedded cluster and one worker's start.

    PYTHONPATH=$PWD python benchmarks/cluster_bench.py [--num-cpus 16,2] [--repeat 2] [--devices gpu|cpu] [--no-preload]

Each variant runs in a fresh interpreter (imports are part of the cost) and reports, in seconds:
  import_ray    `import ray` in the driver
  init          ray.init(...) as orchestrator/executor/cluster.py calls it (embedded_init_kwargs),
                with num_cpus=N; --no-preload: without the worker preload (torch then loads in `torch`)
  actor_ready   a one-bundle placement group plus an actor in it (as gangs.py places a tp 1
                worker) until its first method returns: process start or reuse of a prestarted
                worker, Ray's registration
  torch         `import torch` inside that actor
  device        the first tensor on the actor's device (CUDA context creation on a GPU)
  checker       `import backend.harness.checker` (the attention providers, Triton where they import it)
  shutdown      ray.shutdown()
and the number of Ray worker processes alive right after init (Ray prestarts about num_cpus of
them, each importing Ray, while the actor starts).

`--profile-init` instead runs one ray.init under cProfile (what the driver waits on) and lists
when each of the session's log files was created (when Ray started each of its processes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

INIT_KW: dict = {}  # --init-kw: extra ray.init keywords (JSON), e.g. '{"_node_ip_address": "127.0.0.1"}'
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from orchestrator.executor.cluster import embedded_init_kwargs  # imports no Ray, no torch
    t0 = time.perf_counter()
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    t1 = time.perf_counter()
    gpu = DEVICES == "gpu"
    ray.init(**{**embedded_init_kwargs(1 if gpu else 0, preload=PRELOAD), "num_cpus": NUM_CPUS, **INIT_KW})
    t2 = time.perf_counter()
    time.sleep(0.5)
    workers = subprocess.run(["pgrep", "-fc", "default_worker.py"], capture_output=True, text=True).stdout.strip()

    class Probe:
        def ping(self):
            return os.getpid()

        def load(self, device):
            a = time.perf_counter()
            import torch
            b = time.perf_counter()
            torch.zeros(1, device=device).add_(1).cpu()
            c = time.perf_counter()
            import backend.harness.checker  # noqa: F401 - importing it is what is timed
            d = time.perf_counter()
            return b - a, c - b, d - c

    t3 = time.perf_counter()
    pg = placement_group([{"GPU": 1.0} if gpu else {"CPU": 0.25}], strategy="STRICT_PACK")
    res = {"num_gpus": 1, "num_cpus": 0} if gpu else {"num_cpus": 0.25}
    actor = ray.remote(Probe).options(**res, scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=0)).remote()
    ray.get(actor.ping.remote())
    t4 = time.perf_counter()
    torch_s, device_s, checker_s = ray.get(actor.load.remote("cuda:0" if gpu else "cpu"))
    t5 = time.perf_counter()
    ray.shutdown()
    t6 = time.perf_counter()
    print(json.dumps({"import_ray": t1 - t0, "init": t2 - t1, "actor_ready": t4 - t3, "torch": torch_s,
                      "device": device_s, "checker": checker_s, "shutdown": t6 - t5,
                      "prestarted": int(workers or 0)}))
""")


PROFILE_INIT = textwrap.dedent("""
    import cProfile, glob, os, pstats, time
    import ray
    from orchestrator.executor.cluster import embedded_init_kwargs
    pr = cProfile.Profile()
    t0 = time.time()
    pr.enable()
    ray.init(**{**embedded_init_kwargs(1 if DEVICES == "gpu" else 0, preload=PRELOAD), "num_cpus": NUM_CPUS, **INIT_KW})
    pr.disable()
    print(f"ray.init {time.time() - t0:.2f} s")
    pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
    logs = ray._private.worker.global_worker.node.get_logs_dir_path()
    for f in sorted(glob.glob(os.path.join(logs, "*")), key=os.path.getctime):
        print(f"{os.path.getctime(f) - t0:7.2f} s  {os.path.basename(f)}")
    ray.shutdown()
""")


def _header(num_cpus: int, devices: str, preload: bool) -> str:
    return f"DEVICES = {devices!r}\nNUM_CPUS = {num_cpus}\nPRELOAD = {preload}\nINIT_KW = {INIT_KW!r}\n"


def profile_init(num_cpus: int, devices: str, preload: bool) -> None:
    code = _header(num_cpus, devices, preload) + PROFILE_INIT
    subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=300)


def run(num_cpus: int, devices: str, preload: bool) -> dict:
    code = _header(num_cpus, devices, preload) + PROBE
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-cpus", default=f"{os.cpu_count() or 1},2")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--devices", default="gpu" if os.path.exists("/dev/nvidia0") else "cpu")
    ap.add_argument("--profile-init", action="store_true")
    ap.add_argument(
        "--no-preload", action="store_true", help="start Ray without the worker preload (as before fb7ab84)"
    )
    ap.add_argument("--init-kw", default="{}", help="extra ray.init keywords, JSON")
    args = ap.parse_args(argv)
    INIT_KW.update(json.loads(args.init_kw))
    if args.profile_init:
        profile_init(int(args.num_cpus.split(",")[0]), args.devices, not args.no_preload)
        return 0
    keys = ("import_ray", "init", "actor_ready", "torch", "device", "checker", "shutdown")
    print("| num_cpus | " + " | ".join(keys) + " | prestarted | sum |\n|---|" + "---|" * (len(keys) + 2))
    for n in [int(x) for x in args.num_cpus.split(",")]:
        rows = []
        for _ in range(args.repeat):  # alternate would be fairer; variants are few and runs short
            r = run(n, args.devices, not args.no_preload)
            if "error" in r:
                print(f"| {n} | error: {r['error']} |")
                continue
            rows.append(r)
            print(
                f"| {n} | " + " | ".join(f"{r[k]:.2f}" for k in keys) + f" | {r['prestarted']} | "
                f"{sum(r[k] for k in keys[:-1]):.2f} |",
                flush=True,
            )
        if len(rows) > 1:
            med = {k: statistics.median(r[k] for r in rows) for k in keys}
            print(
                f"| {n} median | " + " | ".join(f"{med[k]:.2f}" for k in keys) + " | | "
                f"{sum(med[k] for k in keys[:-1]):.2f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
