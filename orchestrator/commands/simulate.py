"""`orch simulate`: the dispatch policies on a synthetic matrix, makespan against a lower bound."""

from __future__ import annotations

import json

from orchestrator.errors import ExitCode, InputError
from orchestrator.scheduling.policy import POLICIES
from orchestrator.scheduling.simulate import (
    SimResult,
    config_workload,
    simulate,
    synthetic_workload,
)


def _check(gpus: int, nodes: int, cases: int, sigma: float) -> None:
    if nodes <= 0:
        raise InputError(f"--nodes must be >= 1, got {nodes}")
    if gpus <= 0 or gpus % nodes:
        raise InputError(f"--gpus must be a positive multiple of --nodes ({nodes}), got {gpus}")
    if cases <= 0:
        raise InputError(f"--cases must be >= 1, got {cases}")
    if not 0 <= sigma <= 5:  # also rejects NaN
        raise InputError(f"--sigma must be in [0, 5], got {sigma}")


def run_policies(
    gpus: int, nodes: int, cases: int, policy: str, sigma: float, seed: int, modes_per_config: int = 1
) -> dict[str, SimResult]:
    _check(gpus, nodes, cases, sigma)
    if modes_per_config < 1 or modes_per_config > cases:
        raise InputError(f"--modes-per-config must be in [1, --cases ({cases})], got {modes_per_config}")
    names = POLICIES if policy == "all" else (policy,)
    for name in names:
        if name not in POLICIES:
            raise InputError(f"--policy: unknown {name!r}; choose one of {', '.join(POLICIES)}, all")
    per_node = gpus // nodes
    # A matrix for smaller nodes has no gangs wider than a node.
    if modes_per_config == 1:
        tasks, true = synthetic_workload(cases, seed, sigma, max_tp=per_node)
        return {name: simulate(tasks, [per_node] * nodes, name, true) for name in names}
    # Configs of several cudagraph modes sharing eager steps and reference on one worker: "ours"
    # takes a config's modes together; "ours-ungrouped" is the same dispatcher without that.
    tasks, true, alone = config_workload(cases // modes_per_config, modes_per_config, seed, sigma, max_tp=per_node)
    out = {name: simulate(tasks, [per_node] * nodes, name, true, alone) for name in names}
    if "ours" in out:
        out["ours-ungrouped"] = simulate(tasks, [per_node] * nodes, "ours", true, alone, group=False)
    return out


def main(
    gpus: int, nodes: int, cases: int, policy: str, sigma: float, seed: int, as_json: bool, modes_per_config: int = 1
) -> int:
    results = run_policies(gpus, nodes, cases, policy, sigma, seed, modes_per_config)
    if as_json:
        print(json.dumps({name: r.to_dict() for name, r in results.items()}, indent=2))
        return ExitCode.OK
    from rich.table import Table

    from orchestrator.console import echo

    table = Table(title=f"{cases} cases on {gpus} GPUs ({nodes} nodes x {gpus // nodes}), sigma {sigma}, seed {seed}")
    for col in ("policy", "makespan s", "lower bound s", "ratio", "GPU utilisation"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, r in results.items():
        table.add_row(name, f"{r.makespan:,.1f}", f"{r.lower_bound:,.1f}", f"{r.ratio:.3f}", f"{r.gpu_utilisation:.1%}")
    echo(table, min_width=0)  # unpadded in a pipe or a CI log
    return ExitCode.OK
