"""benchmarks/gpu_provider_check.py runs on CPU: torch checked, GPU-only providers skipped with a reason."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_provider_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_provider_check", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_run_checks_torch_and_skips_gpu_providers(tmp_path, monkeypatch):
    module = _load()
    monkeypatch.setattr(module, "SPECS", {k: module.SPECS[k] for k in ("mixed", "fp8-mixed")})
    out = tmp_path / "check.json"
    assert module.main(["--device", "cpu", "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    for spec, r in results["torch"].items():
        assert r["status"] == "ok" and r["max_abs_err"] < (0.12 if "fp8" in spec else 2e-2), (spec, r)
    if not torch.cuda.is_available():
        for provider in ("aiter-triton", "aiter-triton-pa"):
            assert {r["status"] for r in results[provider].values()} == {"skip"}
            assert all("needs a CUDA/ROCm GPU" in r["reason"] for r in results[provider].values())
