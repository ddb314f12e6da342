"""A family from outside orch's tree, registered without editing backend/: the tiny mqa
family of plugin_mqa.py named by import path and run end to end on the session's Ray cluster (tp 1
and a tp 2 gang, the real checker, a broken provider red), and found by an `orch.families` entry
point of an installed distribution; a bad plugin is one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.cli import main
from orchestrator.store import ResultStore

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = os.path.join(REPO, "matrices", "smoke.yaml")
IMPL = "tests.families.plugin_mqa_impl"
MATRIX = f"""\
extends: {SMOKE}
name: mqa
axes:
  attention: [{{family}}]
  tp: [1, 2]
  cudagraph_mode: [NONE, FULL]
  kv_cache_dtype: [auto]
  batch: [mixed_small]
  backend: [{IMPL}:TorchMQA, {IMPL}:TorchMQAOffByOne, torch]
exclude: []
"""


def _matrix(tmp_path, family: str = "tests.families.plugin_mqa:SPEC") -> str:
    path = tmp_path / "mqa.yaml"
    path.write_text(MATRIX.format(family=family))
    return str(path)


@pytest.mark.xdist_group("ray")
def test_a_family_named_by_import_path_runs_end_to_end(ray_cluster, tmp_path, capsys):
    rc = main(["run", _matrix(tmp_path), "--devices", "cpu", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 1, out  # the off-by-one provider
    with ResultStore(os.environ["ORCH_DB"]) as s:
        results = {r.case_id: r for r in s.results(s.latest_run_id())}
    by_backend: dict[str, set] = {}
    for r in results.values():
        by_backend.setdefault(r.axes["backend"].rsplit(":", 1)[-1], set()).add(r.status.value)
    assert by_backend == {"TorchMQA": {"pass"}, "TorchMQAOffByOne": {"fail"}, "torch": {"skip"}}, results
    assert all(cid.startswith("mqa-tp") for cid in results) and len(results) == 12
    assert results["mqa-tp2-FULL-auto-mixed_small-TorchMQA-s0"].provider == "torch-mqa"  # a tp 2 gang
    assert results["mqa-tp1-FULL-auto-mixed_small-torch-s0"].reason == (
        "unsupported: torch does not implement the mqa attention family (it implements gqa, mla, swa_sinks, hybrid_gdn, mla_sparse)"
    )
    assert "reference check failed" in results["mqa-tp1-NONE-auto-mixed_small-TorchMQAOffByOne-s0"].reason
    # The family's name is its own from the file on: a filter selects it.
    assert (
        main(["plan", _matrix(tmp_path), "--devices", "cpu", "--filter", "attention=mqa backend=TorchMQA", "--json"])
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert {c["attention"] for c in plan["cases"]} == {"mqa"} and len(plan["cases"]) == 4


def test_a_family_found_by_an_entry_point(tmp_path):
    # An installed distribution as pip leaves one: its dist-info with an entry_points.txt.
    site = tmp_path / "site"
    info = site / "orch_mqa-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: orch-mqa\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[orch.families]\nmqa = tests.families.plugin_mqa:SPEC\n")
    matrix = _matrix(tmp_path, family="mqa")
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # e.g. a machine's wheels
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), REPO, *inherited])}

    def orch(*argv):
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", *argv],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    plan = orch("plan", matrix, "--devices", "cpu", "--json")
    assert plan.returncode == 0, plan.stderr
    ids = {c["id"] for c in json.loads(plan.stdout)["cases"]}
    assert "mqa-tp1-FULL-auto-mixed_small-TorchMQA-s0" in ids
    repro = orch("repro", "mqa-tp1-FULL-auto-mixed_small-TorchMQA-s0", "--matrix", matrix, "--devices", "cpu")
    assert repro.returncode == 0 and repro.stdout.startswith("PASS mqa-tp1-FULL-auto-mixed_small-TorchMQA-s0"), (
        repro.stdout + repro.stderr
    )
    # Without the distribution the name means nothing: one line naming the file.
    gone = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "plan", matrix, "--devices", "cpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1 and "unknown attention family 'mqa'" in gone.stderr


# (what the matrix names, what the one line says)
BAD = {
    "a module that does not import": ("tests.families.no_such_module:SPEC", "cannot load family plugin"),
    "an attribute that is not a FamilySpec": ("tests.families.plugin_mqa:_layout", "is not a FamilySpec"),
    "a plugin taking a builtin's name": ("backend.families.specs:GQA", "a builtin family's name"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_family_plugin_is_one_line_exit_2(tmp_path, capsys, name):
    family, words = BAD[name]
    matrix = _matrix(tmp_path, family=family)
    assert main(["plan", matrix, "--devices", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"orch: {matrix}:4: axes.attention[0]: ") and words in err, err
