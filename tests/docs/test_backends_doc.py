"""docs/BACKENDS.md's minimal backend, run exactly as printed: its code block is written to a
module of its own and its `orch run` command run on the session's Ray cluster with the real
checker; then the two ways the doc says to break it turn the cells it names red."""

from __future__ import annotations

import os
import re
import shlex

import pytest

from orchestrator.cli import main
from orchestrator.store import ResultStore

pytestmark = pytest.mark.xdist_group("ray")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "BACKENDS.md")


def _section(title: str) -> str:
    text = open(DOC, encoding="utf-8").read()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def printed_backend() -> str:
    return re.search(r"```python\n(.*?)```", _section("A minimal backend"), re.S).group(1)


def printed_command() -> list[str]:
    return shlex.split(re.search(r"```sh\n(.*?)\n```", _section("A minimal backend"), re.S).group(1))


def _run(tmp_path, monkeypatch, capsys, code: str, *extra: str, module: str = "mybackend"):
    """The doc's `orch run`, from a folder holding the module (as the doc says to save it): the
    matrix path made absolute, on CPU workers of the session cluster."""
    (tmp_path / f"{module}.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    argv = [os.path.join(REPO, a) if a.startswith("matrices/") else a for a in printed_command()[1:]]
    argv = [a.replace("mybackend:", f"{module}:") for a in argv]
    rc = main([*argv, *extra, "--devices", "cpu", "--no-progress"])
    out = capsys.readouterr().out
    with ResultStore(os.environ["ORCH_DB"]) as s:
        results = {r.case_id: r for r in s.results(s.latest_run_id())}
    return rc, out, results


def test_the_minimal_backend_is_about_30_lines_and_complete():
    code = printed_backend()
    assert len(code.splitlines()) <= 40
    assert printed_command()[:2] == ["orch", "run"] and "--backend" in printed_command()


def test_the_printed_backend_passes_every_mode(ray_cluster, tmp_path, monkeypatch, capsys):
    rc, out, results = _run(tmp_path, monkeypatch, capsys, printed_backend())
    assert rc == 0, out
    assert len(results) == 15 and {r.status.value for r in results.values()} == {"pass"}
    assert {r.provider for r in results.values()} == {"mine"}
    assert {r.axes["cudagraph_mode"] for r in results.values()} == {
        "NONE",
        "PIECEWISE",
        "FULL",
        "FULL_DECODE_ONLY",
        "FULL_AND_PIECEWISE",
    }
    assert "15 of 89 cases, --filter 'attention=gqa tp=1 kv=auto', --backend mybackend:MyBackend" in out


# (what the doc says to break, the edit, expected status per mode of decode_7)
BROKEN = {
    "a host sync in forward": (
        ("qsl = metadata.query_start_loc.long()", "qsl = torch.tensor(metadata.query_start_loc.tolist(), device=dev)"),
        {
            "NONE": "pass",
            "PIECEWISE": "pass",
            "FULL": "error",
            "FULL_DECODE_ONLY": "error",
            "FULL_AND_PIECEWISE": "error",
        },
        (
            "capture error (mybroken.py, line {line}, in forward)",  # the edited line of the sample
            "host sync during graph capture: `.tolist()`: a host read of a device tensor",
        ),
    ),
    "the causal mask off by one": (
        ("keys[None, :] <= (seq", "keys[None, :] < (seq"),
        {m: "fail" for m in ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")},
        ("reference check failed",),
    ),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_breaking_it_as_the_doc_says_turns_the_cells_it_names_red(ray_cluster, tmp_path, monkeypatch, capsys, name):
    (old, new), expected, words = BROKEN[name]
    code = printed_backend()
    assert old in code
    rc, _, results = _run(
        tmp_path,
        monkeypatch,
        capsys,
        code.replace(old, new),
        "--filter",
        "attention=gqa tp=1 kv=auto batch=decode_7",
        module="mybroken",
    )
    assert rc == 1
    assert {r.axes["cudagraph_mode"]: r.status.value for r in results.values()} == expected
    line = next(i for i, text in enumerate(code.splitlines(), 1) if old in text)
    words = tuple(w.format(line=line) for w in words)
    assert all(w in r.reason for r in results.values() if r.status.value != "pass" for w in words)
