"""Where a results store lives, as given to `--db` / `ORCH_DB`: a SQLite path or a PostgreSQL URL.

A URL's password must never reach a message, a run record or a summary: `display` is the URL
without it, and `mask_argv` scrubs the command lines the store records (`runs.argv`, the writer
row). Only URLs select PostgreSQL (`postgresql://` or `postgres://`, libpq's forms); anything else
is a file path, so a typo'd URL scheme becomes a file name rather than a connection attempt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

PG_SCHEMES = ("postgresql://", "postgres://")
# user:password@ in any URL-looking text (argv elements such as --db=postgresql://u:p@h/db).
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]*)@")
_PW_PARAM = re.compile(r"(?i)([?&]password=)[^&#\s]*")
MASK = "***"


@dataclass(frozen=True)
class Location:
    kind: str  # "sqlite" | "postgresql"
    target: str  # the path, or the full URL (with its password: for the driver only)
    display: str  # what messages and records may show

    @property
    def is_postgres(self) -> bool:
        return self.kind == "postgresql"


def is_postgres_url(text: str) -> bool:
    return str(text).strip().lower().startswith(PG_SCHEMES)


def mask(text: str) -> str:
    """Any URL's password (userinfo or a `password=` parameter) replaced by ***."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", str(text))
    return _PW_PARAM.sub(lambda m: m.group(1) + MASK, text)


def mask_argv(argv) -> list[str]:
    return [mask(a) for a in argv]


def _display_url(url: str) -> str:
    """The URL without its password (and without a fragment: `#RUN` addresses a run, see refs)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}@{host}"
    query = urlencode(
        [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k.lower() != "password"], safe="/"
    )  # a socket directory reads as itself
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def parse(db: str) -> Location:
    db = str(db).strip()
    if is_postgres_url(db):
        return Location("postgresql", db, _display_url(db))
    return Location("sqlite", db, db)
