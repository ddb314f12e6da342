"""A real PostgreSQL server for the tests: Debian's binaries (initdb, pg_ctl), started per session.

The server refuses to run as root, so as root (CI) it runs as `nobody` through runuser, in a
directory under /tmp that nobody can reach. It listens on a unix socket only (no TCP port at all:
nothing off this machine can reach it), with a password (scram-sha-256) so the tests can check
that no message or record ever shows it. Where it cannot start (no binaries, root without runuser,
initdb failing) `start` raises Unavailable with the reason: the tests skip with it, and fail in CI.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass


class Unavailable(Exception):
    pass


def find_bin() -> str | None:
    """The directory of initdb/pg_ctl: on PATH, else Debian's /usr/lib/postgresql/VERSION/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return os.path.dirname(on_path)
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
    )
    return os.path.dirname(found[-1]) if found else None


@dataclass
class PgServer:
    root: str
    bindir: str
    password: str
    as_user: list[str]
    user: str = "orch"
    port: int = 5432  # names the socket file only: listen_addresses is empty

    def url(self, dbname: str, password: str | None = None) -> str:
        pw = self.password if password is None else password
        return f"postgresql://{self.user}:{pw}@/{dbname}?host={self.root}&port={self.port}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        subprocess.run(
            [
                *self.as_user,
                os.path.join(self.bindir, "pg_ctl"),
                "-D",
                os.path.join(self.root, "data"),
                "-m",
                "immediate",
                "stop",
            ],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def start() -> PgServer:
    bindir = find_bin()
    if bindir is None:
        raise Unavailable("PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql")
    try:
        import psycopg  # noqa: F401 - only whether it imports
    except ImportError:
        raise Unavailable("psycopg is not installed: pip install -e '.[test]'") from None
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb and postgres refuse root
        runuser = shutil.which("runuser")
        if runuser is None:
            raise Unavailable("running as root without runuser: the PostgreSQL server refuses to run as root")
        as_user = [runuser, "-u", "nobody", "--"]
    root = tempfile.mkdtemp(prefix="orch-pg-", dir="/tmp")
    os.chmod(root, 0o755)
    if as_user:
        shutil.chown(root, "nobody")
    password = secrets.token_hex(12)
    pwfile = os.path.join(root, "pw")
    with open(pwfile, "w") as f:
        f.write(password + "\n")
    if as_user:
        shutil.chown(pwfile, "nobody")
    server = PgServer(root, bindir, password, as_user)
    steps = (
        [
            os.path.join(bindir, "initdb"),
            "-D",
            os.path.join(root, "data"),
            "-U",
            server.user,
            "--auth=scram-sha-256",
            f"--pwfile={pwfile}",
            "-E",
            "UTF8",
            "--no-sync",
        ],
        # fsync off: a test server's data dies with the session; it changes nothing the store relies on.
        [
            os.path.join(bindir, "pg_ctl"),
            "-D",
            os.path.join(root, "data"),
            "-l",
            os.path.join(root, "log"),
            "-w",
            "-o",
            f"-c listen_addresses='' -c unix_socket_directories={root} -c port={server.port} -c fsync=off",
            "start",
        ],
    )
    for cmd in steps:
        p = subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            log = ""
            if os.path.exists(os.path.join(root, "log")):
                with open(os.path.join(root, "log")) as f:
                    log = f.read()[-500:]
            shutil.rmtree(root, ignore_errors=True)
            raise Unavailable(f"{os.path.basename(cmd[0])} failed: {(p.stderr or p.stdout).strip()[-300:]} {log}")
    os.remove(pwfile)
    return server
