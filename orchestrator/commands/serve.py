"""`orch serve`: the live dashboard on localhost until interrupted."""

from __future__ import annotations

import click

from orchestrator.dashboard.server import make_server


def main(db: str, host: str = "127.0.0.1", port: int = 9265, baseline: str | None = None,
         known_failures: str | None = None) -> int:  # fmt: skip
    server = make_server(db, host, port, baseline, known_failures)
    try:  # Ctrl-C is how it stops: exit 0 from the moment it listens
        click.echo(f"orch dashboard on {server.url} (Ctrl-C to stop)")
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
