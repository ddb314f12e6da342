"""Import directions that keep the unit under test apart from the tool around it: backend/ never
imports orchestrator/ (a backend author's checker runs without the orchestrator), and an
interface module never imports its implementations (graphs/base.py; outputs.py is imported by
the report writers, never the reverse). Read from the source, so a lazy import inside a function
counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_backend_never_imports_orchestrator():
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in imported_modules(p) if m.split(".")[0] == "orchestrator")
                 for p in (ROOT / "backend").rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("module, forbidden", [
    ("backend/graphs/base.py", ("backend.graphs.cuda", "backend.graphs.emulated", "backend.graphs.select")),
    ("orchestrator/outputs.py", ("orchestrator.dashboard", "orchestrator.junit", "orchestrator.summary")),
])
def test_interfaces_do_not_import_their_implementations(module, forbidden):
    got = imported_modules(ROOT / module)
    assert not [m for m in got if m.startswith(forbidden)], got


def test_the_scan_sees_a_lazy_import(tmp_path):
    # The rule must be able to fail: an import inside a function is found.
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from orchestrator import __version__\n")
    assert "orchestrator" in imported_modules(f)
