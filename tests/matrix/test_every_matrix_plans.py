"""Every shipped matrix loads: `orch plan` exits 0 on it, and `orch run` gets past loading it, for a
CPU and a GPU plan, with vllm importable and with vllm hidden. A shipped matrix that no command could
load (vllm-families.yaml's `vllm:GDN_ATTN`, checked against vLLM's attention registry only, while
vLLM keeps GDN in its Mamba-type one) went unnoticed because nothing planned every file."""

from __future__ import annotations

import glob
import os

import pytest
import yaml

from orchestrator import known_failures
from orchestrator.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTHING = "no-case-id-has-this"  # an id substring: the run stops after loading, before any store or Ray


def _is_known_failures(path: str) -> bool:
    """A known-failures list (a YAML list the known-failures loader accepts) rather than a matrix."""
    with open(path) as f:
        doc = yaml.safe_load(f)
    return isinstance(doc, list) and bool(known_failures.load(path).entries)


SHIPPED = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "matrices", "*.yaml")))
MATRICES = [p for p in SHIPPED if not _is_known_failures(os.path.join(REPO, p))]
# Hiding vllm changes only what a `vllm:` backend resolves to: the matrices naming one load both ways
# (with vllm importable: skipped where it is not), the others with vllm as it is here, the same load.
NAMES_VLLM = [p for p in MATRICES if "vllm:" in open(os.path.join(REPO, p)).read()]
CASES = [(m, "vllm as here") for m in MATRICES if m not in NAMES_VLLM] + [
    (m, state) for m in NAMES_VLLM for state in ("vllm importable", "vllm hidden")
]


def test_the_shipped_files_are_matrices_or_known_failures():
    assert len(MATRICES) >= 7 and "matrices/vllm-families.yaml" in MATRICES
    assert set(SHIPPED) - set(MATRICES) == {"matrices/known-failures.yaml"}
    assert {"matrices/vllm.yaml", "matrices/vllm-families.yaml"} <= set(NAMES_VLLM)


@pytest.fixture
def vllm_state(request, monkeypatch):
    """vllm as this machine has it, or as on a machine without it (the adapter's own answer: the
    release it would import; tests/executor/test_first_day.py hides it the same way)."""
    from backend.adapters import vllm as adapter

    if request.param == "vllm importable":
        if adapter.current_interface()[0] is None:
            pytest.skip("vllm not usable here (docs/VLLM.md): the plan without it is the other param")
    elif request.param == "vllm hidden":
        monkeypatch.setattr(adapter, "installed_version", lambda: None)
    adapter.load_vllm_backend.cache_clear()
    adapter._make_backend.cache_clear()
    yield request.param
    adapter.load_vllm_backend.cache_clear()
    adapter._make_backend.cache_clear()


@pytest.mark.parametrize("devices", ["cpu", "gpu"])
@pytest.mark.parametrize(("matrix", "vllm_state"), CASES, indirect=["vllm_state"])
def test_every_shipped_matrix_plans_and_loads_for_a_run(matrix, devices, vllm_state, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["plan", matrix, "--devices", devices, "--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    # `orch run` loads the matrix as plan does; a filter no case id matches then stops it with the
    # one line that says the matrix itself was accepted.
    code = main(
        [
            "run",
            matrix,
            "--devices",
            devices,
            "--filter",
            NOTHING,
            "--db",
            str(tmp_path / "r.db"),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err
    assert (code, err) == (2, f"orch: {matrix}: no case matches --filter '{NOTHING}'\n")


@pytest.mark.vllm
def test_the_names_orch_knows_are_the_installed_vllm_registries():
    """Without vllm the `vllm:` names are checked against the names orch knows: vLLM 0.34.0's
    attention and Mamba-type registries, both (GDN_ATTN is in the second)."""
    from backend.adapters import vllm as adapter
    from backend.adapters.vllm import names

    if adapter.current_interface()[0] is None or adapter.installed_version() != "0.34.0":
        pytest.skip("needs vllm 0.34.0 importable (docs/VLLM.md)")
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, MambaAttentionBackendEnum

    assert tuple(AttentionBackendEnum.__members__) == names.ATTENTION_034
    assert tuple(MambaAttentionBackendEnum.__members__) == names.MAMBA_034
    assert set(names.registry()[0]) == set(names.KNOWN_034) and "GDN_ATTN" in names.KNOWN_034
