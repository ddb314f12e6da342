"""Which vLLM release this process imports, and which of the adapter's two interfaces serves it.

vLLM changed its attention-backend interface between 0.11 and 0.33 (lookup, names, cache layout,
CommonAttentionMetadata, the support attribute: docs/VLLM.md "The seed's release"), so each
supported range has its own interface module:
    old      >=0.10.2,<0.12   old.py      (the seed: 0.10.2 red, 0.11.0 green)
    current  >=0.33.0,<0.35   current.py
The release is the one `import vllm` finds, or the one ORCH_VLLM names: a release number
(`ORCH_VLLM=0.10.2` puts `.vllm-0.10.2/` of this checkout, built by `python
benchmarks/build_vllm_wheel.py --version 0.10.2 --site`, first on sys.path before vllm is
imported) or a directory holding a vllm. Ray actors get the variable from the driver
(orchestrator/executor/actors.py FORWARDED_ENV), so driver and workers import the same release.

Torch-free: the CLI asks `bad_input_line()` before anything heavy loads.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import re
import sys
from pathlib import Path

# >= first, < second. SUPPORTED_RANGE keeps its name: the current interface's range.
SUPPORTED_RANGE = ("0.33.0", "0.35.0")
OLD_RANGE = ("0.10.2", "0.12.0")
RANGES = {"old": OLD_RANGE, "current": SUPPORTED_RANGE}
SITE_ENV = "ORCH_VLLM"
REPO_ROOT = Path(__file__).resolve().parents[3]
NOT_INSTALLED = (
    "unavailable: vllm is not installed (pip install vllm --no-deps plus docs/VLLM.md's extra "
    "packages, or ORCH_VLLM=RELEASE with its target dir)"
)


def _range_text(rng: tuple[str, str]) -> str:
    return f">={rng[0]},<{rng[1]}"


def ranges_text() -> str:
    return " or ".join(_range_text(r) for r in RANGES.values())


def _base(installed: str):
    from packaging.version import Version

    return Version(Version(installed).base_version)


def version_reason(installed: str | None, supported: tuple[str, str] = SUPPORTED_RANGE) -> str | None:
    """None when `installed` is inside [supported[0], supported[1]); else why not (one line)."""
    from packaging.version import InvalidVersion, Version

    if installed is None:
        return NOT_INSTALLED
    try:
        v = _base(installed)
    except InvalidVersion:
        return f"unavailable: vllm version {installed!r} is not a version number"
    lo, hi = (Version(s) for s in supported)
    if not lo <= v < hi:
        return f"unavailable: vllm {installed} is outside the supported range {_range_text(supported)}"
    return None


def interface_for(installed: str | None) -> tuple[str | None, str | None]:
    """("old" | "current", None) for a release inside one of RANGES, else (None, why not)."""
    for name, rng in RANGES.items():
        if version_reason(installed, rng) is None:
            return name, None
    why = version_reason(installed, SUPPORTED_RANGE)
    if installed is not None and "outside" in why:
        why = f"unavailable: vllm {installed} is outside the supported ranges {ranges_text()}"
    return None, why


def site_dir(value: str) -> Path:
    """ORCH_VLLM's directory: `.vllm-RELEASE/` of this checkout for a release number, else the path."""
    if re.fullmatch(r"\d+\.\d+(\.\d+)?([.+-]?\w+)*", value):
        return REPO_ROOT / f".vllm-{value}"
    return Path(value).expanduser().resolve()


@functools.lru_cache(maxsize=1)
def site_error() -> str | None:
    """Apply ORCH_VLLM once per process (its directory first on sys.path); the one-line reason it
    cannot be applied, or None (also when it is not set)."""
    value = os.environ.get(SITE_ENV, "").strip()
    if not value:
        return None
    path = site_dir(value)
    if not (path / "vllm" / "__init__.py").is_file():
        return (
            f"{SITE_ENV}={value}: {path} holds no vllm (build it: python benchmarks/build_vllm_wheel.py "
            f"--version {value} --site)"
        )
    loaded = sys.modules.get("vllm")
    if loaded is not None and not str(getattr(loaded, "__file__", "") or "").startswith(str(path)):
        return f"{SITE_ENV}={value}: another vllm is already imported in this process ({loaded.__file__})"
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
        importlib.invalidate_caches()
    found = [d.version for d in importlib.metadata.distributions(name="vllm", path=[str(path)])]
    if not found:
        return f"{SITE_ENV}={value}: {path} has no vllm distribution metadata (install it with pip --target)"
    if path.name.startswith(".vllm-") and found[0] != value and _base(found[0]) != _base(value):
        return f"{SITE_ENV}={value}: {path} holds vllm {found[0]}, not {value}"
    return None


def installed_version() -> str | None:
    """The vllm release this process imports (after ORCH_VLLM), or None."""
    if site_error():
        return None
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def release_reason() -> tuple[str | None, str | None]:
    """(interface name, None) for the release here, or (None, the one-line skip reason)."""
    err = site_error()
    if err:
        return None, f"unavailable: {err}"
    return interface_for(installed_version())


def bad_input_line() -> str | None:
    """For `--backend vllm:NAME` on the command line: the one line that makes it bad input (a vllm
    release outside every supported range, or an ORCH_VLLM that cannot be applied), else None. No
    vllm at all stays a skip with the reason, as for a matrix that names vllm: backends."""
    err = site_error()
    if err:
        return err
    installed = installed_version()
    if installed is None:
        return None
    name, _ = interface_for(installed)
    if name is None:
        return f"vllm {installed} is installed; vllm: backends need a release {ranges_text()}"
    return None
