"""Words that must agree with what happens: the help texts with the README's exit codes and with
what -v does, defaults as they are, the downgrade line naming the family, a run outside a git
checkout, the stdout lines docs/RESULTS.md shows."""

from __future__ import annotations

import os
import re

from orchestrator import digest
from orchestrator.cli import main
from orchestrator.store import ResultStore
from tests.results import samples

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(path: str) -> str:
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return f.read()


def _help(capsys, *argv) -> str:
    assert main([*argv, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())  # click wraps to the terminal: compare words


def test_exit_codes_in_help_are_the_readmes(capsys):
    readme = re.findall(r"^\| (\d+) \| ", _read("README.md"), re.MULTILINE)
    assert readme == ["0", "1", "2", "3", "130", "143"]
    top = _help(capsys)
    assert "nothing to judge" not in top and "1 gate failed (also: nothing ran, unless --allow-empty)" in top
    assert all(f"{code} " in top for code in readme)
    run = _help(capsys, "run")
    block = run[run.index("Exit codes:") : run.index("Examples:")]
    assert re.findall(r"\b(\d+) +[a-z]", block) == readme, block


def test_verbose_says_what_it_lists(capsys):
    assert "`-v` lists every\ncase that did not pass" in _read("README.md")
    assert "Every case that did not pass (fail, error, timeout, unverifiable, flaky, not-run)" in _help(capsys, "run")
    for command in ("gate", "report"):
        assert "Every case that did not pass on its own line" in _help(capsys, command)


def test_dashboard_default_out_reads_as_a_path(capsys):
    assert "[default: (ORCH_OUT/dashboard, else orch-out/dashboard)]" in _help(capsys, "dashboard")


def test_a_downgrade_names_the_family_of_its_providers():
    # mla's torch provider is UNIFORM_BATCH, gqa's ALWAYS: a line without the family read as a contradiction.
    assert digest.downgrade_lines(
        [("FULL", "FULL_AND_PIECEWISE", "torch", "mla"), ("FULL", "FULL_AND_PIECEWISE", "aiter-emulated", "mla")]
    ) == ["2 cases: FULL downgraded to FULL_AND_PIECEWISE for UNIFORM_BATCH mla backends (aiter-emulated, torch)"]


def test_a_run_outside_a_git_checkout_says_so(tmp_path, capsys, monkeypatch):
    from orchestrator.store import api

    monkeypatch.setattr(api, "_git_sha", lambda: "")
    db, _ = samples.write_sample_db(tmp_path)
    with ResultStore(db, readonly=True) as s:
        assert s.run(2).git_sha == ""
    main(["report", "--db", db, "--run", "2"])
    text = capsys.readouterr().out
    main(["report", "--db", db, "--run", "2", "--format", "md"])
    md = capsys.readouterr().out
    main(["diff", "1", "2", "--db", db])
    diff = capsys.readouterr().out
    assert "git=not a checkout" in text and "git: not a checkout" in md and "git not a checkout" in diff
    assert "git=?" not in text and "git: `?`" not in md and "git ?" not in diff


def test_results_doc_shows_stdout_without_the_stderr_prefix():
    # Only stderr's lines (progress, notes, warnings) start "orch: "; the run's conclusion does not.
    lines = [ln.strip() for ln in _read("docs/RESULTS.md").splitlines() if ln.startswith("    ")]
    stdout = re.compile(r"(run \d+|regression \d+|fail \d+|error \d+|baseline:|no baseline:|paste-ready|muted \d+)")
    assert not [ln for ln in lines if ln.startswith("orch: ") and stdout.match(ln[len("orch: ") :])]
    assert "    run 3: 30 ran (fail 2 pass 28)" in _read("docs/RESULTS.md")


def test_readme_says_how_long_and_the_virtual_environment_first():
    readme = _read("README.md")
    first_command = readme.index("    python3 -c 'import torch'")
    assert readme.index("virtual environment") < first_command
    assert "about 2 minutes" in readme[:first_command] and "about 10 minutes" in readme


def test_backends_guide_says_which_branches_are_caught():
    guide = _read("docs/BACKENDS.md")
    section = guide[guide.index("### Which host branches orch catches") : guide.index("## A minimal backend")]
    assert "passes green, by design" in section and "frozen_branch.py" in section
    assert all(m in section for m in ("seed_aiter_fa.py", "overstated_support.py", "host_sync.py"))
