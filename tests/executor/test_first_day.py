"""A backend engineer's first day, each friction as the issue reproduced it, on the real CLI,
real SQLite and (where cases run) the session's Ray cluster: a run of nothing but skips is no
pass, and orch gate / orch report say the same; a misspelt vllm: name is bad input with the
closest name; --backend on a multi-family matrix skips what it cannot run, with the reason, for
every kind of backend; the run's conclusion on stdout and its progress on stderr; --resume writes
where the run did; and the README's two commands in order in a clean clone."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from junitparser import JUnitXml

from orchestrator.cli import main
from orchestrator.store import NewRun, ResultStore, RunOptions
from tests.results import samples

pytestmark = pytest.mark.xdist_group("ray")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = "matrices/smoke.yaml"
PASS_RUNNER = "tests.executor.faulty_backends:fault_runner"
SMALL = "attention=gqa tp=1 cudagraph_mode=NONE kv_cache_dtype=auto"
GPU_SKIP = "needs a CUDA/ROCm GPU (Triton)"


def _cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def no_vllm(monkeypatch):
    """vllm as on a machine without it (the adapter's own answer: the release it would import)."""
    from backend.adapters import vllm as adapter

    monkeypatch.setattr(adapter, "installed_version", lambda: None)
    adapter.load_vllm_backend.cache_clear()
    adapter._make_backend.cache_clear()
    yield
    adapter.load_vllm_backend.cache_clear()
    adapter._make_backend.cache_clear()


def _vllm_importable() -> bool:
    from backend.adapters import vllm as adapter

    return adapter.current_interface()[0] is not None


# --- 1. green on nothing ---------------------------------------------------------------------------

NOTHING_RAN = (
    f"gate FAILED: nothing ran: 89 skipped ({GPU_SKIP}: 75; unsupported: aiter-triton does not implement "
    "the hybrid_gdn attention family (it implements gqa, mla, swa_sinks): 10; unsupported: aiter-triton does "
    "not implement the mla_sparse attention family (it implements gqa, mla, swa_sinks): 4)"
)
# name: (extra `orch run` arguments, exit code of run / gate / report, the verdict they all print)
EMPTY = {
    "every case skipped: no pass": ((), 1, NOTHING_RAN),
    "--allow-empty: a pass that says so": (
        ("--allow-empty",),
        0,
        "gate PASSED (--allow-empty): nothing ran, 89 cases skipped",
    ),
}


@pytest.mark.parametrize("name", list(EMPTY))
def test_a_run_of_nothing_but_skips_and_every_command_that_judges_it(tmp_path, capsys, name):
    extra, code, verdict = EMPTY[name]
    db = str(tmp_path / "r.db")
    rc, out, _ = _cli(
        capsys,
        "run",
        SMOKE,
        "--backend",
        "aiter-triton",
        "--db",
        db,
        "--out",
        str(tmp_path / "o"),
        "--no-progress",
        *extra,
    )
    assert (rc, out.splitlines()[-1].split(" -> ")[1]) == (code, f"{verdict} (outputs in {tmp_path / 'o'})"), out
    for argv in (
        ["gate"],
        ["report"],
        ["report", "--format", "json"],
        ["report", "--format", "md"],
        ["report", "--format", "junit"],
    ):
        rc, out, _ = _cli(capsys, *argv, "--db", db)
        assert rc == code and verdict in out, (argv, out[-400:])
    junit = JUnitXml.fromfile(str(tmp_path / "o" / "junit.xml"))
    empty = [tc for suite in junit for tc in suite if tc.classname == "orch.gate"]
    assert [(tc.name, [r.type for r in tc.result]) for tc in empty] == ([("nothing ran", ["empty"])] if code else [])


def test_without_vllm_a_vllm_run_is_not_green(tmp_path, capsys, no_vllm):
    rc, out, _ = _cli(
        capsys,
        "run",
        "matrices/vllm.yaml",
        "--backend",
        "vllm:FLEX_ATTENTION",
        "--db",
        str(tmp_path / "r.db"),
        "--out",
        str(tmp_path / "o"),
        "--no-progress",
    )
    assert rc == 1 and "gate FAILED: nothing ran: 75 skipped (vllm is not installed (" in out, out


@pytest.mark.parametrize("require,code", [("backend=aiter-triton", 1), ("backend=torch", 0)])
def test_a_required_slice_must_have_run(ray_cluster, tmp_path, capsys, monkeypatch, require, code):
    monkeypatch.setenv("ORCH_RUNNER", PASS_RUNNER)
    db = str(tmp_path / "r.db")
    rc, out, _ = _cli(
        capsys,
        "run",
        "matrices/full.yaml",
        "--filter",
        "attention=gqa tp=1 mode=FULL kv=auto batch=decode_7",
        "--require",
        require,
        "--db",
        db,
        "--out",
        str(tmp_path / "o"),
        "--devices",
        "cpu",
        "--no-progress",
    )
    assert rc == code, out
    if code:
        assert re.search(
            rf"gate FAILED: required `{require}` did not run: \d+ skipped \({re.escape(GPU_SKIP)}: \d+\)", out
        )
    rc, out, _ = _cli(capsys, "gate", "--db", db)  # the run's --require is stored with it
    assert rc == code and ("did not run" in out) == bool(code)
    from orchestrator.matrix import load_matrix

    full = load_matrix("matrices/full.yaml", devices="cpu")
    total = len(full.cases) + len(full.skipped)  # the whole matrix, as the selection line counts it
    assert re.search(
        rf"^selection: \d+ of {total} cases, --filter 'attention=gqa tp=1 mode=FULL kv=auto batch=decode_7'$", out, re.M
    ), out


def test_a_bad_require_is_bad_input_before_anything_runs(tmp_path, capsys):
    rc, out, err = _cli(capsys, "run", SMOKE, "--require", "colour=red", "--db", str(tmp_path / "r.db"))
    assert rc == 2 and out == "" and err.startswith("orch: --require: unknown filter key 'colour'")
    assert not (tmp_path / "r.db").exists()


# --- 2. vllm: names are checked ------------------------------------------------------------------

# name: (backend, the closest name the line offers, or None)
NAMES = {
    "a name vLLM does not have": ("vllm:NOPE", None),
    "vLLM's enum is upper case": ("vllm:flex_attention", "vllm:FLEX_ATTENTION"),
    "a typo": ("vllm:TRITON_ATN", "vllm:TRITON_ATTN"),
}


def _check_names(capsys, name, whose):
    backend, close = NAMES[name]
    rc, out, err = _cli(capsys, "plan", "matrices/vllm.yaml", "--backend", backend, "--devices", "cpu")
    hint = f"did you mean {close}?" if close else "`orch doctor` lists the ones orch bridges"
    assert (rc, out) == (2, "")
    assert err == f"orch: --backend: {backend} is not an attention backend of {whose} ({hint})\n", err


@pytest.mark.parametrize("name", list(NAMES))
def test_a_vllm_name_vllm_does_not_have_is_exit_2_without_vllm(capsys, no_vllm, name):
    _check_names(capsys, name, "vLLM 0.34.0 (vllm is not importable here: the names orch knows)")


@pytest.mark.vllm
@pytest.mark.parametrize("name", list(NAMES))
def test_a_vllm_name_the_installed_vllm_does_not_have_is_exit_2(capsys, name):
    if not _vllm_importable():
        pytest.skip("vllm not usable here (docs/VLLM.md): the name check without it is the test above")
    from backend.adapters import vllm as adapter

    _check_names(capsys, name, f"vLLM {adapter.installed_version()}")


def test_a_misspelt_vllm_name_in_a_matrix_names_its_line(tmp_path, capsys, no_vllm):
    m = tmp_path / "m.yaml"
    m.write_text(
        f"extends: {os.path.join(REPO, 'matrices/vllm.yaml')}\nname: mine\naxes:\n"
        "  backend: [vllm:FLEX_ATTENTION, vllm:flex_attn]\n"
    )
    rc, _out, err = _cli(capsys, "plan", str(m), "--devices", "cpu")
    assert rc == 2 and err.startswith(f"orch: {m}:4: axes.backend[1]: vllm:flex_attn is not an attention backend")
    assert "did you mean vllm:FLEX_ATTENTION?" in err and err.count("\n") == 1


# --- 3. --backend on a multi-family matrix: skips with the reason, for every kind of backend -------

# name: (backend, {family: a words of its cases' skip reason})
OVERRIDES = {
    "builtin without the family": (
        "aiter-emulated",
        {"swa_sinks": "aiter-emulated does not implement the swa_sinks attention family"},
    ),
    "vllm: without sinks": (
        "vllm:FLEX_ATTENTION",
        {
            "swa_sinks": "vllm:FLEX_ATTENTION has no sinks, which the swa_sinks model asks for",
            "mla": "vllm:FLEX_ATTENTION is not bridged for the mla family",
        },
    ),
    "plugin of another family": (
        "tests.mutants.frozen_branch:Backend",
        {
            "mla": "Backend implements the gqa attention family, not mla",
            "swa_sinks": "Backend implements the gqa attention family, not swa_sinks",
        },
    ),
    "plugin without sinks": (
        "tests.matrix.plugins:NoSinksBackend",
        {
            "swa_sinks": "tests.matrix.plugins:NoSinksBackend has no sinks",
            "gqa": "NoSinksBackend implements the swa_sinks attention family, not gqa",
        },
    ),
}


def _plan(capsys, *argv) -> dict:
    rc, out, err = _cli(capsys, "plan", SMOKE, "--devices", "cpu", "--json", *argv)
    assert rc == 0, err
    return json.loads(out)


@pytest.mark.parametrize("name", list(OVERRIDES))
def test_a_backend_override_skips_what_it_cannot_run_with_the_reason(capsys, no_vllm, name):
    backend, why = OVERRIDES[name]
    if backend.startswith("vllm:") and importlib.util.find_spec("vllm") is None:  # no_vllm hides only the release
        pytest.skip("vllm not usable here (docs/VLLM.md): whether a vLLM class has sinks is the class's answer")
    plan = _plan(capsys, "--backend", backend)
    for family, words in why.items():
        reasons = {
            s["reason"] for s in plan["skipped"] if s["id"].startswith(f"{family}-" if family != "gqa" else "tp")
        }
        assert reasons and all(words in r for r in reasons), (family, reasons)
    # --filter decides which families are asked: one of them alone has none of those reasons.
    family = next(f for f in ("gqa", "mla", "swa_sinks") if f not in why)
    plan = _plan(capsys, "--backend", backend, "--filter", f"attention={family}")
    assert not [s for s in plan["skipped"] if any(w in s["reason"] for w in why.values())]


# --- 7. output ---------------------------------------------------------------------------------------


def test_the_conclusion_on_stdout_progress_and_notes_on_stderr(ray_cluster, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ORCH_RUNNER", PASS_RUNNER)
    args = [
        "run",
        SMOKE,
        "--filter",
        SMALL,
        "--db",
        str(tmp_path / "r.db"),
        "--out",
        str(tmp_path / "o"),
        "--devices",
        "cpu",
    ]
    rc, out, err = _cli(capsys, *args)
    assert rc == 0
    lines = out.splitlines()
    assert lines[-1].startswith(f"run 1 (5 of 104 cases, --filter '{SMALL}'): 5 ran (pass 5), 0 skipped, ") and lines[
        -1
    ].endswith(f"-> gate PASSED: 5 ran (5 pass), no new failures (outputs in {tmp_path / 'o'})"), lines
    assert re.fullmatch(
        r"time: load matrix [\d.]+s, start cluster [\d.]+s, start to first result [\d.]+s, "
        r"first to last result [\d.]+s, shutdown [\d.]+s, write outputs [\d.]+s",
        lines[-2],
    ), lines
    assert all(ln.startswith("orch: ") for ln in err.splitlines()) and re.search(r"^orch: \d+/5 \(", err, re.M)
    rc, _, err = _cli(capsys, *args, "--no-progress")
    assert rc == 0 and not re.search(r"^orch: \d+/5 \(", err, re.M), err  # no progress at all
    summary = (tmp_path / "o" / "summary.md").read_text()
    assert (
        f"Selection: 5 of 104 cases, --filter &#x27;{SMALL}&#x27;" in summary
        or f"Selection: 5 of 104 cases, --filter '{SMALL}'" in summary
    ), summary[:600]


def test_resume_writes_into_the_runs_own_out(ray_cluster, tmp_path, capsys, monkeypatch):
    from orchestrator.filters import select
    from orchestrator.matrix import load_matrix

    monkeypatch.setenv("ORCH_RUNNER", PASS_RUNNER)
    db, first = str(tmp_path / "r.db"), tmp_path / "first-out"
    cases = select(load_matrix(SMOKE, devices="cpu").cases, SMALL)
    with ResultStore(db) as s:
        rid = s.create_run(
            NewRun(matrix=SMOKE, cases=cases, options=RunOptions(out=str(first), filter=SMALL, matrix_cases=90))
        )
        s.record(rid, samples.result_for(cases[0]))
        s.finish_run(rid, "interrupted")
    rc, out, _ = _cli(capsys, "run", "--resume", str(rid), "--db", db, "--devices", "cpu", "--no-progress")
    assert rc == 0 and out.splitlines()[-1].endswith(f"(outputs in {first})"), out
    assert (first / "summary.md").read_text().startswith(f"## ✅ orch run {rid} — `{SMOKE}`\n")
    assert not os.path.exists(os.environ["ORCH_OUT"])  # the default folder stayed untouched


# --- 4. the README's two commands, in order, in a clean clone ------------------------------------


def _readme_commands() -> list[str]:
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    return re.findall(r"^    (python3 -c 'import torch'.*)$", text, re.M)


def test_the_readmes_two_commands_in_order_in_a_clean_clone(ray_cluster, tmp_path):
    """The main job leaves orch-results.db and orch-out/ in the checkout; the tests that run
    orch's commands with their default paths must not read them (the third `orch plan` once
    of test_plan_estimates_the_wall_time_on_the_workers_apart_from_the_sum did). Cheap: the main
    job on a slice of full.yaml (the same command, on the session cluster), then the tests of the
    CLI's contract, in a copy of the tracked tree."""
    main_job, tests = _readme_commands()
    assert main_job.endswith("pip install -e . && orch run matrices/full.yaml")
    assert tests.endswith("pip install -e '.[test]' && python -m pytest -n 2 --dist loadgroup")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", REPO, str(clone)], check=True, timeout=120)
    # ... as this checkout's tree is now (what is committed, and what is not yet).
    changed = subprocess.run(
        ["git", "ls-files", "-mo", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for f in changed:
        if os.path.isfile(os.path.join(REPO, f)):
            os.makedirs(clone / os.path.dirname(f), exist_ok=True)
            shutil.copy2(os.path.join(REPO, f), clone / f)
    # A fresh shell: no ORCH_DB / ORCH_OUT (this session's fixture sets them).
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ORCH_DB", "ORCH_OUT", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_CURRENT_TEST")
    }
    address = ray_cluster.get_runtime_context().gcs_address
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            "matrices/full.yaml",
            "--filter",
            "attention=gqa tp=1 mode=NONE kv=auto batch=decode_7 backend=torch",
            "--address",
            address,
            "--devices",
            "cpu",
            "--no-progress",
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert job.returncode == 0, job.stdout[-1000:] + job.stderr[-1000:]
    assert (clone / "orch-results.db").is_file() and (clone / "orch-out" / "summary.md").is_file()
    suite = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "tests/results/test_cli_contract.py",
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert suite.returncode == 0, suite.stdout[-3000:]
