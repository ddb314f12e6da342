"""How `orch run` was asked for a run (runs.options, schema 6): what its outputs name ("filter
`tp=1`, backend `x`: 6 of 90 cases"), where `--resume` writes, and what judged it (known failures,
flakiness window and threshold, the empty-run rule of orchestrator/empty_run.py; the baseline is
runs.baseline), so `orch gate` and `orch report` judge the run as `orch run` did
(orchestrator/judging.py). Keys a run was stored without read as the defaults."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.flakiness import DEFAULT_WINDOW

if TYPE_CHECKING:
    from backend.case import Case


@dataclass(frozen=True)
class RunOptions:
    out: str = ""  # --out, absolute ("" unknown)
    filter: str | None = None  # --filter as given
    backend: str | None = None  # --backend as given
    matrix_cases: int = 0  # cases of the matrix before --filter (runnable and skipped; 0 unknown)
    allow_empty: bool = False  # --allow-empty: a run in which nothing ran may pass
    require: tuple[str, ...] = ()  # --require FILTER...: slices that must have run
    allow_unverifiable: bool = False  # --allow-unverifiable: unverifiable cases listed, not failing
    known_failures: str = ""  # the known-failures file that applied, absolute ("" none)
    flaky_window: int = DEFAULT_WINDOW  # --flaky-window
    flaky_threshold: float | None = None  # --flaky-threshold (None: scores shown, never used)

    def to_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "require": list(self.require)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> RunOptions:
        d = json.loads(text or "{}")
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        return cls(**{**d, "require": tuple(d.get("require", ()))})


@dataclass(frozen=True)
class NewRun:
    """What a new run is stored with (ResultStore.create_run): the matrix and its planned cases,
    and what `orch run` was asked (its command line, --address, --devices, --baseline, --label,
    the options that judge it)."""

    matrix: str
    cases: Sequence[Case]
    argv: Sequence[str] = ()
    cluster: str = ""
    devices: str = ""
    versions: dict[str, str] | None = None
    baseline: str | None = None  # as given (its password masked when stored)
    label: str = ""
    options: RunOptions | None = None
