"""Muted cases (a known-failures entry with `mute: true`) are listed, with their own status and
their entry, in every text output: `orch run`'s last lines, `orch gate` (every one with -v),
`orch report`, summary.md (a section of their own)."""

from __future__ import annotations

from orchestrator.cli import main
from orchestrator.judging import Judging
from orchestrator.outputs import gather
from orchestrator.run_output import last_lines
from orchestrator.store import ResultStore
from tests.results import samples

# The sample run's new failure (an error), a passing case and a third, both passing.
MUTED = (
    samples.NEW_FAILURE,
    "tp1-NONE-auto-decode4-torch-s0",
    "tp1-NONE-auto-mixed-torch-s0",
    "tp1-PIECEWISE-auto-decode4-torch-s0",
)
GLOB = "tp1-NONE-auto-*"


def _kf(tmp_path) -> str:
    path = tmp_path / "muted.yaml"
    path.write_text(
        f'- case: "{samples.NEW_FAILURE}"\n  reason: flips\n  link: https://example.invalid/7\n'
        f"  until: 2999-01-31\n  mute: true\n"
        f'- case: "{GLOB}"\n  reason: noisy\n  link: https://example.invalid/8\n'
        f"  until: 2999-02-28\n  mute: true\n"
        f'- case: "tp1-PIECEWISE-auto-decode4-*"\n  reason: noisy\n  link: https://example.invalid/8\n'
        f"  until: 2999-02-28\n  mute: true\n"
    )
    return str(path)


def test_run_gate_and_report_name_the_muted_cases(tmp_path, capsys):
    db, _ = samples.write_sample_db(tmp_path)
    kf = _kf(tmp_path)
    with ResultStore(db, readonly=True) as s:
        view = gather(s, 2, Judging(known_failures=kf))
    lines, _ = last_lines(view, verbose=False)
    muted = [ln for ln in lines if ln.startswith("muted ")]
    assert muted == [
        f"muted 1 by {kf}:1 (until 2999-01-31, https://example.invalid/7; not gating): {samples.NEW_FAILURE} (error)",
        (
            f"muted 2 by {kf}:6 (until 2999-02-28, https://example.invalid/8; not gating): "
            f"tp1-NONE-auto-decode4-torch-s0 (pass), tp1-NONE-auto-mixed-torch-s0 (pass)"
        ),
        (
            f"muted 1 by {kf}:11 (until 2999-02-28, https://example.invalid/8; not gating): "
            f"tp1-PIECEWISE-auto-decode4-torch-s0 (pass)"
        ),
    ], lines

    main(["gate", "--db", db, "--run", "2", "--known-failures", kf, "-v"])
    out = capsys.readouterr().out
    assert all(cid in out for cid in MUTED) and f"{samples.NEW_FAILURE} (error)" in out

    main(["report", "--db", db, "--run", "2", "--known-failures", kf])
    out = capsys.readouterr().out
    assert "muted: 4" in out and all(cid in out for cid in MUTED), out


def test_gate_samples_muted_cases_and_v_lists_every_one(tmp_path, capsys):
    db, _ = samples.write_sample_db(tmp_path)
    kf = tmp_path / "all.yaml"
    kf.write_text(
        '- case: "tp1-*"\n  reason: r\n  link: https://example.invalid/1\n  until: 2999-01-01\n  mute: true\n'
    )
    main(["gate", "--db", db, "--run", "2", "--known-failures", str(kf)])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("muted "))
    assert line.startswith(f"muted 16 by {kf}:1 ") and line.endswith(" and 13 more"), line
    main(["gate", "--db", db, "--run", "2", "--known-failures", str(kf), "-v"])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("muted "))
    assert line.count("tp1-") == 16 and "more" not in line


def test_summary_has_a_muted_section(tmp_path, capsys):
    db, _ = samples.write_sample_db(tmp_path)
    main(["report", "--db", db, "--run", "2", "--known-failures", _kf(tmp_path), "--format", "md"])
    md = capsys.readouterr().out
    section = md.split("### Muted (not gating) (4)", 1)[1].split("\n### ", 1)[0]
    assert all(f"`{cid}`" in section for cid in MUTED)
    assert "(muted, its status error; flips, https://example.invalid/7, until 2999-01-31)" in section
