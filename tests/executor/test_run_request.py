"""`orch run`'s options as one checked RunRequest, and what a new run stores to be judged by.
No Ray: the request and the plan stop before any cluster."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from orchestrator.commands.run import _plan
from orchestrator.errors import InputError
from orchestrator.run_request import RunRequest

ROOT = Path(__file__).resolve().parents[2]
KF = str(ROOT / "matrices" / "known-failures.yaml")

# options -> the error (None: accepted)
REQUESTS = {
    "a matrix": ({"matrix": "m.yaml"}, None),
    "--resume alone": ({"resume_run": "3"}, None),
    "neither matrix nor --resume": ({}, "give the MATRIX"),
    "--resume not an id": ({"resume_run": "x"}, "--resume must be a run id"),
    "--timeout 0": ({"matrix": "m.yaml", "timeout_s": 0}, "--timeout must be > 0"),
    "--max-gpus 0": ({"matrix": "m.yaml", "max_gpus": 0}, "--max-gpus must be >= 1"),
    "--precompile-jobs -1": ({"matrix": "m.yaml", "precompile_jobs": -1}, "--precompile-jobs must be >= 0"),
    "--flaky-window 0": ({"matrix": "m.yaml", "flaky_window": 0}, "--flaky-window must be >= 1"),
    "--workers-per-gpu bad": ({"matrix": "m.yaml", "workers_per_gpu": "many"}, "--workers-per-gpu"),
    "both --known-failures and --no-known-failures": (
        {"matrix": "m.yaml", "known_failures": "k.yaml", "no_known_failures": True},
        "contradict",
    ),
}


@pytest.mark.parametrize("scenario", REQUESTS)
def test_a_request_is_checked_once_at_the_edge(scenario):
    options, error = REQUESTS[scenario]
    if error is None:
        RunRequest.from_cli(options)
    else:
        with pytest.raises(InputError, match=error):
            RunRequest.from_cli(options)


def test_a_request_carries_every_option_it_was_given():
    req = RunRequest.from_cli(
        {
            "matrix": "m.yaml",
            "backend": "b",
            "workers_per_gpu": "2",
            "gpu_memory": "24",
            "baseline": "main",
            "require": ("tp=1",),
            "flaky_threshold": 0.3,
            "label": "pr-1",
        }
    )
    assert (req.matrix, req.backend, req.label, req.memory.workers_per_gpu, req.memory.gpu_memory) == (
        "m.yaml",
        "b",
        "pr-1",
        2,
        24 * 1024**3,
    )
    assert (req.judging.baseline, req.judging.require, req.judging.flaky_threshold) == ("main", ("tp=1",), 0.3)
    with pytest.raises(TypeError, match="unknown run options: colour"):
        RunRequest.from_cli({"matrix": "m.yaml", "colour": "red"})


def test_no_command_function_takes_more_than_eight_parameters():
    """Options travel as one value (RunRequest, Judging), not as parameter lists through every layer."""
    wide = []
    for path in sorted((ROOT / "orchestrator" / "commands").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                if n > 8:
                    wide.append(f"{path.name}:{node.lineno} {node.name} ({n})")
    assert not wide, wide


# options -> the known-failures file a new run of smoke.yaml (which extends full.yaml) stores
KNOWN = {
    "the matrix's, inherited through extends": ({}, KF),
    "--known-failures overrides it": ({"known_failures": "TMP"}, "TMP"),  # TMP: a file in tmp_path
    "--no-known-failures ignores it": ({"no_known_failures": True}, ""),
}


@pytest.mark.parametrize("scenario", KNOWN)
def test_a_run_stores_the_known_failures_that_applied(scenario, tmp_path, monkeypatch):
    options, expected = KNOWN[scenario]
    monkeypatch.chdir(ROOT)
    if expected == "TMP":
        (tmp_path / "kf.yaml").write_text("[]\n")
        options, expected = {"known_failures": str(tmp_path / "kf.yaml")}, str(tmp_path / "kf.yaml")
    req = RunRequest.from_cli(
        {
            "matrix": "matrices/smoke.yaml",
            "devices": "cpu",
            "out_dir": str(tmp_path / "o"),
            "filter_expr": "attention=gqa tp=1",
            **options,
        }
    )
    _, _, stored, _ = _plan(req, "matrices/smoke.yaml")
    assert stored.known_failures == expected and (not expected or os.path.isabs(expected))


def test_workers_per_gpu_is_auto_unless_asked():
    """auto is the default on GPUs (faster than one worker on the H100 with the same verdicts,
    docs/BENCHMARKS.md); it resolves to 1 without a GPU or without recorded needs (packing.py)."""
    from click.testing import CliRunner

    from orchestrator.cli import cli

    assert RunRequest.from_cli({"matrix": "m.yaml"}).memory.workers_per_gpu == "auto"
    assert RunRequest.from_cli({"matrix": "m.yaml", "workers_per_gpu": "1"}).memory.workers_per_gpu == 1
    assert "[default: auto]" in CliRunner().invoke(cli, ["run", "--help"]).output.replace("\n", " ")
