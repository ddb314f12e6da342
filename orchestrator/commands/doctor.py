"""`orch doctor`: what a user runs first on a new box. One screen (or --json) of what a run here
will get: platform and GPUs, visible-device variables as Ray will set them, the fp8 dtype, each
provider's availability (the providers' own checks, through the registry), graph kind, Ray and
token auth, NCCL/RCCL switches, Triton cache, and the installed amd-aiter against what we rely on.

With --matrix: which providers the matrix can use here (its cases expanded exactly as `orch run`
expands them) and which are skipped, with the reason. The exit code is the one `orch run` would
get for the reasons doctor can see: 0 when the runnable part can run (a provider that cannot run
here is skipped by the run too: doctor must not say 1 where the run passes), 3 for `--devices gpu`
without a GPU, 1 when a provider the run uses fails to load its kernels; a matrix that does not
load is bad input (2). Nothing here starts Ray or touches a GPU beyond reading its properties.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.commands.doctor_env import (
    COLLECTIVE_VARS,
    VISIBLE_DEVICE_VARS,
    fp8_dtype_for_arch,
    platform_name,
    ray_auth_state,
    ray_visible_var,
    visible_device_findings,
)
from orchestrator.commands.doctor_env import RAY_AUTH_VARS as RAY_AUTH_VARS  # re-exported
from orchestrator.console import echo
from orchestrator.errors import ExitCode


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    arch: str  # gfx942 / gfx950 / sm_90
    memory_gib: float
    fp8_dtype: str


@dataclass(frozen=True)
class ProviderLine:
    provider: str
    available: bool
    reason: str


@dataclass(frozen=True)
class FamilyLine:
    """One attention family here: the providers orch ships for it that run on this box, and those
    that cannot, each with its own reason for this family (a provider can run one family and not
    another: vLLM's backends, a kv dtype a family's provider lacks)."""

    family: str
    runs_here: tuple[str, ...]
    not_here: tuple[ProviderLine, ...]


@dataclass(frozen=True)
class ProviderUse:
    provider: str
    runs: int  # cases of this provider `orch run` runs here
    skipped: int  # its cases skipped here
    reason: str  # why none of its cases run here ("" when some do)


@dataclass(frozen=True)
class MatrixCheck:
    path: str
    device_class: str
    providers: tuple[str, ...]  # every provider the matrix names
    usable: tuple[ProviderUse, ...]  # providers with cases that run here
    unusable: tuple[ProviderUse, ...]  # providers whose every case is skipped here, with the reason
    runnable: int
    skipped: int
    problems: tuple[str, ...] = ()  # what would make `orch run MATRIX` fail here
    exit_code: int = 0  # what `orch run MATRIX` would exit with, as far as doctor can tell


@dataclass(frozen=True)
class DoctorReport:
    platform: str  # CUDA | ROCm | CPU
    torch: str
    torch_cuda: str | None
    torch_hip: str | None
    driver: str | None
    gpus: tuple[Gpu, ...]
    device: str  # what `--devices auto` resolves to: cuda or cpu
    fp8_dtype: str
    graph_kind: str  # cuda | hip | emulated
    visible_devices: Mapping[str, str | None]
    ray_sets: str | None  # the variable Ray sets per GPU worker here
    device_findings: tuple[str, ...]
    providers: tuple[ProviderLine, ...]
    families: tuple[FamilyLine, ...]
    ray_version: str | None
    ray_auth: str
    collective: str  # NCCL | RCCL | gloo
    collective_env: Mapping[str, str | None]
    gang_defaults: Mapping[str, str]  # what init_gang sets when unset
    triton_version: str | None
    triton_cache_dir: str
    aiter_version: str | None
    aiter_findings: tuple[str, ...]
    matrix: MatrixCheck | None = None
    warnings: tuple[str, ...] = field(default_factory=tuple)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver(platform: str) -> str | None:
    # The kernel driver, from the files the drivers publish (no subprocess, no nvidia-smi).
    for path, label in (("/proc/driver/nvidia/version", "nvidia"), ("/sys/module/amdgpu/version", "amdgpu")):
        try:
            text = Path(path).read_text().strip().splitlines()[0]
        except (OSError, IndexError):
            continue
        if label == "nvidia":
            words = [w for w in text.split() if w[:1].isdigit() and "." in w]
            return f"nvidia {words[0]}" if words else text
        return f"amdgpu {text}"
    return None


def _gpus(torch) -> tuple[Gpu, ...]:
    from backend.attention.kv_cache import fp8_dtype

    gpus = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        arch = (getattr(p, "gcnArchName", "") or "").split(":")[0] if torch.version.hip else f"sm_{p.major}{p.minor}"
        gpus.append(
            Gpu(
                i,
                p.name,
                arch,
                round(p.total_memory / 2**30, 1),
                str(fp8_dtype(torch.device("cuda", i))).removeprefix("torch."),
            )
        )
    return tuple(gpus)


def _aiter_findings(try_load: bool) -> tuple[str | None, tuple[str, ...]]:
    """Version, patch checks, native registration; with try_load (aiter-triton available here)
    also the real Triton kernel load, so a broken install shows here, not in every case."""
    from backend.providers import aiter_loader as L

    pkg = L.aiter_package_dir()
    if pkg is None:
        return None, ("amd-aiter not installed (aiter, aiter-triton need it)",)
    out = []
    try:
        for check in L.patch_checks(pkg):
            state = "ok" if check.valid and check.needed else "INVALID" if not check.valid else "not needed"
            out.append(f"{check.patch}: {state}: {check.detail.split(': ', 2)[-1]}")
        out.extend(f"native: {p}" for p in L.native_registration_problems(pkg))
    except L.AiterLoadError as exc:
        out.append(str(exc))
    out.append(_aiter_gdn_finding(pkg))
    if try_load:
        try:
            loaded = L.load_aiter_triton()
            out.append(f"triton kernels: loaded ({', '.join(sorted(vars(loaded)))})")
        except L.AiterLoadError as exc:
            out.append(f"triton kernels: FAILED: {exc}")
    return L.installed_aiter_version(pkg), tuple(out)


# Names an AITER GatedDeltaNet op would carry (ROCm/aiter PR #3152's HIP decode, #4250's prefill;
# vLLM's rocm_aiter_ops' FlyDSL prefill); hybrid_gdn binds one to its signature once a release has it.
GDN_OP_NAMES = ("gated_delta", "gdn", "delta_rule", "fused_recurrent")


def _aiter_gdn_finding(pkg) -> str:
    """Whether the installed amd-aiter has a GatedDeltaNet kernel (by module and file names under
    aiter/: nothing is imported; the package's init needs ROCm)."""
    found = sorted(
        {str(p.relative_to(pkg)) for p in Path(pkg).rglob("*.py") if any(n in p.stem.lower() for n in GDN_OP_NAMES)}
    )
    if not found:
        return (
            "gdn decode: none in this amd-aiter (no gated-delta-rule module under aiter/): the hybrid_gdn "
            "family has no aiter provider; its cases run on torch and vllm:GDN_ATTN"
        )
    return f"gdn decode: {', '.join(found[:4])} present, not bound yet (hybrid_gdn runs on torch, vllm:GDN_ATTN)"


def family_lines(
    families: Sequence[str], providers_of: Callable[[str], Sequence[str]], avail: Callable[[str, str], tuple[bool, str]]
) -> tuple[FamilyLine, ...]:
    """Per family, its providers split by whether they run here. `avail(provider, family)` is the
    provider's own check for that family (registry.availability in `collect`)."""
    out = []
    for fam in families:
        checked = [(name, *avail(name, fam)) for name in providers_of(fam)]
        out.append(
            FamilyLine(
                fam,
                tuple(n for n, ok, _ in checked if ok),
                tuple(ProviderLine(n, False, why) for n, ok, why in checked if not ok),
            )
        )
    return tuple(out)


def check_matrix(
    path: str, devices: str, *, gpu_here: bool = True, kernel_load_failed: bool = False, matrix=None
) -> MatrixCheck:
    """What `orch run MATRIX` would use here: providers with runnable cases, providers whose every
    case is skipped (and why), and the problems that would fail the run (with its exit code).
    `matrix`: the file already expanded (collect loads it first, so a bad one fails fast)."""
    from backend.attention.registry import availability
    from orchestrator.matrix import load_matrix

    if matrix is None:
        matrix = load_matrix(path, devices=devices)  # InputError (exit 2) on a bad matrix
    device = "cuda" if matrix.device_class == "gpu" else "cpu"
    runs = Counter(c.backend for c in matrix.cases)
    skips = Counter(s.case.backend for s in matrix.skipped)
    names = sorted(set(runs) | set(skips))
    usable = tuple(ProviderUse(n, runs[n], skips[n], "") for n in names if runs[n])
    unusable = tuple(
        ProviderUse(
            n,
            0,
            skips[n],
            availability(n, device).reason or next(s.reason for s in matrix.skipped if s.case.backend == n),
        )
        for n in names
        if not runs[n]
    )
    problems: list[tuple[str, int]] = []
    if devices == "gpu" and not gpu_here:
        problems.append(("--devices gpu but there is no GPU here: `orch run` exits 3", ExitCode.INFRA_ERROR))
    triton = sorted({"aiter-triton", "aiter-triton-pa"} & set(runs))
    if triton and kernel_load_failed:
        problems.append(
            (
                f"{', '.join(triton)} cannot load AITER's Triton kernels (see triton / aiter above): "
                f"their {sum(runs[t] for t in triton)} cases would fail",
                ExitCode.GATE_FAILED,
            )
        )
    return MatrixCheck(
        path,
        matrix.device_class,
        tuple(names),
        usable,
        unusable,
        len(matrix.cases),
        len(matrix.skipped),
        tuple(p for p, _ in problems),
        max((int(c) for _, c in problems), default=0),
    )


def collect(env: Mapping[str, str] | None = None, matrix: str | None = None, devices: str = "auto") -> DoctorReport:
    import torch

    from backend.attention.kv_cache import fp8_dtype
    from backend.attention.registry import (
        BUILTIN_BACKENDS,
        VLLM_BACKENDS,
        VLLM_FAMILIES,
        availability,
        family_providers,
    )
    from backend.families.contract.registry import FAMILY_NAMES
    from backend.graphs.cuda import graph_kind
    from backend.harness.distributed import _NCCL_ENV

    env = dict(os.environ if env is None else env)
    gpu = torch.cuda.is_available()
    planned = None
    if matrix:  # the matrix first: a bad file is one line and exit 2 before seconds of provider imports
        from orchestrator.matrix import load_matrix

        planned = load_matrix(matrix, devices=devices)
    platform = platform_name(torch.version.hip, torch.version.cuda, gpu)
    gpus = _gpus(torch) if gpu else ()
    device = "cuda" if gpu else "cpu"
    warnings = []
    used_fp8 = str(fp8_dtype(torch.device(device))).removeprefix("torch.")
    for g in gpus:  # the cache's choice (kv_cache.fp8_dtype) against the arch rule
        if g.fp8_dtype != fp8_dtype_for_arch(g.arch):
            warnings.append(
                f"GPU {g.index} ({g.arch}) gets {g.fp8_dtype}, its arch calls for {fp8_dtype_for_arch(g.arch)}"
            )
    if len({g.arch for g in gpus}) > 1:
        warnings.append(f"mixed GPU archs on one node: {', '.join(sorted({g.arch for g in gpus}))}")
    providers = tuple(
        ProviderLine(a.provider, a.available, a.reason)
        for a in (
            availability(name, device, VLLM_FAMILIES.get(name, "gqa")) for name in BUILTIN_BACKENDS + VLLM_BACKENDS
        )
    )
    families = family_lines(
        FAMILY_NAMES, family_providers, lambda name, fam: ((a := availability(name, device, fam)).available, a.reason)
    )
    triton_ok = any(p.provider == "aiter-triton" and p.available for p in providers)
    aiter_version, aiter_findings = _aiter_findings(triton_ok)
    home = Path(env.get("HOME") or Path.home())
    cache = env.get("TRITON_CACHE_DIR") or str(home / ".triton" / "cache")
    return DoctorReport(
        platform=platform,
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        torch_hip=torch.version.hip,
        driver=_driver(platform),
        gpus=gpus,
        device=device,
        fp8_dtype=used_fp8,
        graph_kind=graph_kind(torch.version.hip, gpu),
        visible_devices={k: env.get(k) for k in VISIBLE_DEVICE_VARS},
        ray_sets=ray_visible_var(platform),
        device_findings=visible_device_findings(env, platform),
        providers=providers,
        families=families,
        ray_version=_version("ray"),
        ray_auth=ray_auth_state(env, home),
        collective="RCCL" if platform == "ROCm" else "NCCL" if platform == "CUDA" else "gloo",
        collective_env={k: env.get(k) for k in COLLECTIVE_VARS},
        gang_defaults=dict(_NCCL_ENV),
        triton_version=_version("triton") or _version("pytorch-triton-rocm"),
        triton_cache_dir=cache + ("" if Path(cache).is_dir() else " (not created yet)"),
        aiter_version=aiter_version,
        aiter_findings=aiter_findings,
        matrix=check_matrix(
            matrix,
            devices,
            gpu_here=gpu,
            kernel_load_failed=any(f.startswith("triton kernels: FAILED") for f in aiter_findings),
            matrix=planned,
        )
        if matrix
        else None,
        warnings=tuple(warnings),
    )


def render(report: DoctorReport) -> None:
    from rich.table import Table

    t = Table(title="orch doctor", show_header=False, box=None, pad_edge=False, title_justify="left")
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")

    def section(name):
        t.add_row(f"[cyan]{name}[/]", "")

    section("platform")
    t.add_row("platform", f"{report.platform} (torch {report.torch}, cuda {report.torch_cuda}, hip {report.torch_hip})")
    t.add_row("driver", report.driver or "-")
    for g in report.gpus:
        t.add_row(f"gpu {g.index}", f"{g.name} {g.arch} {g.memory_gib} GiB fp8 {g.fp8_dtype}")
    if not report.gpus:
        t.add_row("gpus", "none (CPU workers, emulated graphs)")
    t.add_row("fp8 dtype", report.fp8_dtype + (" (max 240)" if "fnuz" in report.fp8_dtype else " (max 448)"))
    t.add_row("graph kind", report.graph_kind)
    section("devices")
    shown = {k: v for k, v in report.visible_devices.items() if v is not None}
    t.add_row("visible", ", ".join(f"{k}={v}" for k, v in shown.items()) or "none set")
    t.add_row("ray sets", report.ray_sets or "nothing (no GPUs)")
    for line in report.device_findings:
        t.add_row("", f"[{'red' if line.startswith('error') else 'yellow'}]{line}[/]")
    section("providers")
    for p in report.providers:
        t.add_row(p.provider, "[green]available[/]" if p.available else f"[yellow]{p.reason}[/]")
    section("families")
    said = {p.provider: p.reason for p in report.providers}  # a reason the providers section gave is not repeated
    for f in report.families:
        why = ", ".join(
            p.provider
            if said.get(p.provider) == p.reason
            else f"{p.provider} ({p.reason.removeprefix('unavailable: ')})"
            for p in f.not_here
        )
        t.add_row(f.family, f"[green]{', '.join(f.runs_here)}[/]" if f.runs_here else "[red]no provider runs here[/]")
        if why:
            t.add_row("", f"[yellow]not here: {why}[/]")
    section("ray / collectives")
    t.add_row("ray", f"{report.ray_version or 'not installed'}; auth {report.ray_auth}")
    env = {k: v for k, v in report.collective_env.items() if v is not None}
    t.add_row(report.collective, ", ".join(f"{k}={v}" for k, v in env.items()) or "no NCCL_* variables set")
    t.add_row("gang sets", ", ".join(f"{k}={v}" for k, v in report.gang_defaults.items()) + " (when unset)")
    section("triton / aiter")
    t.add_row("triton", f"{report.triton_version or 'not installed'}; cache {report.triton_cache_dir}")
    t.add_row("amd-aiter", report.aiter_version or "not installed")
    for line in report.aiter_findings:
        t.add_row("", line)
    for line in report.warnings:
        t.add_row("[yellow]warning[/]", line)
    if report.matrix:
        m = report.matrix
        section("matrix")
        t.add_row("file", f"{m.path} ({m.device_class}): {m.runnable} cases run here, {m.skipped} skipped")
        for u in m.usable:
            t.add_row(
                u.provider, f"[green]runs {u.runs} case(s) here[/]" + (f" ({u.skipped} skipped)" if u.skipped else "")
            )
        for u in m.unusable:
            t.add_row(u.provider, f"[yellow]skipped here ({u.skipped} case(s)): {u.reason}[/]")
        for line in m.problems:
            t.add_row("[red]problem[/]", line)
        if not m.problems:
            t.add_row(
                "verdict",
                "[green]`orch run` can run this matrix here[/]"
                if m.runnable
                else "[yellow]nothing in this matrix runs here: `orch run` would skip every case[/]",
            )
    echo(t)


def main(matrix: str | None = None, as_json: bool = False, devices: str = "auto") -> int:
    import sys

    report = collect(matrix=matrix, devices=devices)
    if as_json:
        print(json.dumps(dataclasses.asdict(report), indent=2))
    else:
        render(report)
    if report.matrix is None:
        return ExitCode.OK
    for line in report.matrix.problems:
        print(f"orch doctor: {report.matrix.path}: {line}", file=sys.stderr)
    return report.matrix.exit_code
