"""Known-failures file: what it accepts, and every bad entry named by file:line."""

from __future__ import annotations

import pytest

from orchestrator.cli import main as cli_main
from orchestrator.errors import InputError
from orchestrator.known_failures import load, parse
from orchestrator.store import NewRun

GOOD = """\
# fp8 under FULL is tracked upstream
- case: "tp*-FULL-fp8-*"
  reason: fp8 KV wrong under FULL
  link: https://example.invalid/49010
  until: 2999-03-01
- case: tp1-NONE-auto-decode-torch-s0
  reason: flaky kernel
  link: https://example.invalid/7
  until: 2999-01-01
  mute: true
"""


def test_parses_entries_with_lines_and_globs():
    kf = parse(GOOD, "kf.yaml")
    assert [e.line for e in kf.entries] == [2, 6]
    assert [e.mute for e in kf.entries] == [False, True] and kf.entries[1].where == "kf.yaml:6"
    assert kf.match("tp2-FULL-fp8-mixed-torch-s0").reason == "fp8 KV wrong under FULL"
    assert kf.match("tp2-FULL-auto-mixed-torch-s0") is None
    assert kf.unused(["tp2-FULL-fp8-x"]) == (kf.entries[1],)


OK = "  link: https://example.invalid/1\n  until: 2999-01-01\n"  # what every entry needs besides case, reason
BAD = {
    "not a list": ("case: x\nreason: y\n", 1, "YAML list"),
    "entry not a mapping": ("- just a string\n", 1, "mapping"),
    "missing reason": ("- case: a\n  reason: b\n" + OK + "- case: c\n" + OK, 5, "missing 'reason'"),
    "missing link (the ticket)": ("- case: a\n  reason: b\n  until: 2999-01-01\n", 1, "missing 'link' (the ticket"),
    "missing until (the expiry)": (
        "- case: a\n  reason: b\n" + OK + "- case: c\n  reason: d\n  link: l\n",
        5,
        "missing 'until' (a date",
    ),
    "unknown key": ("- case: a\n  reason: b\n  reson: typo\n", 3, "unknown key 'reson'"),
    "empty case": ("- case: ''\n  reason: b\n" + OK, 1, "non-empty"),
    "bad date": ("- case: a\n  reason: b\n  link: l\n  until: next week\n", 4, "YYYY-MM-DD"),
    "mute not a boolean": ("- case: a\n  reason: b\n" + OK + "  mute: sometimes\n", 5, "'mute' must be true or false"),
    "list as reason": ("- case: a\n  reason: [x]\n" + OK, 2, "non-empty string"),
    "broken yaml": ("- case: a\n  reason: b\n - oops\n", 3, "invalid YAML"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_entries_name_file_and_line(name):
    text, line, words = BAD[name]
    with pytest.raises(InputError) as ei:
        parse(text, "kf.yaml")
    assert ei.value.one_line().startswith(f"kf.yaml:{line}: ") and words in ei.value.one_line()


def test_empty_file_means_no_entries(tmp_path):
    p = tmp_path / "kf.yaml"
    p.write_text("# nothing known yet\n")
    assert load(str(p)).entries == ()
    assert load(None) is None


def test_bad_file_through_the_cli_is_exit_2(tmp_path, capsys):
    from orchestrator.store import ResultStore
    from tests.results import samples

    db = str(tmp_path / "r.db")
    with ResultStore(db) as s:
        cases = samples.make_cases()
        rid = s.create_run(NewRun(matrix="m.yaml", cases=cases))
        s.record(rid, samples.result_for(cases[0]))
    kf = tmp_path / "kf.yaml"
    kf.write_text("- case: a\n  reason: b\n  bogus: c\n")
    assert cli_main(["gate", "--db", db, "--known-failures", str(kf)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"orch: {kf}:3: unknown key 'bogus' in known failure (allowed: case, reason, link, until, mute)"
    kf.write_text("- case: a\n  reason: b\n  link: https://example.invalid/1\n")
    assert cli_main(["gate", "--db", db, "--known-failures", str(kf)]) == 2
    assert capsys.readouterr().err.strip().startswith(f"orch: {kf}:1: known failure is missing 'until'")
    assert cli_main(["gate", "--db", db, "--known-failures", str(tmp_path / "missing.yaml")]) == 2
