"""`orch doctor`: the pure decisions (scenario tables) and the command itself through the real CLI,
the real registry and real matrix files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backend.attention.registry import availability
from backend.graphs.cuda import graph_kind
from orchestrator.commands import doctor as D

ROOT = Path(__file__).resolve().parents[2]
FULL = ROOT / "matrices" / "full.yaml"


@pytest.mark.parametrize(
    "arch,expected",
    [
        ("gfx942", "float8_e4m3fnuz"),  # MI300X / MI325X
        ("gfx942:sramecc+:xnack-", "float8_e4m3fnuz"),  # gcnArchName as ROCm reports it
        ("gfx950", "float8_e4m3fn"),  # MI350X / MI355X: OCP fp8
        ("sm_90", "float8_e4m3fn"),
        (None, "float8_e4m3fn"),  # CPU
    ],
)
def test_fp8_dtype_from_arch(arch, expected):
    assert D.fp8_dtype_for_arch(arch) == expected
    assert torch.finfo(getattr(torch, expected)).max == (240.0 if "fnuz" in expected else 448.0)


@pytest.mark.parametrize(
    "hip,gpu,expected",
    [
        ("6.4.43482", True, "hip"),  # ROCm build: torch.cuda.CUDAGraph is a hipGraph
        (None, True, "cuda"),
        (None, False, "emulated"),
        ("6.4.43482", False, "emulated"),  # ROCm build, no GPU visible
    ],
)
def test_graph_kind_from_torch_version(hip, gpu, expected):
    assert graph_kind(hip, gpu) == expected


@pytest.mark.parametrize(
    "hip,cuda,gpu,expected",
    [
        ("6.4", None, True, "ROCm"),
        (None, "13.0", True, "CUDA"),
        (None, "13.0", False, "CPU"),
        (None, None, False, "CPU"),
    ],
)
def test_platform_name(hip, cuda, gpu, expected):
    assert D.platform_name(hip, cuda, gpu) == expected


# scenario -> (env, platform, substrings expected in the findings, in order; [] = none)
DEVICE_SCENARIOS = {
    "rocm-clean": ({"HIP_VISIBLE_DEVICES": "0,1"}, "ROCm", []),
    "rocm-rocr-only": ({"ROCR_VISIBLE_DEVICES": "0"}, "ROCm", ["error: ROCR_VISIBLE_DEVICES is set without"]),
    "rocm-rocr-and-hip": (
        {"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "1"},
        "ROCm",
        ["warning: ROCR_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES both set"],
    ),
    "rocm-cuda-var-left": ({"CUDA_VISIBLE_DEVICES": "0"}, "ROCm", ["CUDA_VISIBLE_DEVICES is set on ROCm"]),
    "rocm-noset": ({"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}, "ROCm", ["every worker sees every GPU"]),
    "cuda-clean": ({"CUDA_VISIBLE_DEVICES": "0"}, "CUDA", []),
    "cuda-hip-var": ({"HIP_VISIBLE_DEVICES": "0"}, "CUDA", ["note: HIP_VISIBLE_DEVICES is set but ignored"]),
    "cpu": ({"ROCR_VISIBLE_DEVICES": "0"}, "CPU", []),
}


@pytest.mark.parametrize("scenario", sorted(DEVICE_SCENARIOS))
def test_visible_device_findings(scenario):
    env, platform, expected = DEVICE_SCENARIOS[scenario]
    found = D.visible_device_findings(env, platform)
    assert len(found) == len(expected), found
    for line, want in zip(found, expected):
        assert want in line


def test_ray_sets_the_platforms_variable():
    assert D.ray_visible_var("ROCm") == "HIP_VISIBLE_DEVICES"
    assert D.ray_visible_var("CUDA") == "CUDA_VISIBLE_DEVICES"
    assert D.ray_visible_var("CPU") is None


@pytest.mark.parametrize(
    "env,token_file,expected",
    [
        ({}, False, "token (default for a new local cluster; RAY_AUTH_MODE unset; no token yet)"),
        ({}, True, "~/.ray/auth_token present"),
        ({"RAY_AUTH_MODE": "disabled"}, False, "disabled (RAY_AUTH_MODE=disabled"),
        ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "secret-value"}, False, "RAY_AUTH_TOKEN set"),
    ],
)
def test_ray_auth_state_names_no_secret(env, token_file, expected, tmp_path):
    if token_file:
        (tmp_path / ".ray").mkdir()
        (tmp_path / ".ray" / "auth_token").write_text("x")
    state = D.ray_auth_state(env, tmp_path)
    assert expected in state and "secret-value" not in state


def test_family_lines_split_each_familys_providers_by_its_own_check():
    providers = {"gqa": ("torch", "aiter"), "mla_sparse": ("torch", "vllm:FLASHMLA_SPARSE"), "empty": ()}
    own = {("aiter", "gqa"): "needs a ROCm GPU", ("vllm:FLASHMLA_SPARSE", "mla_sparse"): "needs vllm"}

    def avail(name, fam):
        return (name, fam) not in own, own.get((name, fam), "")

    lines = D.family_lines(["gqa", "mla_sparse", "empty"], providers.__getitem__, avail)
    assert lines == (
        D.FamilyLine("gqa", ("torch",), (D.ProviderLine("aiter", False, "needs a ROCm GPU"),)),
        D.FamilyLine("mla_sparse", ("torch",), (D.ProviderLine("vllm:FLASHMLA_SPARSE", False, "needs vllm"),)),
        D.FamilyLine("empty", (), ()),
    )


def test_every_family_has_its_providers_listed():
    from backend.attention.registry import family_providers
    from backend.families.contract.registry import FAMILY_NAMES

    assert family_providers("mla_sparse") == ("torch", "vllm:FLASHMLA_SPARSE", "vllm:ROCM_AITER_MLA_SPARSE")
    assert "vllm:GDN_ATTN" in family_providers("hybrid_gdn") and "vllm:GDN_ATTN" not in family_providers("gqa")
    assert "vllm:FLEX_ATTENTION" in family_providers("gqa")
    for fam in FAMILY_NAMES:
        assert family_providers(fam), fam


def test_availability_reports_a_crashing_check_and_a_bad_name():
    assert availability("torch", "cpu").available
    aiter = availability("aiter", "cpu")
    assert not aiter.available and aiter.reason.startswith("unavailable:")
    bad = availability("no_such_pkg.mod:Cls", "cpu")
    assert not bad.available and "no_such_pkg" in bad.reason


def _orch(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def _matrix(tmp_path, backends, name="m.yaml"):
    path = tmp_path / name
    path.write_text(
        f"extends: {FULL}\nname: doctor\naxes:\n  attention: [gqa]\n  tp: [1]\n  cudagraph_mode: [FULL]\n"
        f"  kv_cache_dtype: [auto]\n  batch: [decode_7]\n  backend: [{', '.join(backends)}]\ninclude: []\n"
    )
    return str(path)


def test_doctor_json_on_this_machine():
    proc = _orch("doctor", "--json", env={"ROCR_VISIBLE_DEVICES": "0"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    # Spelled out here, not through the functions the command itself calls (tested above).
    hip, gpu = torch.version.hip is not None, torch.cuda.is_available()
    assert report["graph_kind"] == (("hip" if hip else "cuda") if gpu else "emulated")
    assert report["platform"] == (("ROCm" if hip else "CUDA") if gpu else "CPU")
    providers = {p["provider"]: p for p in report["providers"]}
    assert set(providers) == {
        "torch",
        "aiter",
        "aiter-emulated",
        "aiter-triton",
        "aiter-triton-pa",
        "vllm:FLEX_ATTENTION",
        "vllm:TRITON_ATTN",
        "vllm:FLASH_ATTN",
        "vllm:ROCM_AITER_FA",
        "vllm:TRITON_MLA",
        "vllm:ROCM_AITER_UNIFIED_ATTN",
        "vllm:GDN_ATTN",
        "vllm:FLASHMLA_SPARSE",
        "vllm:ROCM_AITER_MLA_SPARSE",
    }
    # vLLM's backends: available, or a one-line reason (vllm missing, version, platform).
    for name in ("vllm:TRITON_ATTN", "vllm:ROCM_AITER_FA"):
        assert not providers[name]["available"] and providers[name]["reason"]
    assert providers["torch"]["available"] and providers["aiter-emulated"]["available"]
    if torch.version.hip is None:
        assert not providers["aiter"]["available"] and "ROCm" in providers["aiter"]["reason"]
    assert report["visible_devices"]["ROCR_VISIBLE_DEVICES"] == "0"
    # Every family orch ships has its line; the sparse family's torch provider runs anywhere.
    families = {f["family"]: f for f in report["families"]}
    assert set(families) == {"gqa", "mla", "swa_sinks", "hybrid_gdn", "mla_sparse"}
    assert "torch" in families["mla_sparse"]["runs_here"]
    sparse_not_here = {p["provider"]: p["reason"] for p in families["mla_sparse"]["not_here"]}
    assert "aiter.get_mla_metadata_v1" in sparse_not_here["vllm:ROCM_AITER_MLA_SPARSE"]
    assert {p["provider"] for p in families["mla"]["not_here"]} >= {"aiter-triton"} or torch.cuda.is_available()
    assert report["gang_defaults"]["NCCL_NVLS_ENABLE"] == "0"


@pytest.fixture(scope="module")
def plain_doctor():
    """One `orch doctor` for the tests that read its screen (each run imports vLLM's backends: ~8 s)."""
    return _orch("doctor")


def test_doctor_screen_fits_one_screen(plain_doctor):
    proc = plain_doctor
    assert proc.returncode == 0, proc.stderr
    for heading in ("platform", "providers", "families", "graph kind", "fp8 dtype", "ray", "triton", "amd-aiter"):
        assert heading in proc.stdout
    assert re.search(r"^mla_sparse +torch", proc.stdout, re.MULTILINE), proc.stdout
    assert len(proc.stdout.splitlines()) < 60


@pytest.mark.skipif(torch.version.hip is not None, reason="the aiter provider can run on ROCm")
def test_doctor_matrix_with_a_provider_skipped_here_exits_0_and_names_it(tmp_path):
    # `orch run` skips aiter's cases here and runs torch's: doctor says the same and exits 0
    # (it exited 1 on the box where the run passed). tests/executor/test_newcomer.py runs both.
    from orchestrator.matrix import load_matrix

    path = _matrix(tmp_path, ["torch", "aiter"])
    proc = _orch("doctor", "--matrix", path, "--json")
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout)["matrix"]
    planned = load_matrix(path, devices="cpu")  # the expansion `orch run` runs
    assert {c.backend for c in planned.cases} == {"torch"} and {s.case.backend for s in planned.skipped} == {"aiter"}
    assert [(p["provider"], p["runs"]) for p in m["usable"]] == [("torch", len(planned.cases))]
    assert [(p["provider"], p["skipped"]) for p in m["unusable"]] == [("aiter", len(planned.skipped))]
    reason = availability("aiter", "cpu").reason
    assert "ROCm" in reason and m["unusable"][0]["reason"] == reason  # the provider's own words
    assert (m["runnable"], m["skipped"], m["problems"], m["exit_code"]) == (
        len(planned.cases),
        len(planned.skipped),
        [],
        0,
    )
    assert proc.stderr == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_doctor_matrix_for_gpu_on_a_cpu_box_exits_3_as_orch_run_would(tmp_path):
    proc = _orch("doctor", "--matrix", _matrix(tmp_path, ["torch"]), "--devices", "gpu")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert proc.stderr.strip().splitlines() == [
        f"orch doctor: {tmp_path / 'm.yaml'}: --devices gpu but there is no GPU here: `orch run` exits 3"
    ]


def test_doctor_matrix_of_runnable_providers_exits_0(tmp_path):
    proc = _orch("doctor", "--matrix", _matrix(tmp_path, ["torch", "aiter-emulated"]))
    assert proc.returncode == 0, proc.stderr
    assert "`orch run` can run this matrix here" in proc.stdout
    assert re.search(r"^torch +runs \d+ case\(s\) here$", proc.stdout, re.M), proc.stdout


def test_doctor_output_is_not_padded_when_redirected(plain_doctor):
    # rich filled every line to 100 columns when stdout was a file or a pipe.
    proc = plain_doctor
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) > 10 and not [line for line in lines if line != line.rstrip()]
    assert "\x1b[" not in proc.stdout


@pytest.mark.parametrize(
    "scenario,content",
    [
        ("missing-file", None),
        ("not-yaml", "axes: [unclosed\n"),
        ("unknown-provider", "BACKENDS"),
    ],
)
def test_doctor_bad_matrix_is_one_line_exit_2(scenario, content, tmp_path):
    if content is None:
        path = str(tmp_path / "absent.yaml")
    elif content == "BACKENDS":
        path = _matrix(tmp_path, ["no_such_pkg.mod:Cls"])
    else:
        path = str(tmp_path / "bad.yaml")
        Path(path).write_text(content)
    proc = _orch("doctor", "--matrix", path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert os.path.basename(path) in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU box the load is expected to succeed")
def test_doctor_shows_a_failed_triton_load_as_one_line():
    # A subprocess: the load registers namespace stubs in sys.modules before it fails.
    code = "from orchestrator.commands.doctor import _aiter_findings\nprint('\\n'.join(_aiter_findings(True)[1]))"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    failed = [line for line in lines if line.startswith("triton kernels:")]
    assert len(failed) == 1 and failed[0].startswith("triton kernels: FAILED: loading aiter's Triton kernels failed")
