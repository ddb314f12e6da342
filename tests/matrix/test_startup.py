"""Start-up: loading and expanding a matrix, and the commands that only read the store,
do not import torch (1-2 s of a 2-core machine's start-up) or any kernel library. Behaviour in a
fresh interpreter, not a time: the figures are benchmarks/startup_bench.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = ("torch", "triton", "aiter", "ray")


def fresh(code: str) -> dict:
    """Run `code` in a new interpreter; it prints a JSON line; returns it plus the heavy modules."""
    probe = textwrap.dedent(code) + textwrap.dedent(f"""
        import json as _j, sys as _s
        print(_j.dumps({{"out": OUT, "heavy": sorted(m for m in {HEAVY!r} if m in _s.modules)}}))
    """)
    env = {**os.environ, "PYTHONPATH": REPO}
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("matrix", ["matrices/smoke.yaml", "matrices/full.yaml", "matrices/nightly.yaml"])
@pytest.mark.parametrize("devices", ["cpu", "gpu"])
def test_expanding_a_matrix_does_not_import_torch(matrix, devices):
    got = fresh(f"""
        from orchestrator.matrix import load_matrix
        from orchestrator.filters import select
        m = load_matrix({matrix!r}, devices={devices!r}, backend_checks=False)
        OUT = [len(m.cases), len(select(m.cases, "k=2 tp=1"))]
    """)
    assert got["heavy"] == [], got
    assert got["out"][0] > 0


@pytest.mark.parametrize("matrix", ["matrices/smoke.yaml", "matrices/full.yaml", "matrices/nightly.yaml"])
def test_the_backend_stage_of_builtin_providers_does_not_import_torch(matrix):
    # Builtin providers are planned from their torch-free declarations
    # (backend/attention/capabilities.py); tests/backend/test_capabilities.py holds them to the
    # classes. (For the gpu device class, whether CUDA works and native AITER's probe still ask torch.)
    got = fresh(f"""
        from orchestrator.matrix import load_matrix
        m = load_matrix({matrix!r}, devices="cpu")
        OUT = [len(m.cases), len(m.skipped)]
    """)
    assert got["heavy"] == [], got
    assert got["out"][0] > 0


def test_a_plugin_backend_is_imported_to_plan_it():
    # The other side of the line: a "package.module:Class" backend can only be read by importing
    # it (and torch with it).
    got = fresh("""
        from orchestrator.matrix import load_matrix
        m = load_matrix("matrices/smoke.yaml", devices="cpu", backend_override="tests.backend.broken_backends:FrozenBranchBackend")
        OUT = len(m.cases)
    """)
    assert "torch" in got["heavy"] and "triton" not in got["heavy"]


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "matrices/full.yaml"],
        ["plan", "matrices/full.yaml", "--json"],
        ["plan", "matrices/full.yaml", "--devices", "cpu", "--filter", "tp=1"],
    ],
)
def test_orch_plan_does_not_import_torch(argv):
    got = fresh(f"""
        import contextlib, io
        from orchestrator.cli import main
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main({argv!r})
        OUT = [rc, len(buf.getvalue().splitlines())]
    """)
    assert got["heavy"] == [], got
    assert got["out"][0] == 0 and got["out"][1] > 10


def test_store_commands_and_cli_start_without_torch(tmp_path):
    from tests.results.samples import write_sample_db

    db, kf = write_sample_db(tmp_path)
    out = str(tmp_path / "site")
    got = fresh(f"""
        import contextlib, io
        from orchestrator.cli import main
        codes = []
        with contextlib.redirect_stdout(io.StringIO()):
            for argv in (["--help"], ["gate", "--db", {db!r}, "--baseline", "1", "--known-failures", {kf!r}],
                         ["report", "--db", {db!r}, "--format", "md"], ["report", "--db", {db!r}, "--format", "junit"],
                         ["dashboard", "--db", {db!r}, "--out", {out!r}]):
                codes.append(main(argv))
        OUT = codes
    """)
    assert got["heavy"] == [], got
    assert got["out"] == [0, 1, 1, 1, 0]  # the sample run fails its gate; report exits by it, dashboard 0


def test_outputs_and_the_writers_import_one_way():
    # outputs (the gathered view) is imported by the writers; it imports none of them, so
    # dashboard/build.py and outputs.py no longer import each other.
    got = fresh("""
        import sys
        import orchestrator.outputs
        before = sorted(m for m in sys.modules if m.startswith(("orchestrator.dashboard", "orchestrator.artifacts",
                                                                 "orchestrator.junit", "orchestrator.summary")))
        import orchestrator.artifacts
        OUT = before
    """)
    assert got["out"] == [] and got["heavy"] == []


def test_matrix_stages_import_one_way():
    import ast

    def imports(path):
        tree = ast.parse(open(os.path.join(REPO, path)).read())
        out = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module:
                out.add(n.module)
                out.update(f"{n.module}.{a.name}" for a in n.names)
            elif isinstance(n, ast.Import):
                out.update(a.name for a in n.names)
        return out

    tree, schema = imports("orchestrator/matrix_tree.py"), imports("orchestrator/matrix_schema.py")
    assert not {m for m in tree if "matrix" in m}, tree  # the tree knows no schema, no expansion
    assert "orchestrator.matrix_tree" in schema and not {m for m in schema if m.endswith((".matrix", "matrix_schema"))}
