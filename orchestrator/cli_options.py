"""The options and help texts several `orch` commands share (orchestrator/cli.py), so that one
option reads the same in every command's --help (every option has help text).
"""

from __future__ import annotations

import click

from orchestrator.defaults import DB_SHOWN, OUT, OUT_ENV

MATRIX_PATH = click.Path(dir_okay=False)
DASHBOARD_SHOWN = f"{OUT_ENV}/dashboard, else {OUT}/dashboard"  # orch dashboard's --out (defaults.dashboard_out)
# Options several commands share, with one wording (every option has help text).
DB_HELP = "Results store to read: a SQLite file or a postgresql:// URL."
RUN_HELP = "Run: an id in --db, or a label (its latest finished run) [default: the latest run]."
JUDGED_HELP = " [default: what the run was judged with]"
BASELINE_HELP = (
    "Gate against a baseline: a run id in --db, a label (the latest finished run so labelled, same "
    "matrix), another store (its latest run), or STORE#RUN / STORE#LABEL."
)
KNOWN_HELP = "YAML of known failures (case-id glob, reason, link, until, optional mute): matching failures do not gate."
NO_KNOWN_HELP = "Apply no known-failures file."
NO_BASELINE_HELP = "Gate without a baseline."
WINDOW_HELP = "Runs of history (the baseline's label, else the run's) that score each case's flakiness [default: 20]."
THRESHOLD_HELP = "A failing case whose flakiness score (0-1) over the window is above this is flaky, not gating."
VERBOSE_HELP = "Every case that did not pass on its own line (default: one line per kind, with a count and a few ids)."
REQUIRE_HELP = (
    "A slice that must have run (the --filter language; repeatable): the gate fails when no case of it "
    "ran, e.g. --require backend=aiter-triton on a GPU runner."
)
ALLOW_EMPTY_HELP = "Let a run in which nothing ran pass (by default it fails: every case skipped is not a pass)."


def db_option(help_text: str):
    # default None: the command takes $ORCH_DB, else orch-results.db (orchestrator/defaults.py)
    return click.option("--db", default=None, show_default=DB_SHOWN, help=help_text)


def devices_option(help_text: str):
    return click.option(
        "--devices", type=click.Choice(["auto", "cpu", "gpu"]), default="auto", show_default=True, help=help_text
    )


def no_known_option(f):
    return click.option("--no-known-failures", "no_known_failures", is_flag=True, help=NO_KNOWN_HELP)(f)


def judged_options(f):
    """--no-baseline and --no-known-failures: a stored run's own turned off."""
    f = no_known_option(f)
    return click.option("--no-baseline", "no_baseline", is_flag=True, help=NO_BASELINE_HELP)(f)


def flaky_options(f, judged: bool = False):
    """judged: for a stored run, whose own window and threshold apply unless given."""
    window = WINDOW_HELP.replace(" [default: 20].", "." + JUDGED_HELP) if judged else WINDOW_HELP
    threshold = THRESHOLD_HELP + (JUDGED_HELP if judged else "")
    f = click.option("--flaky-threshold", "flaky_threshold", type=float, default=None, help=threshold)(f)
    return click.option("--flaky-window", "flaky_window", type=int, default=None, help=window)(f)


def judged_flaky_options(f):
    return flaky_options(f, judged=True)


ALLOW_UNVERIFIABLE_HELP = (
    "Do not fail the gate on unverifiable cases (the CPU emulation saw the replay disagree on "
    "graphs it cannot follow); they are still listed: run them on a GPU to decide."
)
