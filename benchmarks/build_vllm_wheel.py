"""Build a Python-only vllm wheel (and the extra packages its attention imports need) into .whl/,
for `--backend vllm:NAME` where there is no registry (the lent GPU machine) or no time for the
full wheel (CI). See docs/VLLM.md.

    python benchmarks/build_vllm_wheel.py                      # vllm 0.34.0 + extras for Python 3.12
    python benchmarks/build_vllm_wheel.py --wheel /tmp/vllm-0.34.0-...whl --python-version 3.11
    python benchmarks/build_vllm_wheel.py --no-extras --out /tmp/w

The registry wheel is ~239 MB, most of it compiled code (vllm._C, flash-attn, MoE, DeepGEMM, the
vllm-rs binary) and C++/CUDA headers, none of which FLEX_ATTENTION or TRITON_ATTN load. Dropped:
ELF files (any name), *.so, and C/C++/CUDA sources and headers; RECORD is rewritten to match, so
`pip install --no-deps` accepts it. The extras are the exact packages `import
vllm.v1.attention.backends.flex_attention` (config, CommonAttentionMetadata, builder) needs with
`--no-deps` (EXTRAS, measured with vllm 0.34.0 on torch 2.13 CPU). Exit codes: 0 done, 2 bad
input, 3 a download failed.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile

# What `import vllm.v1.attention.backends.flex_attention` pulled in, one missing module at a time,
# over a venv with torch, numpy, pydantic, pyyaml, requests, psutil, packaging, filelock, einops,
# typing_extensions (orch's own environment). Versions as resolved for vllm 0.34.0's pins.
EXTRAS = (
    "regex==2026.11.19", "pyzmq==27.3.0", "transformers==5.22.2", "huggingface_hub==2.4.0",
    "tokenizers==0.23.3", "safetensors==0.8.0", "tqdm==4.70.1", "httpx2==2.16.2", "httpcore2==2.16.2",
    "truststore==0.10.5", "h11==0.16.0", "aiohttp==3.14.5", "multidict==7.2.1", "yarl==1.25.1",
    "propcache==0.5.4", "aiohappyeyeballs==2.7.1", "aiosignal==1.4.0", "frozenlist==1.8.0",
    "pillow==13.0.0", "pybase64==1.5.1", "cachetools==8.0.2", "cbor2==6.3.0", "msgspec==0.23.0",
    "cloudpickle==3.1.3", "uvloop==0.23.0", "py-cpuinfo==9.0.0", "prometheus_client==0.26.0",
    "llguidance==1.9.1", "xgrammar==0.2.9", "apache-tvm-ffi==0.1.11",
)
_DROP_SUFFIXES = (".so", ".hpp", ".h", ".cuh", ".cu", ".cpp", ".cc", ".c", ".cxx", ".inl")


class InputError(Exception):
    pass


def keep(name: str, head: bytes) -> bool:
    """Whether a wheel member stays in the Python-only wheel."""
    base = name.rsplit("/", 1)[-1]
    if head.startswith(b"\x7fELF"):
        return False
    if base.endswith(_DROP_SUFFIXES) or ".so." in base:
        return False
    return True


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


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
        lines.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(lines) + "\n")
    return kept, dropped


def _download(args: list[str], dest: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", dest, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(f"pip download {' '.join(args[-1:])} failed: {tail[-1] if tail else proc.returncode}")


def _platform_args(python_version: str | None) -> list[str]:
    if not python_version:
        return []
    plats = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_31_x86_64", "manylinux1_x86_64"]
    out = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for p in plats:
        out += ["--platform", p]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="0.34.0", help="vllm version to download (default 0.34.0)")
    ap.add_argument("--wheel", help="an already downloaded vllm wheel (no download)")
    ap.add_argument("--out", default=".whl", help="output directory (default .whl, git-ignored)")
    ap.add_argument("--python-version", default="3.12",
                    help="target Python of the extras' binary wheels (default 3.12, the GPU machine's); '' = this one")
    ap.add_argument("--no-extras", action="store_true", help="only the trimmed vllm wheel")
    a = ap.parse_args(argv)
    try:
        if a.wheel and not (os.path.isfile(a.wheel) and a.wheel.endswith(".whl")):
            raise InputError(f"--wheel {a.wheel}: not a .whl file")
        os.makedirs(a.out, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            src = a.wheel
            if src is None:
                _download([f"vllm=={a.version}"], tmp)
                src = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
            t1 = time.perf_counter()
            dst = os.path.join(a.out, os.path.basename(src))
            kept, dropped = trim(src, dst)
            t2 = time.perf_counter()
            print(f"vllm: {os.path.getsize(src) / 2**20:.0f} MiB -> {os.path.getsize(dst) / 2**20:.1f} MiB "
                  f"({kept} files kept, {dropped} compiled/C++ dropped); download {t1 - t0:.1f} s, trim {t2 - t1:.1f} s")
            if not a.no_extras:
                _download([*_platform_args(a.python_version), *EXTRAS], a.out)
                size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
                print(f"extras: {len(EXTRAS)} packages for Python {a.python_version or 'here'}; "
                      f"{a.out}/ now {size / 2**20:.1f} MiB; {time.perf_counter() - t2:.1f} s")
    except InputError as e:
        print(f"build_vllm_wheel: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, StopIteration, OSError) as e:
        print(f"build_vllm_wheel: {e or 'no wheel downloaded'}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
