"""Rich output that a pipe or a CI log can carry.

On a terminal: as rich draws it, at least `min_width` wide. Elsewhere (a pipe, a file, a CI log):
no colour and no padding; rich fills every table line to the console width, so `orch doctor >
file` had every line padded to 100 columns. Lines are drawn wide and stripped instead.
"""

from __future__ import annotations

import io
import sys
from typing import Any, TextIO

PIPE_WIDTH = 160  # wide enough that a table line seldom folds; trailing blanks are stripped


def echo(*renderables: Any, file: TextIO | None = None, markup: bool = True, min_width: int = 100) -> None:
    from rich.console import Console

    file = file or sys.stdout
    if file.isatty():
        width = max(Console(file=file).width, min_width)
        Console(file=file, width=width, markup=markup, highlight=False).print(*renderables)
        return
    buf = io.StringIO()
    Console(file=buf, width=PIPE_WIDTH, force_terminal=False, no_color=True, markup=markup, highlight=False).print(
        *renderables
    )
    file.write("".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines()))
    file.flush()
