"""How a run is judged: baseline, known failures, flakiness window and threshold, required
slices, `--allow-empty`, `--allow-unverifiable`.

`orch run` stores what judged a run with it (RunOptions, runs.baseline); `orch gate`, `orch
report`, `orch dashboard` and `orch serve` judge a stored run with those unless the command says
otherwise, so every command prints the verdict `orch run` printed. A command's `Judging` holds what
it was asked (None: not asked); `over(run)` fills in the rest from the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator import flakiness
from orchestrator.errors import InputError
from orchestrator.gate import GateRules
from orchestrator.known_failures import KnownFailures
from orchestrator.store import RunInfo
from orchestrator.store.location import MASK, Location, parse

# The CLI options a Judging is built from (`from_cli` takes exactly these keys).
CLI_KEYS = (
    "baseline",
    "no_baseline",
    "known_failures",
    "no_known_failures",
    "flaky_window",
    "flaky_threshold",
    "require",
    "allow_empty",
    "allow_unverifiable",
)


@dataclass(frozen=True)
class Judging:
    baseline: str | None = None  # None: not asked; "": none (--no-baseline)
    known_failures: str | KnownFailures | None = None  # None: not asked; "": none (--no-known-failures)
    flaky_window: int | None = None  # None: not asked (the run's, else flakiness.DEFAULT_WINDOW)
    flaky_threshold: float | None = None  # None: not asked (the run's, else no threshold)
    require: tuple[str, ...] = ()  # adds to the run's own
    allow_empty: bool = False  # adds to the run's own
    allow_unverifiable: bool = False  # adds to the run's own

    @classmethod
    def from_cli(cls, options: Mapping[str, Any]) -> Judging:
        """From a command's options (any of CLI_KEYS; absent ones not asked), checked: exit 2."""
        unknown = set(options) - set(CLI_KEYS)
        if unknown:
            raise TypeError(f"unknown judging options: {', '.join(sorted(unknown))}")
        baseline = _one_of(options, "baseline", "no_baseline")
        known = _one_of(options, "known_failures", "no_known_failures")
        flaky = flakiness.options(options.get("flaky_window"), options.get("flaky_threshold"))
        return cls(
            baseline=baseline,
            known_failures=known,
            flaky_window=flaky["flaky_window"] if options.get("flaky_window") is not None else None,
            flaky_threshold=flaky["flaky_threshold"],
            require=tuple(options.get("require") or ()),
            allow_empty=bool(options.get("allow_empty")),
            allow_unverifiable=bool(options.get("allow_unverifiable")),
        )

    @property
    def rules(self) -> GateRules:
        return GateRules(self.require, self.allow_empty, self.allow_unverifiable)

    def over(self, run: RunInfo) -> Judging:
        """What judges `run`: each option as asked here, else as the run was judged; `require`,
        `allow_empty` and `allow_unverifiable` add to the run's own. A stored baseline is stored
        without a URL's password (`unmasked` puts --db's back)."""
        o = run.options
        return Judging(
            baseline=self.baseline if self.baseline is not None else (run.baseline or ""),
            known_failures=self.known_failures if self.known_failures is not None else o.known_failures,
            flaky_window=self.flaky_window if self.flaky_window is not None else o.flaky_window,
            flaky_threshold=self.flaky_threshold if self.flaky_threshold is not None else o.flaky_threshold,
            require=tuple(dict.fromkeys([*o.require, *self.require])),
            allow_empty=o.allow_empty or self.allow_empty,
            allow_unverifiable=o.allow_unverifiable or self.allow_unverifiable,
        )


def unmasked(baseline: str, db: Location, run_id: int) -> str:
    """A stored baseline with its URL's password: the run's own --db has it when the baseline
    names that database (`postgresql://u:***@h/db#main`); another one's is lost (exit 2)."""
    if MASK not in baseline:
        return baseline
    where, sep, selector = baseline.rpartition("#") if "#" in baseline else (baseline, "", "")
    if parse(where).display == db.display:
        return db.target + sep + selector
    raise InputError(
        f"run {run_id} was gated against {baseline}, whose password is not stored: give --baseline "
        "again (or --no-baseline)"
    )


def _one_of(options: Mapping[str, Any], key: str, off: str) -> str | None:
    """`--KEY X` (X), `--no-KEY` (""), neither (None); both is exit 2."""
    value, none = options.get(key), bool(options.get(off))
    if none and value is not None:
        raise InputError(f"--{key.replace('_', '-')} and --{off.replace('_', '-')} contradict each other: give one")
    return "" if none else value
