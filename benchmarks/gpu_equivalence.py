"""Run the graph probe corpus (tests/graphs/probes.py) under the CPU emulation and, where there is
a GPU, under real CUDA/HIP graphs; write the golden table of real-graph verdicts and a comparison.
One script, both halves: on a CPU machine it checks the emulation against the repo's golden file;
on the GPU machine it records the golden file (the lead's step for the derived verdicts).

    # on the GPU machine (torch 2.11 CUDA), from the repo root:
    PYTHONUNBUFFERED=1 PYTHONPATH=$PWD python3 benchmarks/gpu_equivalence.py --out $OUT/golden_cuda.json

Writes, next to --out (default $OUT/golden_cuda.json, else ./golden_cuda.json):
- golden_cuda.json (GPU only): {"source": "recorded", "device", "torch", "hip", "verdicts": {probe: verdict},
  "errors": {probe: message}}; the same format as tests/graphs/golden_cuda.json, which it replaces
  (the repo file may also list "derived": probes whose verdict was reasoned from CUDA semantics,
  each with its reasoning, and not yet recorded; a recorded file has none);
- golden_cuda.md (GPU only): the table for docs/CHECKER.md;
- probe_comparison.json: {"programs": {probe: {runner: verdict}}, "golden": {...}, "disagree": [...],
  "errors": {...}} comparing every runner here with the golden table (the fresh GPU one when there
  is a GPU, else the repo's) and the emulation's stated conservative verdicts.
- probe_verdicts.json: {probe: {"emulated": ..., "cuda": ..., "derived": ... (the repo's reasoned
  verdict, where it had one), "agrees": bool}} — the GPU half beside the CPU half, one line each.
Exit code 0 when the emulation matches the golden table (or its conservative or unverifiable
verdict) on every probe.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402 - after the repo is put on sys.path

from backend.graphs import GraphCaptureError, make_graph_runner  # noqa: E402 - after the repo is put on sys.path
from backend.graphs.equivalence import run_program  # noqa: E402 - after the repo is put on sys.path
from backend.graphs.provenance import host_scope  # noqa: E402 - after the repo is put on sys.path
from tests.graphs.probes import CONSERVATIVE, PROGRAMS, UNVERIFIABLE  # noqa: E402 - after the repo is put on sys.path

REPO_GOLDEN = ROOT / "tests" / "graphs" / "golden_cuda.json"


def run_corpus(device: torch.device) -> tuple[str, dict[str, str], dict[str, str]]:
    runner = make_graph_runner(device)
    verdicts: dict[str, str] = {}
    errors: dict[str, str] = {}
    for program in PROGRAMS:
        try:
            verdicts[program.name] = run_program(program, runner, device)
        except Exception as e:  # a probe that crashes (outside capture) is reported, not fatal
            verdicts[program.name] = "error"
            errors[program.name] = f"{type(e).__name__}: {e}".splitlines()[0]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return runner.kind, verdicts, errors


def capture_reason(name: str) -> str:
    """The emulation's capture error message, or its unverifiable notes, for one probe ('' if it
    captures cleanly)."""
    program = next(p for p in PROGRAMS if p.name == name)
    with host_scope("cpu"):
        inst = program.build(torch.device("cpu"))
    runner = make_graph_runner("cpu")
    runner.warmup(inst.fn, iters=1)
    try:
        graph = runner.capture(inst.fn)
    except GraphCaptureError as e:
        return str(e)
    return "; ".join(getattr(graph, "unverifiable", ()))


def emulation_ok(name: str, emulated: str, golden: str) -> bool:
    if name in CONSERVATIVE:
        verdict, phrase = CONSERVATIVE[name]
        return emulated == verdict and phrase in capture_reason(name)
    if name in UNVERIFIABLE:
        return emulated == "unverifiable" and UNVERIFIABLE[name] in capture_reason(name)
    return emulated == golden


def markdown(golden: dict, emulated: dict[str, str]) -> str:
    descriptions = {p.name: p.description for p in PROGRAMS}
    lines = [
        f"Source: {golden['source']} ({golden.get('device') or 'no device'}, torch {golden.get('torch')}).",
        "",
        "| probe | what it does | CUDA graph | emulated |",
        "|---|---|---|---|",
    ]
    derived = set(golden.get("derived", ()))
    for name, verdict in golden["verdicts"].items():
        verdict += " (derived)" if name in derived else ""
        emu = emulated.get(name, "?")
        if name in CONSERVATIVE:
            emu += " (conservative: cannot emulate)"
        if name in UNVERIFIABLE:
            emu += " (stated: it cannot see the launch)"
        lines.append(f"| {name} | {descriptions.get(name, '')} | {verdict} | {emu} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "golden_cuda.json")
    parser.add_argument("--markdown", action="store_true", help="print the repo golden table as markdown and exit")
    args = parser.parse_args(argv)

    table: dict[str, dict[str, str]] = {p.name: {} for p in PROGRAMS}
    errors: dict[str, str] = {}
    _, emulated, emu_errors = run_corpus(torch.device("cpu"))
    if args.markdown:
        print(markdown(json.loads(REPO_GOLDEN.read_text()), emulated), end="")
        return 0
    for name, verdict in emulated.items():
        table[name]["emulated"] = verdict
    errors.update({f"{k}/emulated": v for k, v in emu_errors.items()})

    args.out.parent.mkdir(parents=True, exist_ok=True)
    if torch.cuda.is_available():
        kind, real, real_errors = run_corpus(torch.device("cuda", 0))
        for name, verdict in real.items():
            table[name][kind] = verdict
        errors.update({f"{k}/{kind}": v for k, v in real_errors.items()})
        golden = {
            "source": "recorded",
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "hip": torch.version.hip,
            "verdicts": real,
            "errors": real_errors,
        }
        args.out.write_text(json.dumps(golden, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(markdown(golden, emulated))
    else:
        golden = json.loads(REPO_GOLDEN.read_text())

    disagree = [n for n in table if not emulation_ok(n, emulated[n], golden["verdicts"].get(n, "missing"))]
    report = {
        "programs": table,
        "golden": golden,
        "disagree": disagree,
        "errors": errors,
        "conservative": {k: list(v) for k, v in CONSERVATIVE.items()},
    }
    (args.out.parent / "probe_comparison.json").write_text(json.dumps(report, indent=2) + "\n")
    repo = json.loads(REPO_GOLDEN.read_text())
    side = {
        name: {
            **verdicts,
            **({"derived": repo["verdicts"].get(name)} if name in repo.get("derived", {}) else {}),
            "agrees": name not in disagree,
        }
        for name, verdicts in table.items()
    }
    (args.out.parent / "probe_verdicts.json").write_text(json.dumps(side, indent=2) + "\n")

    width = max(len(p) for p in table)
    for name, verdicts in table.items():
        cells = "  ".join(f"{k}={v}" for k, v in verdicts.items())
        mark = "" if name not in disagree else "  <-- emulation disagrees"
        print(f"{name:<{width}}  golden={golden['verdicts'].get(name, 'missing'):<13}  {cells}{mark}")
    derived = golden.get("derived", {})
    print(
        f"golden source: {golden['source']}"
        + (f" ({len(derived)} derived, not recorded)" if derived else "")
        + f"; {len(table) - len(disagree)}/{len(table)} probes agree; "
        f"errors: {len(errors)}; wrote {args.out.parent}"
    )
    return 0 if not disagree else 1


if __name__ == "__main__":
    raise SystemExit(main())
