"""Build a Python-only vllm wheel (and the extra packages its attention imports need) into
.whl-vllm/, for `--backend vllm:NAME` where there is no registry (the lent GPU machine) or no time
for the full wheel (CI). See docs/VLLM.md.

    python benchmarks/build_vllm_wheel.py                      # vllm 0.34.0 + extras + orch's deps, Python 3.12
    python benchmarks/build_vllm_wheel.py --wheel /tmp/vllm-0.34.0-...whl --python-version 3.11
    python benchmarks/build_vllm_wheel.py --no-extras --out /tmp/w
    python benchmarks/build_vllm_wheel.py --seed --site        # .vllm-0.10.2/ and .vllm-0.11.0/ here (its
                                                               #   wheels in a temporary folder)
    python benchmarks/build_vllm_wheel.py --seed               # .whl-seed/: both releases for the GPU machine

The seed's releases (vllm 0.10.2 and 0.11.0, `--seed`; docs/VLLM.md "The seed, replayed") each get
a target dir of their own, `--site`: `.vllm-RELEASE/` (git-ignored), vllm and its extras installed
`--no-deps` with pip's --target, which `ORCH_VLLM=RELEASE` puts first on sys.path (the extras
shadow this environment's: 0.10.2 needs transformers 4.x where 0.34 needs 5.x). With --site the
extras are for this Python and orch's own dependencies are left out (they are installed here);
`install_site` is what benchmarks/gpu_seed.py runs on the GPU machine from the carried folder.

.whl-vllm/ is its own git-ignored folder (not Ray's .whl/), so it can be carried to the device
alone: with ORCH_DEPS it holds everything benchmarks/gpu_vllm.py needs that the GPU machine lacks
(the lent H200 has torch, triton, numpy, pyyaml, click, rich, typer, jinja2, pytest are
there), Ray excepted (gpu_vllm runs in-process). The folder and the working tree must stay within
the device tool's 64 MiB: over CARRY_LIMIT_MIB is exit code 4.

The registry wheel is ~239 MB, most of it compiled code (vllm._C, flash-attn, MoE, DeepGEMM, the
vllm-rs binary) and C++/CUDA headers, none of which FLEX_ATTENTION or TRITON_ATTN load. Dropped:
ELF files (any name), *.so, and C/C++/CUDA sources and headers; RECORD is rewritten to match, so
`pip install --no-deps` accepts it. The extras are the exact packages `import
vllm.v1.attention.backends.flex_attention` (config, CommonAttentionMetadata, builder) needs with
`--no-deps` (EXTRAS, measured with vllm 0.34.0 on torch 2.13 CPU). Exit codes: 0 done, 2 bad
input, 3 a download failed, 4 the folder is over the carry limit.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

# What `import vllm.v1.attention.backends.flex_attention` pulled in, one missing module at a time,
# over a venv with torch, numpy, pydantic, pyyaml, requests, psutil, packaging, filelock, einops,
# typing_extensions (orch's own environment). Versions as resolved for vllm 0.34.0's pins.
EXTRAS = (
    "regex==2026.11.19",
    "pyzmq==27.3.0",
    "transformers==5.22.2",
    "huggingface_hub==2.4.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "tqdm==4.70.1",
    "httpx2==2.16.2",
    "httpcore2==2.16.2",
    "truststore==0.10.5",
    "h11==0.16.0",
    "aiohttp==3.14.5",
    "multidict==7.2.1",
    "yarl==1.25.1",
    "propcache==0.5.4",
    "aiohappyeyeballs==2.7.1",
    "aiosignal==1.4.0",
    "frozenlist==1.8.0",
    "pillow==13.0.0",
    "pybase64==1.5.1",
    "cachetools==8.0.2",
    "cbor2==6.3.0",
    "msgspec==0.23.0",
    "cloudpickle==3.1.3",
    "uvloop==0.23.0",
    "py-cpuinfo==9.0.0",
    "prometheus_client==0.26.0",
    "llguidance==1.9.1",
    "xgrammar==0.2.9",
    "apache-tvm-ffi==0.1.11",
    # ... and what that venv already had but a torch-only machine (the lent H200) lacks: found by
    # the same import over torch, numpy, pyyaml, click, rich, jinja2, pytest alone.
    "psutil==7.2.2",
    "requests==2.34.2",
    "urllib3==2.8.0",
    "idna==3.20",
    "certifi==2026.10.19.post1",
    "charset_normalizer==3.5.3",
    "einops==0.8.2",
    # vllm:GDN_ATTN: GDN's metadata builder imports the Qwen GDN layer module for its
    # prefill-backend choice, which imports the quantization configs: compressed_tensors, loguru.
    "compressed-tensors==0.17.0",
    "loguru==0.7.3",
)
# vllm 0.10.2 and 0.11.0 (the seed's releases, the old backend interface): what
# `import vllm.v1.attention.backends.rocm_aiter_fa`, the VllmConfig and the seed matrix's cases
# pulled in, one missing module at a time, over a base with only torch, numpy, pyyaml, click, rich,
# jinja2 and ORCH_DEPS (the GPU machine's). Their own pins: transformers 4.x (>=4.55.2; 5.x is
# 0.33's), tokenizers <0.23 (what transformers 4.57 accepts), huggingface_hub <1.0. No
# xgrammar/llguidance: the old config does not import structured output.
EXTRAS_010 = (
    "transformers==4.57.6",
    "tokenizers==0.22.2",
    "huggingface_hub==0.36.2",
    "safetensors==0.8.0",
    "regex==2026.12.2",
    "tqdm==4.70.1",
    "requests==2.34.2",
    "urllib3==2.8.0",
    "idna==3.21",
    "certifi==2026.10.19.post1",
    "psutil==7.2.2",
    "cachetools==8.0.2",
    "cbor2==6.3.0",
    "cloudpickle==3.1.3",
    "setproctitle==1.3.8",
    "pyzmq==27.3.0",
    "msgspec==0.23.0",
    "blake3==1.0.11",
    "pillow==13.0.0",
    "pybase64==1.5.1",
)
# 0.11.0 over the same import: 0.10.2's list without pybase64, plus aiohttp (its executor base
# imports the LoRA request module, which imports it) and aiohttp's own.
EXTRAS_011 = tuple(p for p in EXTRAS_010 if not p.startswith("pybase64==")) + (
    "aiohttp==3.14.5",
    "multidict==7.2.1",
    "yarl==1.25.1",
    "propcache==0.5.4",
    "aiohappyeyeballs==2.7.1",
    "aiosignal==1.4.0",
    "frozenlist==1.8.0",
)
SEED_RELEASES = ("0.10.2", "0.11.0")

# vllm 0.33.0 over the same import: its own pins differ (transformers <5.21, llguidance <1.8,
# xgrammar 0.2.8), and its config imports more of the server (vllm.config.reasoning ->
# entrypoints.mcp -> openai_harmony; structured output -> vllm.parser -> entrypoints.serve ->
# fastapi, openai). Measured with vllm 0.33.0 on torch 2.13 CPU (docs/VLLM.md).
EXTRAS_033_PINS = {
    "transformers": "transformers==5.20.2",
    "llguidance": "llguidance==1.7.6",
    "xgrammar": "xgrammar==0.2.8",
}
EXTRAS_033_ADD = (
    "oss-harmony==0.0.11",
    "openai==3.60.0",
    "sniffio==1.3.1",
    "anyio==4.16.0",
    "fastapi==0.136.3",
    "starlette==1.10.0",
    "annotated_doc==0.0.7",
    "partial_json_parser==0.2.1.1.post7",
)


def extras_for(version: str) -> tuple[str, ...]:
    """The exact extra packages for vllm `version` (0.10.x, 0.11.x, 0.33.x or 0.34.x: the ranges
    backend/adapters/vllm/ bridges)."""
    minor = ".".join(version.split(".")[:2])
    if minor == "0.34":
        return EXTRAS
    if minor == "0.33":
        return tuple(EXTRAS_033_PINS.get(p.split("==")[0], p) for p in EXTRAS) + EXTRAS_033_ADD
    if minor == "0.11":
        return EXTRAS_011
    if minor == "0.10":
        return EXTRAS_010
    raise InputError(
        f"--version {version}: no extras list for it (known: 0.10.x, 0.11.x, 0.33.x, 0.34.x; or --no-extras)"
    )


def site_dir(version: str) -> str:
    """The release's target dir, `.vllm-RELEASE/` at the repo root: where ORCH_VLLM=RELEASE looks
    (backend/adapters/vllm/release.py site_dir)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), f".vllm-{version}")


def install_site(folder: str, version: str, target: str, extras: bool = True, orch_deps: bool = False) -> float:
    """Install vllm `version` and its extras (and ORCH_DEPS) from `folder` (no index) into the
    target dir `target`, each --no-deps; returns the seconds it took. The folder may hold other
    releases' wheels: pip picks each package by its pin."""
    packages = [f"vllm=={version}", *(extras_for(version) if extras else ()), *(ORCH_DEPS if orch_deps else ())]
    t0 = time.perf_counter()
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--upgrade",
        "--find-links",
        folder,
        "--target",
        target,
        *packages,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(f"pip install into {target} failed: {tail[-1] if tail else proc.returncode}")
    return time.perf_counter() - t0


# What orch itself imports (pyproject's dependencies and theirs) that the GPU machine lacks,
# Ray excepted: pinned to the versions orch is tested with here. cp312 binaries via --python-version.
ORCH_DEPS = (
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "annotated_types==0.8.0",
    "typing_inspection==0.4.5",
    "jsonschema==4.26.0",
    "jsonschema_specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds_py==2026.9.1",
    "attrs==26.1.0",
    "junitparser==5.0.3",
    "typing_extensions==4.16.0",
)
# The device tool's limit on what travels: the working tree (tracked and untracked-not-ignored
# files) plus the carried folders, together.
CARRY_LIMIT_MIB = 64.0
_DROP_SUFFIXES = (".so", ".hpp", ".h", ".cuh", ".cu", ".cpp", ".cc", ".c", ".cxx", ".inl")


class InputError(Exception):
    pass


def keep(name: str, head: bytes) -> bool:
    """Whether a wheel member stays in the Python-only wheel."""
    base = name.rsplit("/", 1)[-1]
    if head.startswith(b"\x7fELF"):
        return False
    return not (base.endswith(_DROP_SUFFIXES) or ".so." in base)


def _record_line(name: str, data: bytes) -> str:
    """One RECORD row, CSV as the wheel spec says (vLLM has file names with commas in them)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    row = io.StringIO()
    csv.writer(row, lineterminator="").writerow([name, f"sha256={digest}", len(data)])
    return row.getvalue()


def trim(src: str, dst: str) -> tuple[int, int]:
    """Copy wheel `src` to `dst` without compiled code; returns (members kept, members dropped)."""
    kept, dropped, record_name, lines = 0, 0, None, []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if info.filename.endswith(".dist-info/RECORD"):
                record_name = info.filename
                continue
            data = zin.read(info.filename)
            if not keep(info.filename, data[:4]):
                dropped += 1
                continue
            zout.writestr(info, data)
            lines.append(_record_line(info.filename, data))
            kept += 1
        if record_name is None:
            raise InputError(f"{src}: not a wheel (no .dist-info/RECORD)")
        lines.append(f"{record_name},,")  # a dist-info name has no comma
        zout.writestr(record_name, "\n".join(lines) + "\n")
    return kept, dropped


def folder_mib(path: str) -> float:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) / 2**20


def tree_mib(repo: str = ".") -> float:
    """What travels besides the carried folder: tracked and untracked-not-ignored files (0 outside git)."""
    proc = subprocess.run(
        ["git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True
    )
    if proc.returncode:
        return 0.0
    names = [n for n in proc.stdout.decode(errors="replace").split("\0") if n]
    return sum(os.path.getsize(os.path.join(repo, n)) for n in names if os.path.isfile(os.path.join(repo, n))) / 2**20


def _download(args: list[str], dest: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", dest, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(f"pip download {' '.join(args[-1:])} failed: {tail[-1] if tail else proc.returncode}")


def _platform_args(python_version: str | None) -> list[str]:
    if not python_version:
        return []
    plats = [
        "manylinux_2_28_x86_64",
        "manylinux_2_27_x86_64",
        "manylinux_2_26_x86_64",
        "manylinux_2_24_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "manylinux_2_31_x86_64",
        "manylinux1_x86_64",
    ]
    out = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for p in plats:
        out += ["--platform", p]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--version",
        default=None,
        help="vllm version(s) to download, comma-separated, and whose extras "
        "lists to use (default 0.34.0; --seed: 0.10.2,0.11.0; also with --wheel)",
    )
    ap.add_argument("--seed", action="store_true", help="the seed's releases 0.10.2 and 0.11.0, into .whl-seed/")
    ap.add_argument("--wheel", help="an already downloaded vllm wheel (no download; one --version)")
    ap.add_argument("--out", default=None, help="output directory (default .whl-vllm, --seed .whl-seed; git-ignored)")
    ap.add_argument(
        "--python-version",
        default=None,
        help="target Python of the extras' binary wheels (default 3.12, the GPU machine's; "
        "with --site this one); '' = this one",
    )
    ap.add_argument("--no-extras", action="store_true", help="only the trimmed vllm wheel")
    ap.add_argument(
        "--no-orch-deps",
        action="store_true",
        default=None,
        help="leave out ORCH_DEPS (orch's own dependencies; left out by default with --site)",
    )
    ap.add_argument(
        "--site",
        action="store_true",
        help="then install each release into .vllm-RELEASE/ (its own target dir, for ORCH_VLLM=RELEASE)",
    )
    a = ap.parse_args(argv)
    versions = tuple((a.version or (",".join(SEED_RELEASES) if a.seed else "0.34.0")).split(","))
    # --site installs at once: its wheels (this Python's) go to a temporary folder unless --out names
    # one, so they never mix with a GPU folder's (cp312) in .whl-seed/.
    scratch = tempfile.mkdtemp(prefix="orch-vllm-site-") if a.site and a.out is None else None
    out = a.out or scratch or (".whl-seed" if a.seed else ".whl-vllm")
    python_version = a.python_version if a.python_version is not None else ("" if a.site else "3.12")
    no_orch_deps = a.no_orch_deps if a.no_orch_deps is not None else a.site
    try:
        if not a.no_extras:
            for version in versions:
                extras_for(version)  # bad input before any download
        if a.wheel and not (os.path.isfile(a.wheel) and a.wheel.endswith(".whl")):
            raise InputError(f"--wheel {a.wheel}: not a .whl file")
        if a.wheel and len(versions) > 1:
            raise InputError("--wheel takes one --version")
        os.makedirs(out, exist_ok=True)
        extras: tuple[str, ...] = ()
        for version in versions:
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                src = a.wheel
                if src is None:
                    _download([f"vllm=={version}"], tmp)
                    src = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
                t1 = time.perf_counter()
                dst = os.path.join(out, os.path.basename(src))
                kept, dropped = trim(src, dst)
                t2 = time.perf_counter()
                print(
                    f"vllm {version}: {os.path.getsize(src) / 2**20:.0f} MiB -> {os.path.getsize(dst) / 2**20:.1f} MiB "
                    f"({kept} files kept, {dropped} compiled/C++ dropped); download {t1 - t0:.1f} s, trim {t2 - t1:.1f} s"
                )
            if not a.no_extras:
                extras += tuple(p for p in extras_for(version) if p not in extras)
        t2 = time.perf_counter()
        packages = extras + (() if no_orch_deps else ORCH_DEPS)
        if packages:
            _download([*_platform_args(python_version), *packages], out)
            print(
                f"extras: {len(extras)} packages, orch's deps: {0 if no_orch_deps else len(ORCH_DEPS)}, "
                f"for Python {python_version or 'here'}; {time.perf_counter() - t2:.1f} s"
            )
        if a.site:
            for version in versions:
                target = site_dir(version)
                took = install_site(out, version, target, extras=not a.no_extras, orch_deps=not no_orch_deps)
                print(
                    f"{os.path.relpath(target)}/: vllm {version} and its extras installed --no-deps in {took:.1f} s "
                    f"(use: ORCH_VLLM={version})"
                )
            return 0
        size, tree = folder_mib(out), tree_mib()
        print(
            f"{out}/: {len(os.listdir(out))} wheels, {size:.1f} MiB; with the working tree ({tree:.1f} MiB) "
            f"{size + tree:.1f} MiB of the {CARRY_LIMIT_MIB:.0f} MiB that may travel"
        )
        if size + tree > CARRY_LIMIT_MIB:
            print(
                f"build_vllm_wheel: {out}/ ({size:.1f} MiB) and the working tree ({tree:.1f} MiB) are over the "
                f"{CARRY_LIMIT_MIB:.0f} MiB carry limit (stale wheels from another build? empty the folder and rebuild)",
                file=sys.stderr,
            )
            return 4
    except InputError as e:
        print(f"build_vllm_wheel: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, StopIteration, OSError) as e:
        print(f"build_vllm_wheel: {e or 'no wheel downloaded'}", file=sys.stderr)
        return 3
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
