"""A throwaway PostgreSQL server for tests: initdb in a temp dir, listening on 127.0.0.1 only."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def pg_bin(name: str) -> str:
    """Path of a PostgreSQL server binary (the newest installed major version)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    assert found[-1], f"PostgreSQL's {name} is not installed (.ci/run installs it)"
    return found[-1]


def _as_postgres_user(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@dataclass(frozen=True)
class PostgresServer:
    port: int
    base: Path

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq connection string for the superuser."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def connect(self, dbname: str = "postgres", autocommit: bool = True):  # noqa: ANN201 - psycopg type
        import psycopg

        return psycopg.connect(self.dsn(dbname), autocommit=autocommit)


@contextmanager
def postgres_server(*settings: str) -> Iterator[PostgresServer]:
    """Start a server with extra ``-c name=value`` settings; stop it and delete its files afterwards."""
    import psycopg

    base = Path(tempfile.mkdtemp(prefix="history-pipeline-pg-"))  # outside pytest's root-only tree
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
    data = base / "data"
    subprocess.run(_as_postgres_user([pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
                   check=True, capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = " ".join(
        [f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c TimeZone=UTC"]
        + [f"-c {setting}" for setting in settings]
    )
    subprocess.run(_as_postgres_user([pg_bin("pg_ctl"), "-D", str(data), "-o", options, "-l",
                                      str(base / "log"), "-w", "start"]), check=True, capture_output=True)
    server = PostgresServer(port, base)
    try:
        deadline = time.time() + 30
        while True:
            try:
                server.connect().close()
                break
            except psycopg.OperationalError:
                if time.time() > deadline:
                    raise
                time.sleep(0.3)
        yield server
    finally:
        subprocess.run(_as_postgres_user([pg_bin("pg_ctl"), "-D", str(data), "-m", "fast", "stop"]),
                       capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
