"""`orch serve`: the dashboard rendered from the store on every request, live while a run writes.

Routes: `/` (page, `?run=N` for another run), `/api/version?run=N` (a token the page polls every
two seconds), `/api/data?run=N` (the page's JSON). Each request opens the store read-only: SQLite
WAL lets it read while the driver commits (PostgreSQL: a read-only session), and no connection is
shared between handler threads.
Bound to 127.0.0.1 by default: results include log tails and paths, not for the open network.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from orchestrator.dashboard.build import build_page, data_version, live_extras, page_data, store_history
from orchestrator.dashboard.pack import pack
from orchestrator.errors import InfraError, OrchError
from orchestrator.judging import Judging
from orchestrator.known_failures import KnownFailures, load
from orchestrator.outputs import gather, pick_run
from orchestrator.store import ResultStore

_EMPTY_PAGE = """<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="2">
<title>orch: no runs yet</title><p>No runs in this database yet; this page reloads every 2 s.</p>"""


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer

    def log_message(self, format: str, *args: object) -> None:  # quiet: one line per request is noise
        pass

    def _send(self, code: int, body: str, ctype: str) -> None:
        data = body.encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        run = parse_qs(url.query).get("run", [None])[0]
        srv = self.server
        try:
            with ResultStore(srv.db, readonly=True) as store:
                if store.latest_run_id() is None:
                    if url.path == "/":
                        self._send(200, _EMPTY_PAGE, "text/html; charset=utf-8")
                    else:
                        self._send(200, json.dumps({"version": "empty"}), "application/json")
                    return
                rid = pick_run(store, run)
                if url.path == "/api/version":
                    self._send(200, json.dumps({"version": data_version(store, rid)}), "application/json")
                    return
                if url.path not in ("/", "/index.html", "/api/data"):
                    self._send(404, "not found", "text/plain; charset=utf-8")
                    return
                view = gather(store, rid, Judging(baseline=srv.baseline, known_failures=srv.known))
                if url.path == "/api/data":
                    hist, labels = store_history(store)
                    data = pack(page_data(view, hist, live_extras(store, rid), labels))
                    data["version"] = data_version(store, rid)
                    self._send(200, json.dumps(data, default=str), "application/json")
                else:
                    self._send(200, build_page(store, view, live=True), "text/html; charset=utf-8")
        except OrchError as e:  # e.g. ?run=99 or the DB not created yet: show it, keep serving
            code = HTTPStatus.NOT_FOUND if e.exit_code == 2 else HTTPStatus.SERVICE_UNAVAILABLE
            self._send(code, e.one_line(), "text/plain; charset=utf-8")


class DashboardServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, db: str, host: str, port: int, baseline: str | None, known: KnownFailures | None):
        self.db, self.baseline, self.known = db, baseline, known
        try:
            super().__init__((host, port), _Handler)
        except OSError as e:
            raise InfraError(f"cannot listen on {host}:{port}: {e.strerror}") from None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        assert isinstance(host, str), "an AF_INET server: its address is (str, int)"
        return f"http://{host}:{port}/"


def make_server(
    db: str, host: str = "127.0.0.1", port: int = 0, baseline: str | None = None, known_failures: str | None = None
) -> DashboardServer:
    """Validate the inputs now (bad known-failures file or baseline = exit 2 before serving)."""
    known = load(known_failures)
    with ResultStore(db, readonly=True) as store:
        rid = store.latest_run_id()
        if rid is not None and baseline:
            gather(store, rid, Judging(baseline=baseline, known_failures=known))
    return DashboardServer(db, host, port, baseline, known)
