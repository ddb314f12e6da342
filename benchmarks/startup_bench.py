"""Start-up figures: what `orch` spends before the first case is dispatched.

    PYTHONPATH=$PWD OUT=/tmp/startup python benchmarks/startup_bench.py [--repeat 5] [--devices cpu|gpu|both]

Every figure is the median over fresh interpreters (a warm process would hide import cost):
  cli_import      `import orchestrator.cli` (what `orch --help` pays)
  expand          load_matrix(full.yaml, backend_checks=False): parse, validate, expand; no torch
  load            load_matrix(full.yaml): the above plus the backend classes (torch, and on a GPU
                  machine Triton/AITER where a provider's module imports them)
  torch_import    `import torch` alone, the floor the backend stage cannot go under today
  plan_json/plan_text  `orch plan matrices/full.yaml` end to end (subprocess wall time)
plus which heavy modules (torch, triton, aiter, ray) each step leaves in sys.modules, and the
slowest imports of `load` from `python -X importtime`. Writes OUT/startup.json and
OUT/startup.md (OUT defaults to ./orch-out/startup) and prints a short summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATRIX = "matrices/full.yaml"
HEAVY = ("torch", "triton", "aiter", "ray")

PROBES = {
    "cli_import": "import orchestrator.cli",
    "torch_import": "import torch",
    "expand": f"from orchestrator.matrix import load_matrix\nm = load_matrix({MATRIX!r}, devices=DEVICES, backend_checks=False)",
    "load": f"from orchestrator.matrix import load_matrix\nm = load_matrix({MATRIX!r}, devices=DEVICES)",
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Keep the caller's PYTHONPATH (on the GPU box it carries Ray and AITER) with the repo first.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    return env


def probe(name: str, devices: str) -> dict:
    code = (
        textwrap.dedent(f"""
        import json, sys, time
        DEVICES = {devices!r}
        t0 = time.perf_counter()
    """)
        + PROBES[name]
        + textwrap.dedent(f"""

        dt = time.perf_counter() - t0
        n = len(m.cases) if "m" in dir() else None
        print(json.dumps({{"s": dt, "cases": n, "heavy": sorted(x for x in {HEAVY!r} if x in sys.modules)}}))
    """)
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def wall(argv: list[str]) -> dict:
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *argv],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return {"s": time.perf_counter() - t0, "rc": done.returncode}


def slowest_imports(devices: str, top: int = 12) -> list[dict]:
    code = f"from orchestrator.matrix import load_matrix\nload_matrix({MATRIX!r}, devices={devices!r})"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    rows = []
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2].rstrip()
        depth = (len(name) - len(name.lstrip())) // 2
        rows.append({"module": name.strip(), "cumulative_ms": int(parts[1]) / 1000, "depth": depth})
    # Top-level imports (depth <= 1) are the ones that add up to the wall time.
    rows = [r for r in rows if r["depth"] <= 1]
    return sorted(rows, key=lambda r: -r["cumulative_ms"])[:top]


def run(devices: str, repeat: int) -> dict:
    out: dict = {"devices": devices, "probes": {}}
    for name in PROBES:
        samples = [probe(name, devices) for _ in range(repeat)]
        errors = [s["error"] for s in samples if "error" in s]
        if errors:
            out["probes"][name] = {"error": errors[0]}
            continue
        out["probes"][name] = {
            "median_s": round(statistics.median(s["s"] for s in samples), 4),
            "min_s": round(min(s["s"] for s in samples), 4),
            "cases": samples[0]["cases"],
            "heavy_modules": samples[0]["heavy"],
        }
    for name, argv in (
        ("plan_json", ["plan", MATRIX, "--json", "--devices", devices]),
        ("plan_text", ["plan", MATRIX, "--devices", devices]),
    ):
        samples = [wall(argv) for _ in range(repeat)]
        out["probes"][name] = {"median_s": round(statistics.median(s["s"] for s in samples), 4), "rc": samples[0]["rc"]}
    out["slowest_imports_of_load"] = slowest_imports(devices)
    return out


def markdown(report: dict) -> str:
    lines = [
        f"# orch start-up ({report['python']}, {report['host_cpus']} CPUs)",
        "",
        "| devices | step | median s | min s | cases | heavy modules loaded |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        for name, p in r["probes"].items():
            if "error" in p:
                lines.append(f"| {r['devices']} | {name} | error: {p['error']} | | | |")
                continue
            heavy = ", ".join(p.get("heavy_modules", [])) or ("-" if "heavy_modules" in p else "")
            lines.append(
                f"| {r['devices']} | {name} | {p['median_s']:.3f} | {p.get('min_s', '')} | "
                f"{p.get('cases') or ''} | {heavy} |"
            )
    for r in report["runs"]:
        lines += [
            "",
            f"Slowest top-level imports of `load` ({r['devices']}):",
            "",
            "| module | cumulative ms |",
            "|---|---|",
        ]
        lines += [f"| {x['module']} | {x['cumulative_ms']:.0f} |" for x in r["slowest_imports_of_load"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--devices", choices=("cpu", "gpu", "both"), default="both")
    args = ap.parse_args()
    out_dir = os.environ.get("OUT") or os.path.join(REPO, "orch-out", "startup")
    os.makedirs(out_dir, exist_ok=True)
    devices = ("cpu", "gpu") if args.devices == "both" else (args.devices,)
    report = {
        "python": sys.version.split()[0],
        "host_cpus": os.cpu_count(),
        "matrix": MATRIX,
        "repeat": args.repeat,
        "runs": [run(d, args.repeat) for d in devices],
    }
    with open(os.path.join(out_dir, "startup.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out_dir, "startup.md"), "w") as f:
        f.write(markdown(report))
    for r in report["runs"]:
        p = r["probes"]
        fig = {k: (v.get("median_s") if "error" not in v else "error") for k, v in p.items()}
        heavy = p.get("expand", {}).get("heavy_modules")
        print(
            f"{r['devices']}: "
            + ", ".join(f"{k} {v}" for k, v in fig.items())
            + f" s; expand imports {heavy or 'nothing heavy'}"
        )
    print(f"wrote {out_dir}/startup.json and startup.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
