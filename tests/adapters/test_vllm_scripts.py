"""The two scripts the lead runs for vLLM's backends on the GPU machine, tested on CPU:
benchmarks/build_vllm_wheel.py (the trimmed wheel's members and RECORD, the carry limit) and
benchmarks/gpu_vllm.py (vllm:FLEX_ATTENTION and its broken twin in-process; TRITON_ATTN skips
with the reason; the budget; bad input is one line + exit 2)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import zipfile
from pathlib import Path

import pytest

from tests.adapters.test_vllm_adapter import needs_vllm

_ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, _ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- build_vllm_wheel ----------------------------------------------------------------------------
def test_trim_drops_compiled_members_and_writes_a_csv_record(tmp_path):
    """A name with commas (vLLM ships MoE configs named 'N=8192,K=1536,...json') is one quoted RECORD
    field; ELF files and C/CUDA sources go, whatever their name; pip's RECORD check passes."""
    build = _load("build_vllm_wheel")
    src, dst = tmp_path / "v-1-py3-none-any.whl", tmp_path / "out.whl"
    members = {
        "v/__init__.py": b"x = 1\n",
        "v/configs/N=8,K=16,dtype=fp8.json": b"{}",
        "v/_C.abi3.so": b"\x7fELF....",
        "v/kernel.cu": b"__global__",
        "v/bin/tool": b"\x7fELF-no-suffix",
        "v-1.dist-info/METADATA": b"Name: v\n",
        "v-1.dist-info/RECORD": b"stale",
    }
    with zipfile.ZipFile(src, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    kept, dropped = build.trim(str(src), str(dst))
    assert (kept, dropped) == (3, 3)
    with zipfile.ZipFile(dst) as z:
        names = set(z.namelist())
        rows = list(csv.reader(z.read("v-1.dist-info/RECORD").decode().splitlines()))
    assert names == {
        "v/__init__.py",
        "v/configs/N=8,K=16,dtype=fp8.json",
        "v-1.dist-info/METADATA",
        "v-1.dist-info/RECORD",
    }
    assert all(len(r) == 3 for r in rows) and {r[0] for r in rows} == names
    assert next(r for r in rows if r[0] == "v/__init__.py")[2] == "6"


def test_build_bad_input_and_over_the_carry_limit(tmp_path, capsys, monkeypatch):
    build = _load("build_vllm_wheel")
    assert build.main(["--wheel", str(tmp_path / "nope.whl"), "--out", str(tmp_path / "o")]) == 2
    # A folder already over the limit (stale wheels): exit 4, one line, nothing downloaded.
    out = tmp_path / "full"
    out.mkdir()
    wheel = tmp_path / "v-1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("v/__init__.py", "")
        z.writestr("v-1.dist-info/RECORD", "")
    (out / "stale.whl").write_bytes(b"\0" * 1024)
    monkeypatch.setattr(build, "CARRY_LIMIT_MIB", 0.0005)
    assert build.main(["--wheel", str(wheel), "--out", str(out), "--no-extras", "--no-orch-deps"]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("build_vllm_wheel: ") for line in err), err
    assert "carry limit" in err[-1] and "working tree" in err[-1], err


def test_the_device_folder_holds_orchs_own_deps_and_not_ray():
    build = _load("build_vllm_wheel")
    names = {p.split("==")[0].replace("-", "_").lower() for p in build.EXTRAS + build.ORCH_DEPS}
    assert {"pydantic", "pydantic_core", "jsonschema", "rpds_py", "junitparser", "psutil", "requests"} <= names
    assert "ray" not in names and "torch" not in names and "triton" not in names
    assert all("==" in p for p in build.EXTRAS + build.ORCH_DEPS)  # exact pins: the GPU run is reproducible


@pytest.mark.parametrize(
    "version,has,lacks",
    [
        ("0.34.0", {"transformers==5.22.2", "xgrammar==0.2.9"}, {"oss-harmony==0.0.11"}),
        ("0.34.1", {"transformers==5.22.2"}, {"fastapi==0.136.3"}),
        # 0.33's own pins (transformers <5.21, llguidance <1.8, xgrammar 0.2.8) and the server modules its config imports
        (
            "0.33.0",
            {
                "transformers==5.20.2",
                "llguidance==1.7.6",
                "xgrammar==0.2.8",
                "oss-harmony==0.0.11",
                "fastapi==0.136.3",
                "openai==3.60.0",
            },
            {"transformers==5.22.2", "xgrammar==0.2.9"},
        ),
        # The seed's releases: transformers 4.x (>=4.55.2) and what their old config imports
        (
            "0.10.2",
            {
                "transformers==4.57.6",
                "tokenizers==0.22.2",
                "huggingface_hub==0.36.2",
                "pybase64==1.5.1",
                "blake3==1.0.11",
            },
            {"transformers==5.22.2", "xgrammar==0.2.9", "aiohttp==3.14.5"},
        ),
        (
            "0.11.0",
            {"transformers==4.57.6", "aiohttp==3.14.5", "msgspec==0.23.0"},
            {"pybase64==1.5.1", "llguidance==1.9.1"},
        ),
    ],
)
def test_extras_follow_the_vllm_version(version, has, lacks):
    build = _load("build_vllm_wheel")
    extras = set(build.extras_for(version))
    assert has <= extras and not lacks & extras
    assert len({p.split("==")[0] for p in extras}) == len(extras)  # one pin per package


def test_a_version_without_an_extras_list_is_bad_input(tmp_path, capsys):
    build = _load("build_vllm_wheel")
    assert build.main(["--version", "0.32.0", "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "build_vllm_wheel: --version 0.32.0: no extras list for it (known: 0.10.x, 0.11.x, 0.33.x, "
        "0.34.x; or --no-extras)"
    ]
    assert not (tmp_path / "w").exists()  # refused before any download


def test_install_site_puts_a_release_and_its_pinned_extras_in_their_own_target_dir(tmp_path):
    """--site / gpu_seed --install: from a folder holding several releases' wheels, pip takes the
    release asked for and its extras by their pins, --no-deps, into the target dir alone."""
    build = _load("build_vllm_wheel")
    folder = tmp_path / "wheels"
    folder.mkdir()
    for name, version in (("vllm", "0.10.2"), ("vllm", "0.11.0"), ("fakeextra", "1.0"), ("fakeextra", "2.0")):
        with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
            z.writestr(f"{name}/__init__.py", f"VERSION = {version!r}\n")
            z.writestr(
                f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            )
            z.writestr(
                f"{name}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
            )
            z.writestr(f"{name}-{version}.dist-info/RECORD", "")
    build.EXTRAS_010 = ("fakeextra==2.0",)
    build.install_site(str(folder), "0.10.2", str(tmp_path / "site"))
    assert (tmp_path / "site" / "vllm" / "__init__.py").read_text() == "VERSION = '0.10.2'\n"
    assert (tmp_path / "site" / "fakeextra" / "__init__.py").read_text() == "VERSION = '2.0'\n"
    assert build.site_dir("0.10.2").endswith(f"{os.sep}.vllm-0.10.2") and Path(build.site_dir("0.10.2")).parent == _ROOT
    with pytest.raises(RuntimeError, match="pip install into"):
        build.install_site(str(folder), "0.10.3", str(tmp_path / "site2"))


# ---- gpu_vllm ------------------------------------------------------------------------------------
def test_gpu_vllm_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    gv = _load("gpu_vllm")
    assert gv.main(["--matrix", str(tmp_path / "missing.yaml"), "--out-dir", str(tmp_path)]) == 2
    assert gv.main(["--filter", "nonsense=1", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("gpu_vllm: ") for line in err), err


@needs_vllm
def test_gpu_vllm_triton_on_cpu_skips_with_the_reason(tmp_path):
    gv = _load("gpu_vllm")
    assert gv.main(["--devices", "cpu", "--filter", "tp=1 batch=decode_7", "--out-dir", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gpu_vllm.json").read_text())
    assert doc["rows"] == [] and doc["verdict"] == "no runnable cases"
    assert doc["skipped"] and all("needs a GPU" in s["reason"] for s in doc["skipped"])
    assert "needs a GPU" in doc["mutant"]["verdict"]


@needs_vllm
def test_gpu_vllm_flex_green_and_its_mutant_red_where_expected(tmp_path):
    gv = _load("gpu_vllm")
    rc = gv.main(
        [
            "--backend",
            "vllm:FLEX_ATTENTION",
            "--devices",
            "cpu",
            "--out-dir",
            str(tmp_path),
            "--filter",
            "mode=FULL_DECODE_ONLY batch=decode_7,mixed_small",
        ]
    )
    doc = json.loads((tmp_path / "gpu_vllm.json").read_text())
    assert rc == 0, doc["rows"]
    assert {(r["batch"], r["k"], r["kv"], r["status"]) for r in doc["rows"]} == {
        (b, k, "auto", "pass") for b in ("decode_7", "mixed_small") for k in (0, 2)
    }
    assert {s["reason"] for s in doc["skipped"]} == {"FLEX_ATTENTION does not support kv_cache_dtype fp8"}
    assert doc["mutant"]["verdict"] == "red exactly where expected"
    assert {(r["batch"], r["status"]) for r in doc["mutant_rows"]} == {("decode_7", "pass"), ("mixed_small", "fail")}
    assert "reshape_and_cache_flash" in doc["emulated"] and doc["versions"]["vllm"]
    md = (tmp_path / "gpu_vllm.md").read_text()
    assert "**gate PASSED**" in md and "| tp1-FULL_DECODE_ONLY-auto-k2-decode_7-FLEX_ATTENTION-s0 |" in md
    assert "red exactly where expected" in md


@needs_vllm
def test_gpu_vllm_red_when_the_mutant_is_not(tmp_path):
    """The mutant check can fail: the real backend named as the 'mutant' is green on the mixed
    batch, which is not where the script expects it; and the budget leaves cases not run."""
    gv = _load("gpu_vllm")
    rc = gv.main(
        [
            "--backend",
            "vllm:FLEX_ATTENTION",
            "--devices",
            "cpu",
            "--out-dir",
            str(tmp_path),
            "--filter",
            "mode=FULL batch=mixed_small k=0",
            "--mutant",
            "vllm:FLEX_ATTENTION",
        ]
    )
    doc = json.loads((tmp_path / "gpu_vllm.json").read_text())
    assert rc == 1 and doc["mutant"]["verdict"] == "NOT as expected"
    rc = gv.main(
        [
            "--backend",
            "vllm:FLEX_ATTENTION",
            "--devices",
            "cpu",
            "--out-dir",
            str(tmp_path),
            "--filter",
            "mode=FULL batch=mixed_small k=0",
            "--mutant",
            "",
            "--budget-s",
            "0",
        ]
    )
    doc = json.loads((tmp_path / "gpu_vllm.json").read_text())
    assert rc == 1 and doc["not_run"] == ["tp1-FULL-auto-mixed_small-FLEX_ATTENTION-s0"] and doc["rows"] == []
