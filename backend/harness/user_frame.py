"""Where a backend's error is: the first traceback frame outside orch, torch and Python.

A capture error or an exception raised inside a backend's `forward` or builder reaches the
checker through a dozen of orch's own frames (session, model, family, the emulation's dispatch
mode); the one line a backend engineer needs is theirs ("mybackend.py, line 13, in forward").
The checker puts it in the case's reason and at the end of its log tail, so every text output
(orch run -v, orch repro, summary.md, JUnit) names it.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from functools import lru_cache

# Packages whose frames are machinery, never the backend under test (a kernel's error is raised
# inside torch or triton; the backend line that called it is what to show).
_MACHINERY = ("backend", "orchestrator", "torch", "triton", "ray", "numpy", "jinja2", "click", "yaml")


@dataclass(frozen=True)
class Frame:
    path: str  # as short as it can be: relative to the sys.path entry that holds it
    line: int
    function: str
    source: str  # the line's code, stripped ("" when unknown)

    def where(self) -> str:
        """Python's own wording of a frame: `mybackend.py, line 13, in forward`."""
        return f"{self.path}, line {self.line}, in {self.function}"


@lru_cache(maxsize=1)
def _machinery_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(package dirs, standard library dirs), each ending in a separator."""
    packages = set()
    for name in _MACHINERY:
        file = getattr(sys.modules.get(name), "__file__", None)
        if file:
            packages.add(os.path.realpath(os.path.dirname(file)))
    stdlib = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
    return tuple(d + os.sep for d in sorted(packages)), tuple(d + os.sep for d in sorted(stdlib))


def _is_machinery(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen ...>, <string>
        return True
    real = os.path.realpath(filename)
    packages, stdlib = _machinery_dirs()
    if any(real.startswith(d) for d in packages):
        return True
    # site-packages may sit under the standard library's dir: a pip-installed backend is not Python's
    third_party = "site-packages" in real or "dist-packages" in real
    return not third_party and any(real.startswith(d) for d in stdlib)


def _short(filename: str) -> str:
    """The path relative to the longest sys.path entry (or the working directory) holding it."""
    real = os.path.realpath(filename)
    roots = [os.path.realpath(p or os.getcwd()) for p in sys.path] + [os.getcwd()]
    best = ""
    for root in roots:
        root = root.rstrip(os.sep) + os.sep
        if real.startswith(root) and len(root) > len(best):
            best = root
    return real[len(best) :] if best else filename


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and what caused it, innermost (the original error) first."""
    out: list[BaseException] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        out.append(e)
        seen.add(id(e))
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return out[::-1]


def user_frame(exc: BaseException) -> Frame | None:
    """The innermost frame outside orch, torch, triton, Ray and the standard library, in the
    original error of `exc`'s chain; None when every frame is machinery (orch's own error)."""
    for e in _chain(exc):
        for fs in reversed(traceback.extract_tb(e.__traceback__)):
            if not _is_machinery(fs.filename):
                return Frame(_short(fs.filename), fs.lineno or 0, fs.name, (fs.line or "").strip())
    return None
