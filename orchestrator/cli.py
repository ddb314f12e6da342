"""`orch` command line. A stable contract: options and exit codes here are what CI scripts rely on.

Each command parses its options with click and hands them to `orchestrator.commands.<name>.main`,
imported lazily so `orch --help` stays fast and torch/Ray load only for commands that need them.
Known errors (OrchError) become one line on stderr and their exit code; anything else is a bug and
is shown as one line too, with the traceback only under ORCH_DEBUG=1.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import click

from orchestrator import __version__
from orchestrator.cli_options import (
    ALLOW_EMPTY_HELP,
    ALLOW_UNVERIFIABLE_HELP,
    BASELINE_HELP,
    DASHBOARD_SHOWN,
    DB_HELP,
    JUDGED_HELP,
    KNOWN_HELP,
    MATRIX_PATH,
    REQUIRE_HELP,
    RUN_HELP,
    VERBOSE_HELP,
    db_option,
    devices_option,
    flaky_options,
    judged_flaky_options,
    judged_options,
    no_known_option,
)
from orchestrator.defaults import OUT_SHOWN
from orchestrator.errors import ExitCode, OrchError


def _dispatch(command: str, **kwargs) -> None:
    module = importlib.import_module(f"orchestrator.commands.{command}")
    code = module.main(**kwargs)
    raise SystemExit(int(code or 0))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="orch")
def cli() -> None:
    """Gate attention-backend changes on graph capture: run a matrix of tp x cudagraph mode x
    kv dtype x batch shape on every GPU of a Ray cluster and check graph replay against eager
    and eager against an independent reference.

    \b
    Exit codes: 0 gate passed, 1 gate failed (also: nothing ran, unless --allow-empty),
    2 bad input or usage, 3 infrastructure error, 130 interrupted (SIGINT), 143 terminated
    (SIGTERM). Commands that print no verdict exit 0 when they did their job.
    """


@cli.command()
@click.argument("matrix", type=MATRIX_PATH)
@click.option(
    "--filter",
    "filter_expr",
    default=None,
    help="Select cases: substring/glob of the case id, or axis=value[,value] terms joined by spaces.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@devices_option("Device class whose model shape to use.")
@click.option("--backend", default=None, help="Override the backend axis, as `orch run --backend` does.")
@click.option(
    "--workers",
    type=int,
    default=None,
    help="Workers to estimate the wall time for (default: what `orch run` would start here).",
)
@db_option("Results store whose past durations calibrate the estimate (read only; skipped if absent).")
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="List every case (id, k, resolved mode, estimate) and every skipped case with its reason.",
)
def plan(**kwargs):
    """Expand MATRIX: how many cases run and which skip (grouped by reason), counts per axis, mode
    downgrades, and the expected wall time on the workers `orch run` would start here.

    \b
    Examples:
      orch plan matrices/smoke.yaml
      orch plan matrices/full.yaml --filter 'tp=2 cudagraph_mode=FULL' -v
      orch plan matrices/full.yaml --json
    """
    _dispatch("plan", **kwargs)


@cli.command()
@click.argument("matrix", type=MATRIX_PATH, required=False)
@click.option("--backend", default=None, help="Override the backend axis: a provider name or package.module:Class.")
@click.option("--filter", "filter_expr", default=None, help="Select cases (see `orch plan --help`).")
@db_option("Results store: a SQLite file, or a postgresql://USER:PASSWORD@HOST/DB URL shared by many drivers.")
@click.option(
    "--label",
    default=None,
    help="Name this run's line of history (e.g. the branch): `--baseline LABEL` and the flakiness window find runs by it.",
)
@click.option(
    "--out",
    "out_dir",
    default=None,
    show_default=OUT_SHOWN,
    help="Directory for JUnit, summary and dashboard (--resume: the run's own).",
)
@click.option(
    "--address",
    default="local",
    show_default=True,
    help="local (embedded Ray), auto (RAY_ADDRESS / running cluster) or HOST:PORT.",
)
@devices_option("auto: GPUs if any, else CPU workers with emulated graphs.")
@click.option(
    "--workers",
    type=int,
    default=None,
    help="Worker processes (default: one per GPU; without GPUs one per CPU core but at least the "
    "largest tp of the matrix, with no more ranks running at once than cores).",
)
@click.option(
    "--timeout", "timeout_s", type=float, default=None, help="Per-case deadline in seconds (overrides the matrix)."
)
@click.option("--junit", "junit_path", default=None, help="Write JUnit XML here (default OUT/junit.xml).")
@click.option(
    "--summary",
    "summary_path",
    default=None,
    help="Write a markdown summary here (default OUT/summary.md; also $GITHUB_STEP_SUMMARY).",
)
@click.option("--baseline", default=None, help=BASELINE_HELP)
@click.option(
    "--known-failures",
    "known_failures",
    default=None,
    help=KNOWN_HELP + " [default: the file the matrix names (`known_failures:`)]",
)
@no_known_option
@flaky_options
@click.option(
    "--max-gpus",
    "max_gpus",
    type=int,
    default=None,
    help="At most this many GPUs for this run on a cluster other drivers share (workers where it has no GPU); tp larger than it is skipped.",
)
@click.option("--allow-unverifiable", "allow_unverifiable", is_flag=True, help=ALLOW_UNVERIFIABLE_HELP)
@click.option(
    "--resume",
    "resume_run",
    default=None,
    metavar="RUN_ID",
    help="Finish run RUN_ID from its own plan: only the cases without a verdict. MATRIX may be left out; given, it must be the run's.",
)
@click.option(
    "--no-progress", is_flag=True, help="No progress lines (the bar on a terminal, a line per 10% elsewhere)."
)
@click.option("--require", "require", multiple=True, metavar="FILTER", help=REQUIRE_HELP)
@click.option("--allow-empty", "allow_empty", is_flag=True, help=ALLOW_EMPTY_HELP)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Every case that did not pass (fail, error, timeout, unverifiable, flaky, not-run) with its reason "
    "and repro at the end, instead of one line per kind; and Ray's own log lines.",
)
@click.option(
    "--workers-per-gpu",
    "workers_per_gpu",
    default="auto",
    show_default=True,
    metavar="N|auto",
    help="Workers sharing each GPU (Ray fractional GPUs, each within its memory budget); auto: as many as "
    "the cases' recorded memory needs and the host's cores allow, at most 2, 1 while the store has none "
    "(docs/EXECUTION.md, GPU memory).",
)
@click.option(
    "--gpu-memory-utilization",
    "gpu_memory_utilization",
    type=float,
    default=0.9,
    show_default=True,
    help="Fraction of its share of the GPU a worker may use, as vLLM's option of that name.",
)
@click.option(
    "--gpu-memory",
    "gpu_memory",
    default=None,
    metavar="GIB",
    help="Treat each GPU as having this much memory (e.g. 24, to behave like a 24 GiB card); default: its real size.",
)
@click.option(
    "--precompile-jobs",
    "precompile_jobs",
    type=int,
    default=None,
    help="Helper processes that warm Triton's kernel cache at the start of a local GPU run (0: off; default ORCH_PRECOMPILE_JOBS, else 1 when the run has cases of other backends to run meanwhile, up to 3 when not).",
)
def run(**kwargs):
    """Run MATRIX on Ray and gate on the results.

    \b
    Exit codes:
      0    gate passed
      1    gate failed: a case failed, regressed or has no result; nothing ran (unless
           --allow-empty); a --require'd slice did not run; a case is unverifiable
      2    bad input or usage (one line naming the file or option)
      3    infrastructure: cluster unreachable, store unwritable, a case out of memory alone
      130  interrupted (Ctrl-C): the outputs are written marked INTERRUPTED
      143  terminated (SIGTERM): as 130

    \b
    Examples:
      orch run matrices/smoke.yaml
      orch run matrices/full.yaml --address auto --junit junit.xml
      orch run matrices/full.yaml --backend mypkg.attn:MyBackend --filter 'cudagraph_mode=FULL'
      orch run matrices/full.yaml --db postgresql://ci@db/orch --label pr-123 --baseline main
      orch run --resume 3
    """
    _dispatch("run", **kwargs)


@cli.command()
@click.argument("case_id")
@click.option(
    "--matrix", type=MATRIX_PATH, default=None, help="Matrix the case comes from (default: looked up in --db)."
)
@click.option("--backend", default=None, help="Override the backend: a provider name or package.module:Class.")
@db_option("Results store to look the case up in when --matrix is not given.")
@click.option(
    "--run",
    "run_id",
    default=None,
    help="Look the case up in this run of --db: an id or a label (its latest finished run) [default: the latest run that has it].",
)
@devices_option("auto: the first GPU if any, else CPU with emulated graphs.")
@click.option("--json", "as_json", is_flag=True, help="The CaseResult as JSON.")
def repro(**kwargs):
    """Re-run one case in this process (tp > 1: a local gang of processes) and print its verdict.

    \b
    Example:
      orch repro tp1-FULL-auto-mixed_small-torch-s0 --matrix matrices/smoke.yaml
    """
    _dispatch("repro", **kwargs)


@cli.command()
@db_option(DB_HELP)
@click.option(
    "--run",
    "run_id",
    default=None,
    help=RUN_HELP[: -len(" [default: the latest run].")] + " [default: with --output into a run's out dir, "
    "that run; else the latest].",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "md", "junit"]),
    default="text",
    show_default=True,
    help="text: for a terminal or CI log; json: everything; md: the CI summary; junit: JUnit XML.",
)
@click.option("--baseline", default=None, help=BASELINE_HELP + JUDGED_HELP)
@click.option("--known-failures", "known_failures", default=None, help=KNOWN_HELP + JUDGED_HELP)
@judged_options
@judged_flaky_options
@click.option("--allow-unverifiable", "allow_unverifiable", is_flag=True, help=ALLOW_UNVERIFIABLE_HELP)
@click.option("--output", "-o", default=None, help="Write to a file instead of stdout.")
@click.option("--require", "require", multiple=True, metavar="FILTER", help=REQUIRE_HELP + " Adds to the run's own.")
@click.option("--allow-empty", "allow_empty", is_flag=True, help=ALLOW_EMPTY_HELP + " The run's own is kept.")
@click.option("-v", "--verbose", is_flag=True, help=VERBOSE_HELP)
def report(**kwargs):
    """Report a run from the store; exit by its gate (0 passed, 1 failed).

    \b
    Example:
      orch report --format md --baseline 1
    """
    _dispatch("report", **kwargs)


@cli.command()
@db_option(DB_HELP)
@click.option("--run", "run_id", default=None, help=RUN_HELP)
@click.option("--baseline", default=None, help=BASELINE_HELP + JUDGED_HELP)
@click.option("--known-failures", "known_failures", default=None, help=KNOWN_HELP + JUDGED_HELP)
@judged_options
@judged_flaky_options
@click.option("--require", "require", multiple=True, metavar="FILTER", help=REQUIRE_HELP + " Adds to the run's own.")
@click.option("--allow-empty", "allow_empty", is_flag=True, help=ALLOW_EMPTY_HELP + " The run's own is kept.")
@click.option("--allow-unverifiable", "allow_unverifiable", is_flag=True, help=ALLOW_UNVERIFIABLE_HELP)
@click.option("-v", "--verbose", is_flag=True, help=VERBOSE_HELP)
def gate(**kwargs):
    """Recompute the gate for a run from the store; exit 0 (passed) or 1 (failed). The run is judged
    with what judged it when it ran (baseline, known failures, flakiness, --require, --allow-*)
    unless an option here says otherwise. New failures come with paste-ready known-failures
    entries, narrowed to the axes that failed.

    \b
    Examples:
      orch gate --run pr-123
      orch gate --run 4 --baseline 3 --known-failures known-failures.yaml
      orch gate --baseline main --flaky-window 20 --flaky-threshold 0.3
    """
    _dispatch("gate", **kwargs)


@cli.command()
@db_option(DB_HELP)
@click.option(
    "--run",
    "run_id",
    default=None,
    help=RUN_HELP[: -len(" [default: the latest run].")] + " [default: the run whose outputs --out holds, "
    "else the latest].",
)
@click.option("--baseline", default=None, help=BASELINE_HELP + JUDGED_HELP)
@click.option("--known-failures", "known_failures", default=None, help=KNOWN_HELP + JUDGED_HELP)
@judged_options
@click.option("--allow-unverifiable", "allow_unverifiable", is_flag=True, help=ALLOW_UNVERIFIABLE_HELP)
@click.option(
    "--out", "out_dir", default=None, show_default=DASHBOARD_SHOWN, help="Directory to write index.html into."
)
def dashboard(**kwargs):
    """Write the self-contained static dashboard (opens from disk; a CI artifact). Exit 0 when
    written, whatever the run's verdict (the page shows it; `orch gate` exits by it).

    \b
    Example:
      orch dashboard --out site/ && xdg-open site/index.html
    """
    _dispatch("dashboard", **kwargs)


@cli.command()
@db_option(DB_HELP)
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback: this machine only)."
)
@click.option("--port", type=int, default=8265 + 1000, show_default=True, help="Port to listen on.")
@click.option("--baseline", default=None, help=BASELINE_HELP)
@click.option("--known-failures", "known_failures", default=None, help=KNOWN_HELP)
def serve(**kwargs):
    """Serve the dashboard from the store, refreshing live during a run.

    \b
    Example:
      orch serve --port 9265
    """
    _dispatch("serve", **kwargs)


@cli.command()
@click.argument("run_a")
@click.argument("run_b")
@db_option("Store the runs are in unless named (STORE#RUN).")
@click.option("--checks", is_flag=True, help="Also compare each check's pass/fail (not its numbers).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("-v", "--verbose", is_flag=True, help="Every changed case on its own line.")
def diff(**kwargs):
    """Which verdicts changed from RUN_A to RUN_B, grouped by transition (pass -> fail, ...) and by
    axis, with both runs' versions side by side. Exit 1 when a case regressed (passed in RUN_A,
    fails in RUN_B), else 0.

    \b
    A run is: an id (in --db), a label (its latest finished run), a store (its latest run),
    or STORE#ID / STORE#LABEL, where STORE is a SQLite file or a postgresql:// URL.
    Examples:
      orch diff 3 4
      orch diff main pr-123 --db postgresql://ci@db/orch
      orch diff old.db new.db#7 --checks
    """
    _dispatch("diff", **kwargs)


@cli.command()
@click.option("--gpus", type=int, default=512, show_default=True, help="GPUs in all.")
@click.option("--nodes", type=int, default=64, show_default=True, help="Nodes the GPUs are spread over (evenly).")
@click.option("--cases", type=int, default=20000, show_default=True, help="Cases in the synthetic matrix.")
@click.option(
    "--policy",
    type=click.Choice(["ours", "hash", "static-duration", "all"]),
    default="all",
    show_default=True,
    help="Dispatch policy to simulate (all: each, side by side).",
)
@click.option("--sigma", type=float, default=0.5, show_default=True, help="lognormal sigma of true/estimated duration.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic workload.")
@click.option(
    "--modes-per-config",
    type=int,
    default=1,
    show_default=True,
    help="Cases come as configs of this many cudagraph modes that share work on one worker "
    "(adds ours-ungrouped: the same dispatcher not keeping them together).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def simulate(**kwargs):
    """Discrete-event simulation of the scheduling policy against hash and static-duration sharding.

    \b
    Example:
      orch simulate --gpus 512 --nodes 64 --cases 20000 --json
    """
    _dispatch("simulate", **kwargs)


@cli.command()
@click.option(
    "--matrix",
    type=MATRIX_PATH,
    default=None,
    help="Which providers of MATRIX run here and which are skipped (why); exit 0 when what runs here can run, as `orch run` would.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@devices_option("Device class to check the matrix for.")
def doctor(**kwargs):
    """What a run here gets: platform, GPUs and arch, visible-device variables as Ray sets them,
    fp8 dtype, providers and why one cannot run, graph kind, Ray auth, NCCL/RCCL, Triton, aiter.

    \b
    Examples:
      orch doctor
      orch doctor --matrix matrices/full.yaml --json > doctor.json
    """
    _dispatch("doctor", **kwargs)


def _interrupted(e: KeyboardInterrupt) -> int:
    """Ctrl-C, or SIGTERM where a command traps it (orchestrator/interrupts.py): 130 / 143."""
    from orchestrator.interrupts import exit_code, signame

    click.echo(f"orch: interrupted ({signame(e)})", err=True)
    return exit_code(e)


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="orch", standalone_mode=False)
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else ExitCode.INPUT_ERROR
    except click.exceptions.Abort as e:
        if isinstance(e.__cause__, KeyboardInterrupt):  # click turns Ctrl-C inside a command into Abort
            return _interrupted(e.__cause__)
        click.echo("orch: aborted", err=True)
        return ExitCode.INFRA_ERROR
    except click.ClickException as e:  # usage errors: bad option, missing argument, bad choice
        click.echo(f"orch: {e.format_message()}", err=True)
        return ExitCode.INPUT_ERROR
    except OrchError as e:
        click.echo(f"orch: {e.one_line()}", err=True)
        return e.exit_code
    except KeyboardInterrupt as e:
        return _interrupted(e)
    except Exception as e:  # noqa: BLE001 - a bug in orch: one line unless asked for more
        if os.environ.get("ORCH_DEBUG"):
            traceback.print_exc()
        click.echo(f"orch: internal error: {type(e).__name__}: {e} (ORCH_DEBUG=1 for the traceback)", err=True)
        return ExitCode.INFRA_ERROR
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
