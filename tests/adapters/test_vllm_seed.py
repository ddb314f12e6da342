"""The seed on its own code: vLLM 0.10.2's ROCM_AITER_FA red, 0.11.0's green, through the
adapter's old interface (backend/adapters/vllm/old.py) and ROCM_AITER_FA's ROCm-only ops over orch's
AITER emulation (rocm_ops.py).

The first group needs no vllm: the release ranges, bad input on the command line, the emulated
Triton gather. The `seed` group runs the released code, each release in a process of its own
(ORCH_VLLM=RELEASE: a process imports one vllm); it needs the releases' target dirs
(`python benchmarks/build_vllm_wheel.py --seed --site`, which .ci/run does) and is skipped with
that reason without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backend.adapters.vllm import release, rocm_ops

ROOT = Path(__file__).resolve().parents[2]
RELEASES = ("0.10.2", "0.11.0")
_MISSING = [r for r in RELEASES if not (release.site_dir(r) / "vllm" / "__init__.py").is_file()]
_seed = pytest.mark.skipif(
    bool(_MISSING),
    reason=f"no .vllm-{_MISSING[0] if _MISSING else ''}/ here: the seed's "
    "releases are not installed (python benchmarks/build_vllm_wheel.py --seed --site)",
)


def needs_seed(test):
    return pytest.mark.seed(_seed(test))


@pytest.mark.parametrize(
    "installed,interface,why",
    [
        ("0.10.2", "old", None),
        ("0.11.0", "old", None),
        ("0.11.2", "old", None),
        ("0.10.1.1", None, "outside the supported ranges >=0.10.2,<0.12.0 or >=0.33.0,<0.35.0"),
        ("0.12.0", None, "outside the supported ranges"),
        ("0.20.0", None, "vllm 0.20.0 is outside the supported ranges"),
        ("0.33.0", "current", None),
        ("0.34.0+cu130", "current", None),
        (None, None, "unavailable: vllm is not installed"),
        ("not-a-version", None, "is not a version number"),
    ],
)
def test_each_release_has_its_interface(installed, interface, why):
    name, reason = release.interface_for(installed)
    assert name == interface
    assert (reason is None) if why is None else (why in reason and "\n" not in reason)


@pytest.fixture
def fresh_release(monkeypatch):
    """ORCH_VLLM and the version as a test sets them, read afresh (both are cached per process)."""
    release.site_error.cache_clear()
    yield monkeypatch
    release.site_error.cache_clear()


def _plan(capsys, *args) -> tuple[int, list[str]]:
    from orchestrator.cli import main

    code = main(["plan", "matrices/seed.yaml", "--devices", "cpu", *args])
    return code, capsys.readouterr().err.strip().splitlines()


def test_backend_on_the_command_line_with_a_release_outside_both_ranges_is_bad_input(fresh_release, capsys):
    fresh_release.delenv("ORCH_VLLM", raising=False)
    fresh_release.setattr(release, "installed_version", lambda: "0.20.0")
    code, err = _plan(capsys, "--backend", "vllm:ROCM_AITER_FA")
    assert code == 2
    assert err == [
        "orch: --backend: vllm 0.20.0 is installed; vllm: backends need a release >=0.10.2,<0.12.0 or >=0.33.0,<0.35.0"
    ]


def test_an_orch_vllm_without_its_target_dir_is_bad_input(fresh_release, capsys, tmp_path):
    fresh_release.setenv("ORCH_VLLM", str(tmp_path / "none"))
    code, err = _plan(capsys, "--backend", "vllm:ROCM_AITER_FA")
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"orch: --backend: ORCH_VLLM={tmp_path / 'none'}: ") and "holds no vllm" in err[0]
    fresh_release.setenv("ORCH_VLLM", "0.9.9")  # a release number: its .vllm-0.9.9/, with the command that builds it
    release.site_error.cache_clear()
    code, err = _plan(capsys, "--backend", "vllm:ROCM_AITER_FA")
    assert code == 2 and "build_vllm_wheel.py --version 0.9.9 --site" in err[0]


def test_a_matrix_naming_the_backend_without_vllm_skips_with_the_reason(fresh_release):
    """Not installed is a skip (as for matrices/vllm.yaml), not bad input: the matrix still plans."""
    from backend.adapters import vllm as adapter
    from orchestrator.matrix import load_matrix

    fresh_release.delenv("ORCH_VLLM", raising=False)
    fresh_release.setattr(adapter, "installed_version", lambda: None)
    fresh_release.setattr(release, "installed_version", lambda: None)
    adapter.load_vllm_backend.cache_clear()
    adapter._make_backend.cache_clear()
    try:
        matrix = load_matrix("matrices/seed.yaml", devices="cpu", backend_override="vllm:ROCM_AITER_FA")
        assert not matrix.cases and len(matrix.skipped) == 50
        assert {s.reason for s in matrix.skipped} == {release.NOT_INSTALLED}
    finally:
        adapter.load_vllm_backend.cache_clear()
        adapter._make_backend.cache_clear()


def test_a_repro_line_names_the_release_it_ran(monkeypatch):
    from backend.case import BatchSpec, Case, ModelShape

    def case(backend):
        return Case(
            backend,
            1,
            "FULL",
            "auto",
            BatchSpec("d", (1,), (9,)),
            matrix="matrices/seed.yaml",
            model=ModelShape(
                num_heads=8, num_kv_heads=2, head_size=64, num_layers=1, max_model_len=64, max_num_seqs=4, num_blocks=32
            ),
            capture_sizes=(1, 2, 4),
        )

    monkeypatch.setenv("ORCH_VLLM", "0.10.2")
    assert (
        case("vllm:ROCM_AITER_FA")
        .repro_command()
        .startswith(
            "ORCH_VLLM=0.10.2 orch repro tp1-FULL-auto-d-ROCM_AITER_FA-s0 --matrix matrices/seed.yaml --backend vllm:ROCM_AITER_FA"
        )
    )
    assert case("torch").repro_command().startswith("orch repro ")  # a builtin imports no vllm
    monkeypatch.delenv("ORCH_VLLM")
    assert case("vllm:ROCM_AITER_FA").repro_command().startswith("orch repro ")


# ---- the emulated Triton gather (vllm_layout_trans): no vllm needed -----------------------------
def _paged(seq_lens, block_size=16, hkv=2, d=8, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    nblocks = sum(-(-s // block_size) for s in seq_lens) + 1
    k = torch.randn(nblocks, block_size, hkv, d, generator=g).to(dtype)
    v = torch.randn(nblocks, block_size, hkv, d, generator=g).to(dtype)
    width = max(-(-s // block_size) for s in seq_lens)
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    perm = (torch.randperm(nblocks - 1, generator=g) + 1).tolist()  # shuffled blocks, block 0 the null block
    for r, s in enumerate(seq_lens):
        for b in range(-(-s // block_size)):
            table[r, b] = perm.pop()
    return k, v, table


def _cu(xs) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(xs).cumsum(0).tolist()], dtype=torch.int32)


def test_layout_trans_gathers_prefill_requests_only_within_the_grid(monkeypatch):
    """The Triton kernel's semantics: requests of query len <= 1 store nothing; a prefill request's
    positions < seq_len land at its cu_seqlens_k offset; the host max_seq_len bounds the grid
    (a graph freezes it); rows nobody stores keep what torch.empty held (here: 7)."""
    real_empty = torch.empty
    monkeypatch.setattr(rocm_ops.torch, "empty", lambda *a, **kw: real_empty(*a, **kw).fill_(7.0))
    qlens, seqs = [1, 5, 3], [20, 37, 9]
    k_cache, v_cache, table = _paged(seqs)
    one = torch.ones(1)
    flat_k, flat_v = k_cache.flatten(0, 1), v_cache.flatten(0, 1)

    def gathered(r, n):
        return [int(table[r, p // 16]) * 16 + p % 16 for p in range(n)]

    k, v = rocm_ops.vllm_layout_trans(
        _cu(qlens), _cu(seqs), table, k_cache, v_cache, max(seqs), one, one, torch.bfloat16, sum(seqs)
    )
    assert k.shape == (sum(seqs), 2, 8) and k.dtype == torch.bfloat16
    assert (k[:20] == 7).all() and (v[:20] == 7).all()  # the decode request: nothing stored
    for r, start in ((1, 20), (2, 57)):
        s = seqs[r]
        assert torch.equal(k[start : start + s], flat_k[gathered(r, s)])
        assert torch.equal(v[start : start + s], flat_v[gathered(r, s)])
    # A grid frozen at max_seq_len 16 (a graph captured on shorter sequences) stops at 16 positions.
    k2, _ = rocm_ops.vllm_layout_trans(
        _cu(qlens), _cu(seqs), table, k_cache, v_cache, 16, one, one, torch.bfloat16, sum(seqs)
    )
    assert torch.equal(k2[20:36], flat_k[gathered(1, 16)]) and (k2[36:57] == 7).all()


def test_layout_trans_dequantises_fp8_with_the_scale():
    qlens, seqs = [4], [20]
    k_cache, v_cache, table = _paged(seqs, dtype=torch.float32)
    scale = torch.tensor([0.5])
    k8, v8 = (k_cache / scale).to(torch.float8_e4m3fnuz), (v_cache / scale).to(torch.float8_e4m3fnuz)
    k, v = rocm_ops.vllm_layout_trans(_cu(qlens), _cu(seqs), table, k8, v8, 20, scale, scale, torch.bfloat16, 20)
    slots = [int(table[0, p // 16]) * 16 + p % 16 for p in range(20)]
    torch.testing.assert_close(k, (k8.flatten(0, 1)[slots].float() * 0.5).to(torch.bfloat16))
    torch.testing.assert_close(v, (v8.flatten(0, 1)[slots].float() * 0.5).to(torch.bfloat16))


def test_varlen_impl_matches_the_reference_on_prefill_rows_and_skips_decode_rows():
    """flash_attn_varlen_func_impl (the module's op body, over the stand-ins): prefill rows are
    causal attention over each request's paged K/V; decode rows are left to paged_attention_v1."""
    from backend.harness.reference import reference_attention

    qlens, seqs = [1, 5, 3], [20, 37, 9]
    k_cache, v_cache, table = _paged(seqs, dtype=torch.float32)
    q = torch.randn(sum(qlens), 4, 8)
    out = torch.full_like(q, 7.0)
    one = torch.ones(1)
    rocm_ops.flash_attn_varlen_func_impl(
        q,
        k_cache,
        v_cache,
        out,
        _cu(qlens),
        _cu(seqs),
        max(qlens),
        max(seqs),
        0.3,
        [-1, -1],
        None,
        table,
        one,
        one,
        sum(seqs),
    )
    ks = [k_cache.flatten(0, 1)[[int(table[r, p // 16]) * 16 + p % 16 for p in range(s)]] for r, s in enumerate(seqs)]
    vs = [v_cache.flatten(0, 1)[[int(table[r, p // 16]) * 16 + p % 16 for p in range(s)]] for r, s in enumerate(seqs)]
    ref = reference_attention(q, ks, vs, qlens, 0.3)
    torch.testing.assert_close(out[1:], ref[1:], atol=1e-5, rtol=1e-5)
    assert (out[0] == 7.0).all()  # the decode row: paged_attention_v1's


# ---- the released code, one process per release -------------------------------------------------
def _env(release_name: str) -> dict[str, str]:
    return dict(
        os.environ, ORCH_VLLM=release_name, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )


def _probe(release_name: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "adapters" / "seed_probe.py")],
        env=_env(release_name),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_seed
@pytest.mark.parametrize(
    "release_name,support,fp8",
    [("0.10.2", "ALWAYS", "float8_e4m3fnuz"), ("0.11.0", "UNIFORM_SINGLE_TOKEN_DECODE", "float8_e4m3fn")],
)
def test_the_old_interface_reads_the_release(release_name, support, fp8):
    facts = _probe(release_name)
    assert facts["installed"] == release_name and facts["interface"] == "old"
    assert facts["unavailable_cpu"] is None  # runnable here: its kernels are emulated
    # The builder's own cudagraph_support; the current interface's name would have read NEVER.
    assert facts["support"] == support and facts["support_read_as_current"] == "NEVER"
    assert facts["support_missing"].endswith("metadata builder has no cudagraph_support attribute")
    assert facts["kernels"] == "emulated" and facts["is_rocm"] is False  # is_rocm() is not forced
    assert facts["ops"] == {"vllm.flash_attn_varlen_func": True, "aiter.paged_attention_v1": True}
    assert facts["emulated"][:2] == list(rocm_ops.EMULATED_NAMES)
    assert facts["kv_dtypes"] == ["auto", "fp8"] and facts["dtypes"] == ["float16", "bfloat16"]
    # vLLM's cache shape is orch's; an fp8 cache holds what the Impl reads it as.
    assert facts["vllm_shape"] == [2, 32, 16, 2, 64]
    assert facts["cache"] == {"auto": [[2, 32, 16, 2, 64], "bfloat16"], "fp8": [[2, 32, 16, 2, 64], fp8]}
    assert facts["head16"] == [f"head_size 16 not supported by vllm:ROCM_AITER_FA (vLLM {release_name}: 64, 128, 256)"]
    # V1 runner counts: a step padded to 8 tokens is handed its 4 real ones; the capture batch its own.
    assert facts["metadata"] == {
        "type": "AiterFlashAttentionMetadata",
        "num_actual_tokens": 4,
        "cu_seq_lens": [0, 5, 8],
        "max_query_len": 3,
    }
    assert facts["capture"] == {"num_actual_tokens": 8, "max_query_len": 8, "num_actual_kv_tokens": 8 * 128}
    # FLEX_ATTENTION under the old interface: its builder inherits NEVER from vLLM's base class (so
    # vLLM refuses FULL for it: a skip with vLLM's reason), its Impl refuses a quantized cache.
    assert facts["flex"] == {"support": "NEVER", "kv_dtypes": ["auto"], "unavailable_cpu": None}
    names = facts["names"]
    assert "needs a GPU" in names["TRITON_ATTN"] and names["TRITON_ATTN_VLLM_V1"] == names["TRITON_ATTN"]
    assert names["NOPE"] == f"unavailable: vLLM {release_name} has no attention backend 'NOPE'"
    assert "is an MLA backend" in names["TRITON_MLA"]


def _seed_run(tmp_path, release_name: str, *extra: str) -> tuple[int, dict, str]:
    out = tmp_path / release_name
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_seed.py"),
            "--releases",
            release_name,
            "--devices",
            "cpu",
            "--out-dir",
            str(out),
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = out / "gpu_seed.json"
    doc = json.loads(report.read_text()) if report.is_file() else {}
    return proc.returncode, doc, proc.stdout + proc.stderr


@needs_seed
def test_0_10_2_fails_full_on_the_prefill_rows_and_nothing_else(tmp_path):
    """The whole seed matrix under 0.10.2: a replay FAIL in exactly FULL x the batches with a
    prefill row (both kv dtypes), each naming prefill requests only; every other cell passes."""
    code, doc, out = _seed_run(tmp_path, "0.10.2")
    assert code == 0, out[-3000:]
    rows = doc["releases"]["0.10.2"]
    assert len(rows) == 50 and {r["vllm"] for r in rows} == {"0.10.2"} and {r["kernels"] for r in rows} == {"emulated"}
    red = {(r["mode"], r["kv"], r["batch"]) for r in rows if r["status"] == "fail"}
    assert red == {("FULL", kv, b) for kv in ("auto", "fp8") for b in ("mixed_small", "prefill_only", "mixed_chunked")}
    small = next(r for r in rows if r["case_id"] == "tp1-FULL-auto-mixed_small-ROCM_AITER_FA-s0")
    assert "bad rows 14/17 in requests 3 (q 5), 4 (q 9)" in small["reason"]  # the two prefill requests, all their rows
    assert "| FULL -> FULL | pass | pass | **FAIL** | **FAIL** | **FAIL** |" in out


@needs_seed
def test_0_11_0_passes_everything_with_full_resolved_to_full_and_piecewise(tmp_path):
    code, doc, out = _seed_run(tmp_path, "0.11.0")
    assert code == 0, out[-3000:]
    rows = doc["releases"]["0.11.0"]
    assert len(rows) == 50 and all(r["status"] == "pass" for r in rows), [
        r["reason"] for r in rows if r["status"] != "pass"
    ]
    assert {r["resolved"] for r in rows if r["mode"] == "FULL"} == {"FULL_AND_PIECEWISE"}
    assert all(r["downgraded"] for r in rows if r["mode"] == "FULL")


@needs_seed
def test_the_frozen_cu_seq_lens_is_the_bug(tmp_path):
    """Broken the other way: 0.10.2's code with only its prefill cu_seq_lens made persistent
    (tests/mutants/vllm_seed.py) is green in FULL, where the released code is red."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_vllm.py"),
            "--matrix",
            "matrices/seed.yaml",
            "--backend",
            "tests.mutants.vllm_seed:CuSeqLensPersistent",
            "--devices",
            "cpu",
            "--filter",
            "mode=FULL kv=auto batch=mixed_small,prefill_only",
            "--mutant",
            "",
            "--out-dir",
            str(tmp_path),
        ],
        env=_env("0.10.2"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    doc = json.loads((tmp_path / "gpu_vllm.json").read_text())
    assert [r["status"] for r in doc["rows"]] == ["pass", "pass"] and doc["versions"]["vllm"] == "0.10.2"


def test_gpu_seed_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_seed", ROOT / "benchmarks" / "gpu_seed.py")
    gpu_seed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_seed)
    assert gpu_seed.main(["--releases", "0.34.0", "--out-dir", str(tmp_path)]) == 2
    assert gpu_seed.main(["--install", str(tmp_path / "nope"), "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "gpu_seed: --releases 0.34.0: the seed's releases are 0.10.2 and 0.11.0",
        f"gpu_seed: --install {tmp_path / 'nope'}: no such folder (build it: python "
        "benchmarks/build_vllm_wheel.py --seed)",
    ]
    # The expectation itself: a FAIL outside FULL x prefill, or one naming a decode row, is not the seed.
    row = {
        "status": "fail",
        "mode": "FULL",
        "has_prefill": True,
        "resolved": "FULL",
        "reason": "replay check failed at step 0, ...; bad rows 15/17 in requests 2 (q 1), 3 (q 5), 4 (q 9)",
    }
    assert "not all prefill rows" in gpu_seed.expected("0.10.2", row)
    assert gpu_seed.expected("0.10.2", {**row, "reason": row["reason"].replace("2 (q 1), ", "")}) is None
    assert gpu_seed.expected("0.10.2", {**row, "mode": "PIECEWISE", "has_prefill": True}).startswith("fail")
    assert gpu_seed.expected("0.11.0", {**row, "status": "pass", "resolved": "FULL"}).startswith(
        "FULL resolved to FULL"
    )
