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
    offenders = {
        str(p.relative_to(ROOT)): sorted(m for m in imported_modules(p) if m.split(".")[0] == "orchestrator")
        for p in (ROOT / "backend").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize(
    "module, forbidden",
    [
        ("backend/graphs/base.py", ("backend.graphs.cuda", "backend.graphs.emulated", "backend.graphs.select")),
        ("orchestrator/outputs.py", ("orchestrator.dashboard", "orchestrator.junit", "orchestrator.summary")),
    ],
)
def test_interfaces_do_not_import_their_implementations(module, forbidden):
    got = imported_modules(ROOT / module)
    assert not [m for m in got if m.startswith(forbidden)], got


def test_the_scan_sees_a_lazy_import(tmp_path):
    # The rule must be able to fail: an import inside a function is found.
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from orchestrator import __version__\n")
    assert "orchestrator" in imported_modules(f)


# ---- the family contract: the harness reaches families only through it, and nothing circles ----

CONTRACT = "backend.families.contract"
# A circle older than the contract: vLLM's adapter package (its __init__ dispatches to the
# per-family modules, which call back its current_interface; mla_sparse joined as its siblings
# did). Listed so it cannot grow unseen.
KNOWN_CIRCLES = [
    {
        "backend.adapters.vllm",
        "backend.adapters.vllm.current",
        "backend.adapters.vllm.gdn",
        "backend.adapters.vllm.mla",
        "backend.adapters.vllm.mla_sparse",
        "backend.adapters.vllm.old",
        "backend.adapters.vllm.roles",
        "backend.adapters.vllm.swa",
    }
]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, top: str = "backend") -> dict[str, set[str]]:
    """module -> the modules of `top` it imports (`from a import b` counts a, and a.b where b is a
    module; lazy imports count; an importlib path does not, which is how the registry reaches a
    family)."""
    modules = {module_name(p, root): p for p in (root / top).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(comp)
    return out


def test_no_import_circle_in_backend():
    assert [c for c in circles(import_graph(ROOT)) if c not in KNOWN_CIRCLES] == []


def test_the_harness_imports_no_family_but_the_contract():
    graph = import_graph(ROOT)
    upward = {
        (m, dep)
        for m, deps in graph.items()
        if m.startswith("backend.harness")
        for dep in deps
        if dep.startswith("backend.families") and not dep.startswith(CONTRACT)
    }
    assert upward == set()


def test_the_contract_imports_no_family_and_no_harness():
    graph = import_graph(ROOT)
    below = {
        (m, dep)
        for m, deps in graph.items()
        if m.startswith(CONTRACT)
        for dep in deps
        if dep.startswith(("backend.harness", "backend.families")) and not dep.startswith(CONTRACT)
    }
    # the families package's own face re-exports the contract and nothing else
    below |= {("backend.families", dep) for dep in graph["backend.families"] if not dep.startswith(CONTRACT)}
    assert below == set()


@pytest.mark.parametrize(
    "source, circle",
    [
        ({"a/x.py": "from a.y import f\n", "a/y.py": "def f():\n    from a import x\n"}, {"a.x", "a.y"}),
        ({"a/x.py": "from a import y\n", "a/y.py": "import a.x\n"}, {"a.x", "a.y"}),
        ({"a/x.py": "from a.y import f\n", "a/y.py": "import importlib\nimportlib.import_module('a.x')\n"}, None),
    ],
)
def test_the_graph_sees_a_circle(tmp_path, source, circle):
    # The rules must be able to fail: a lazy or module-level circle is found; importlib is not an edge.
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "__init__.py").write_text("")
    for rel, text in source.items():
        (tmp_path / rel).write_text(text)
    found = circles(import_graph(tmp_path, "a"))
    assert found == ([circle] if circle else [])
