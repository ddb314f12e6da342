"""SIGINT and SIGTERM as an exception in the driver, so an interrupted `orch run` can close its
run, write its outputs marked INTERRUPTED and exit 130 / 143 as shells and CI runners expect.

Python turns SIGINT into KeyboardInterrupt but leaves SIGTERM (what a CI runner sends to cancel a
job) deadly: the process died without a word and an earlier run's outputs stayed in OUT.
`Interrupted` subclasses KeyboardInterrupt so every `except Exception` lets it through, as it
lets Ctrl-C through. Hazards: `ray.init` installs its own SIGTERM handler (sys.exit), so the
driver calls `rearm()` after connecting; Ray's blocking calls turn whatever the handler raises
into a plain KeyboardInterrupt, so `exit_code`/`signame` go by the signal last trapped.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_armed = False
# The last signal trapped. Ray's blocking calls (ray.wait) run the handler themselves and raise a
# plain KeyboardInterrupt in place of its exception, so the exception's type cannot say which
# signal it was; this can.
_last: int | None = None


class Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def _signum(e: KeyboardInterrupt) -> int:
    if isinstance(e, Interrupted):
        return e.signum
    return _last if _last is not None else int(signal.SIGINT)  # untrapped: Python's own Ctrl-C


def exit_code(e: KeyboardInterrupt) -> int:
    """128 + the signal (130 SIGINT, 143 SIGTERM)."""
    return 128 + _signum(e)


def signame(e: KeyboardInterrupt) -> str:
    return signal.Signals(_signum(e)).name


def _raise(signum: int, _frame) -> None:
    global _last
    _last = int(signum)
    raise Interrupted(signum)


def rearm() -> None:
    """Take SIGINT/SIGTERM back (after a library installed its own) while `trapped` is active."""
    if _armed:
        for s in SIGNALS:
            signal.signal(s, _raise)


@contextmanager
def trapped() -> Iterator[None]:
    """Inside: SIGINT and SIGTERM raise Interrupted. Signal handlers live in the main thread
    only; elsewhere (a test calling the command from a thread) this does nothing."""
    global _armed, _last
    if threading.current_thread() is not threading.main_thread() or _armed:
        yield
        return
    before = {s: signal.getsignal(s) for s in SIGNALS}
    _armed, _last = True, None
    rearm()
    try:
        yield
    finally:
        _armed = False
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
