"""`orch serve`: the live dashboard on localhost until interrupted."""

from __future__ import annotations

import signal

import click

from orchestrator import defaults
from orchestrator.dashboard.server import make_server
from orchestrator.interrupts import SIGNALS, trapped


def main(
    db: str | None = None,
    host: str = "127.0.0.1",
    port: int = 9265,
    baseline: str | None = None,
    known_failures: str | None = None,
) -> int:
    server = make_server(db or defaults.db(), host, port, baseline, known_failures)
    # Ctrl-C or SIGTERM is how it stops: exit 0 from the moment it listens. Both are trapped here
    # rather than left to the disposition the process inherited (a parent that blocked or ignored
    # SIGINT, as a job started in the background of a script gets, left a server nothing stopped).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    with trapped():
        try:
            click.echo(f"orch dashboard on {server.url} (Ctrl-C to stop)")
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0
