"""The seed, replayed: matrices/seed.yaml over vLLM's own ROCM_AITER_FA from 0.10.2 (the
release with #22721: ALWAYS) and 0.11.0 (the first with #25104: UNIFORM_SINGLE_TOKEN_DECODE), one
process per release (a process imports one vllm), and the two verdict tables side by side.

    python benchmarks/build_vllm_wheel.py --seed --site && python benchmarks/gpu_seed.py --devices cpu
    # the GPU machine (no registry): build .whl-seed/ here (python benchmarks/build_vllm_wheel.py
    # --seed), carry it, and there:
    python3 benchmarks/gpu_seed.py --install .whl-seed --out-dir $OUT

Each release runs benchmarks/gpu_vllm.py in a child process with ORCH_VLLM=RELEASE (its target
dir .vllm-RELEASE/, backend/adapters/vllm/release.py): the same matrix, checker, modes, reference
and gate as `orch run`, in-process (no Ray: the GPU machine has none). --install first installs
each release, its extras and orch's own dependencies from the carried folder into .vllm-RELEASE/
(pip --no-index --no-deps --target) and puts that dir on the child's PYTHONPATH.

Expected (docs/VLLM.md "The seed, replayed"): 0.10.2 FAILs the replay check exactly on FULL x the
batches with a prefill row, every bad row a prefill request's; every other cell passes. 0.11.0
passes every cell, FULL resolved to FULL_AND_PIECEWISE. Writes --out-dir/gpu_seed.md (the tables)
and gpu_seed.json (every row), and each release's gpu_vllm.json under --out-dir/RELEASE/.
Exit: 0 both releases as expected; 1 otherwise (each difference is printed); 2 bad input.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKEND = "vllm:ROCM_AITER_FA"
RED, GREEN = "0.10.2", "0.11.0"
DECLARED = {RED: "ALWAYS (#22721)", GREEN: "UNIFORM_SINGLE_TOKEN_DECODE (#25104)"}
_REQUEST = re.compile(r"(\d+) \((?:\d+ of )?q (\d+)\)")


def _builder():
    spec = importlib.util.spec_from_file_location("build_vllm_wheel", ROOT / "benchmarks" / "build_vllm_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bad_requests(reason: str) -> list[tuple[int, int]]:
    """(request, query len) of every request the replay reason names ("bad rows 14/17 in requests
    3 (q 5), 4 (q 9)")."""
    _, _, tail = reason.partition("bad rows ")
    return [(int(r), int(q)) for r, q in _REQUEST.findall(tail)]


def expected(release: str, row: dict) -> str | None:
    """Why `row` is not what the release should give, or None."""
    if row["status"] == "skip":
        return f"skipped: {row['reason']}"
    if release == GREEN:
        if row["status"] != "pass":
            return f"{row['status']}: {row['reason']}"
        if row["mode"] == "FULL" and row["resolved"] != "FULL_AND_PIECEWISE":
            return f"FULL resolved to {row['resolved']}, not FULL_AND_PIECEWISE"
        return None
    red = row["mode"] == "FULL" and row["has_prefill"]
    if not red:
        return None if row["status"] == "pass" else f"{row['status']}: {row['reason']}"
    if row["status"] != "fail" or not row["reason"].startswith("replay check failed"):
        return f"expected a replay FAIL, got {row['status']}: {row['reason']}"
    named = bad_requests(row["reason"])
    if not named or any(q <= 1 for _, q in named):
        return f"bad rows are not all prefill rows: {row['reason']}"
    return None


def table(release: str, rows: list[dict]) -> list[str]:
    cols = list(dict.fromkeys((r["kv"], r["batch"]) for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    cell = {(r["mode"], r["kv"], r["batch"]): r for r in rows}
    out = ["| mode -> resolved | " + " | ".join(f"{kv} {b}" for kv, b in cols) + " |", "|---|" + "---|" * len(cols)]
    for mode in modes:
        resolved = next((r["resolved"] for r in rows if r["mode"] == mode and r["resolved"]), "")
        cells = []
        for kv, b in cols:
            r = cell.get((mode, kv, b))
            cells.append("" if r is None else ("**FAIL**" if r["status"] == "fail" else r["status"]))
        out.append(f"| {mode} -> {resolved or '?'} | " + " | ".join(cells) + " |")
    return out


def run_release(release: str, a, out_dir: Path, builder) -> tuple[list[dict], dict, str]:
    """Run the matrix under `release` in a child process: (rows, meta, the child's last lines)."""
    env = dict(os.environ, ORCH_VLLM=release, PYTHONUNBUFFERED="1")
    paths = [str(ROOT)]
    if a.install:
        site = builder.site_dir(release)
        took = builder.install_site(a.install, release, site, orch_deps=True)
        print(f"gpu_seed: vllm {release}, its extras and orch's deps installed into {site} in {took:.1f} s", flush=True)
        paths.insert(0, site)
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH", "")] if p])
    dest = out_dir / release
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "gpu_vllm.py"),
        "--matrix",
        a.matrix,
        "--backend",
        BACKEND,
        "--devices",
        a.devices,
        "--filter",
        a.filter,
        "--mutant",
        "",
        "--out-dir",
        str(dest),
        "--budget-s",
        str(a.budget_s),
    ]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    (out_dir / f"{release}.log").write_text("\n".join(lines) + "\n")
    report = dest / "gpu_vllm.json"
    if proc.returncode == 2 or not report.is_file():
        raise RuntimeError(f"vllm {release}: gpu_vllm.py exited {proc.returncode}: {lines[-1] if lines else ''}")
    doc = json.loads(report.read_text())
    by_id = {r["case_id"]: r for r in doc["results"]}
    rows = []
    for row in doc["rows"]:
        versions = by_id.get(row["case_id"], {}).get("versions", {})
        rows.append(
            {
                **row,
                "has_prefill": row["kind"] != "decode",
                "vllm": versions.get("vllm", ""),
                "kernels": versions.get("kernels", ""),
            }
        )
    for s in doc["skipped"]:
        rows.append(
            {
                "case_id": s["case_id"],
                "status": "skip",
                "reason": s["reason"],
                "mode": "",
                "kv": "",
                "batch": "",
                "resolved": "",
                "has_prefill": False,
                "vllm": "",
                "kernels": "",
            }
        )
    summary = next((ln for ln in reversed(lines) if ln.startswith("gpu_vllm: gate") or "no runnable" in ln), "")
    return rows, doc, summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", default=f"{RED},{GREEN}", help=f"comma-separated (default {RED},{GREEN})")
    ap.add_argument("--matrix", default="matrices/seed.yaml")
    ap.add_argument("--filter", default="", help="a --filter expression for both releases ('' = every case)")
    ap.add_argument("--devices", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--install", default=None, help="a folder of wheels (.whl-seed) to install each release from first")
    ap.add_argument("--out-dir", default=os.environ.get("OUT") or "gpu_seed-out")
    ap.add_argument(
        "--budget-s", type=float, default=230.0, help="per release: no case starts after this (default 230)"
    )
    a = ap.parse_args(argv)
    releases = [r.strip() for r in a.releases.split(",") if r.strip()]
    builder = _builder()
    unknown = [r for r in releases if r not in (RED, GREEN)]
    if unknown or not releases:
        print(f"gpu_seed: --releases {a.releases}: the seed's releases are {RED} and {GREEN}", file=sys.stderr)
        return 2
    if a.install and not Path(a.install).is_dir():
        print(
            f"gpu_seed: --install {a.install}: no such folder (build it: python benchmarks/build_vllm_wheel.py --seed)",
            file=sys.stderr,
        )
        return 2
    missing = [r for r in releases if not a.install and not (Path(builder.site_dir(r)) / "vllm").is_dir()]
    if missing:
        print(
            f"gpu_seed: no .vllm-{missing[0]}/ here: build the releases' target dirs first "
            "(python benchmarks/build_vllm_wheel.py --seed --site), or give --install FOLDER",
            file=sys.stderr,
        )
        return 2
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    md, everything, problems = ["# The seed, replayed: vllm:ROCM_AITER_FA, " + ", ".join(releases), ""], {}, []
    for release in releases:
        try:
            rows, doc, tail = run_release(release, a, out_dir, builder)
        except RuntimeError as e:
            print(f"gpu_seed: {e}", file=sys.stderr)
            return 2
        everything[release] = rows
        ran = [r for r in rows if r["status"] != "skip"]
        fails = [r for r in rows if r["status"] == "fail"]
        misses = [(r["case_id"], why) for r in rows if (why := expected(release, r))]
        misses += [(case, "not run (budget)") for case in doc["not_run"]]
        problems += [f"vllm {release} {case}: {why}" for case, why in misses]
        kernels = ", ".join(sorted({r["kernels"] for r in ran if r["kernels"]})) or "vLLM's"
        verdict = "as expected" if not misses else f"NOT as expected ({len(misses)} cells)"
        head = (
            f"## vllm {release}: ROCM_AITER_FA declares {DECLARED[release]}; {len(ran)} cases, "
            f"{len(fails)} FAIL; kernels: {kernels}; device {doc['device']}; {verdict}"
        )
        lines = [head, "", *table(release, [r for r in rows if r["status"] != "skip"]), ""]
        lines += [f"- FAIL `{r['case_id']}`: {r['reason']}" for r in fails]
        md += lines + [""]
        print("\n".join(lines), flush=True)
        print(f"({tail})\n", flush=True)
    (out_dir / "gpu_seed.md").write_text("\n".join(md) + "\n")
    (out_dir / "gpu_seed.json").write_text(
        json.dumps({"releases": everything, "problems": problems, "wall_s": time.perf_counter() - t0}, indent=1)
    )
    for p in problems:
        print(f"gpu_seed: {p}", file=sys.stderr)
    status = "both releases as expected" if not problems else f"{len(problems)} cells not as expected"
    print(
        f"gpu_seed: {status}; {time.perf_counter() - t0:.1f} s; wrote {out_dir / 'gpu_seed.md'} and "
        f"{out_dir / 'gpu_seed.json'}"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
