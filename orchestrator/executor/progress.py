"""Run progress on stderr: a live rich bar on a terminal, one plain line per 10% elsewhere (CI logs),
nothing at all when `quiet` (`orch run --no-progress`)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import TextIO

from backend.result import CaseResult


class Progress:
    def __init__(
        self,
        total: int,
        *,
        live: bool | None = None,
        stream: TextIO | None = None,
        label: str = "cases",
        quiet: bool = False,
    ):
        self.total = max(0, total)
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.live = bool(live if live is not None else self.stream.isatty())
        self.counts: Counter[str] = Counter()
        self.done = 0
        self._t0 = time.monotonic()
        self._next_pct = 10
        self._bar = None
        if self.live and self.total and not quiet:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[counts]}"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._task = self._bar.add_task(label, total=self.total, counts="")
            self._bar.start()

    def _counts_text(self) -> str:
        keys = ("pass", "fail", "error", "timeout", "unverifiable", "flaky", "skip")
        return " ".join(f"{k} {self.counts[k]}" for k in keys if self.counts[k])

    def update(self, result: CaseResult) -> None:
        self.done += 1
        self.counts[result.status.value] += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, counts=self._counts_text())
            return
        if not self.total or self.quiet:
            return
        pct = 100 * self.done // self.total
        if pct >= self._next_pct or self.done == self.total:
            elapsed = time.monotonic() - self._t0
            eta = elapsed / self.done * (self.total - self.done)
            print(
                f"orch: {self.done}/{self.total} ({pct}%) {self._counts_text()} elapsed {elapsed:.0f}s eta {eta:.0f}s",
                file=self.stream,
                flush=True,
            )
            while self._next_pct <= pct:
                self._next_pct += 10

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
