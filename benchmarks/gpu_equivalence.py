"""Run the graph-equivalence programs through every runner available here and write JSON:

    {"programs": {program: {runner: verdict}}, "expected": {...},
     "agreement": {"runners_agree": bool, "match_expected": {runner: bool}}, "device": ..., "torch": ...}

On a GPU machine: the real runner (cuda/hip) on the GPU and the emulated runner on CPU, so the two
are compared program by program. Without a GPU: the emulated runner only.

    python benchmarks/gpu_equivalence.py --out $OUT/equivalence.json
Exit code 0 when every runner matches the expected table, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from backend.graphs import make_graph_runner  # noqa: E402
from backend.graphs.equivalence import EXPECTED, PROGRAMS, run_program  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("equivalence.json"))
    args = parser.parse_args(argv)

    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.insert(0, torch.device("cuda", 0))

    table: dict[str, dict[str, str]] = {p.name: {} for p in PROGRAMS}
    errors: dict[str, str] = {}
    runners: list[str] = []
    for device in devices:
        runner = make_graph_runner(device)
        runners.append(runner.kind)
        for program in PROGRAMS:
            try:
                table[program.name][runner.kind] = run_program(program, runner, device)
            except Exception as e:  # a program that crashes is reported, not fatal
                table[program.name][runner.kind] = "error"
                errors[f"{program.name}/{runner.kind}"] = f"{type(e).__name__}: {e}".splitlines()[0]

    match = {kind: all(table[p][kind] == EXPECTED[p] for p in table) for kind in runners}
    agree = all(len(set(verdicts.values())) == 1 for verdicts in table.values())
    report = {
        "programs": table,
        "expected": EXPECTED,
        "agreement": {"runners_agree": agree, "match_expected": match},
        "errors": errors,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "hip": torch.version.hip,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    width = max(len(p) for p in table)
    for name, verdicts in table.items():
        cells = "  ".join(f"{k}={v}" for k, v in verdicts.items())
        print(f"{name:<{width}}  expected={EXPECTED[name]:<13}  {cells}")
    print(f"runners agree: {agree}; match expected: {match}; wrote {args.out}")
    return 0 if all(match.values()) and agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
