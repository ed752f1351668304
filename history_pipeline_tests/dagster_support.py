"""`dagster dev` for tests and benchmarks: webserver and daemon on 127.0.0.1 with a fresh
DAGSTER_HOME holding the repository's dagster.yaml, stopped by its process group."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: ``dagster dev`` runs under Python with SIGINT restored, so that its process group stops on a signal
LAUNCHER = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
            "os.execv(sys.argv[1], sys.argv[1:])")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (chosen by the OS)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dagster_home(workdir: Path) -> Path:
    """The DAGSTER_HOME of :func:`running_dagster_dev` in ``workdir`` (the runs' instance root)."""
    return workdir / "dagster_home"


@contextlib.contextmanager
def running_dagster_dev(workdir: Path, env: dict[str, str] | None = None,
                        timeout: float = 180.0) -> Iterator[int]:
    """`dagster dev` in ``workdir`` with :func:`dagster_home` (``env``: extra variables); yields its
    webserver port once it answers, and stops every process it started."""
    home = dagster_home(workdir)
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    port = free_port()
    full_env = {**os.environ, "DAGSTER_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
                "PYSPARK_PYTHON": sys.executable, **(env or {})}
    log_path = workdir / "dagster_dev.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(Path(sys.executable).parent / "dagster"), "dev", "-w",
             str(REPO / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
            cwd=workdir, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            give_up = time.monotonic() + timeout
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
                        break
                except OSError:
                    if time.monotonic() > give_up or proc.poll() is not None:
                        raise RuntimeError(f"dagster dev did not come up; see {log_path}") from None
                    time.sleep(0.5)
            yield port
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
