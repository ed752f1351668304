"""The long-lived Spark engine: a local Spark Connect server started from the pyspark
distribution, which Dagster runs and the CLI attach to as Connect clients (no JVM of their own).

One engine per WAL base: its record (``engine.json``: pid, URL, memory) and log live in
``<wal base>/_engine/``. Starting an engine that is up returns the one up; stopping signals its
pid and waits for it to exit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlparse

from history_pipeline.errors import HistoryError

#: the engine's folder under the WAL base (not a database name: those start with a letter or digit)
ENGINE_DIR = "_engine"
#: a 2-core machine shared with the runs, the webserver and the daemon: two task slots and a 2 GiB
#: driver hold a 1M-event segment's compaction (the engine's JVM stays under ~3 GiB resident)
DEFAULT_MASTER = "local[2]"
DEFAULT_DRIVER_MEMORY = "2g"
#: seconds a Connect server takes to listen on a loaded 2-core machine, at most
START_TIMEOUT_S = 180.0
#: the Spark job tag of the engine's warm-up job
WARM_TAG = "history-pipeline-warm-up"
#: what a compaction's Python workers import first (named, not imported here: the workers load them)
WARM_MODULES = ("history_pipeline.compaction.frames", "history_pipeline.compaction.compactor")


class EngineError(HistoryError):
    """The Spark engine could not be started, reached or stopped."""


@dataclass(frozen=True)
class EngineInfo:
    """A local Spark Connect server this package started."""

    url: str  # sc://127.0.0.1:PORT
    pid: int
    master: str
    driver_memory: str
    log: str
    started_at: float

    @property
    def port(self) -> int:
        return int(urlparse(self.url).port or 15002)


def engine_dir(wal_base: str | Path) -> Path:
    """Where the engine of a WAL base keeps its record and log."""
    return Path(wal_base) / ENGINE_DIR


def spark_home() -> Path:
    """The Spark distribution bundled with pyspark."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise EngineError("pyspark is not installed: run make setup")
    return Path(spec.origin).parent


def connect_address(url: str) -> tuple[str, int]:
    """Host and port of a Spark Connect URL (``sc://host:port``, parameters after ``/;`` ignored)."""
    parsed = urlparse(url)
    if parsed.scheme != "sc" or not parsed.hostname:
        raise EngineError(f"{url!r} is not a Spark Connect URL (expected sc://host:port)")
    return parsed.hostname, parsed.port or 15002


def reachable(url: str, timeout: float = 1.0) -> bool:
    """True when something accepts connections at a Spark Connect URL (or a ``spark://`` master)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("sc", "spark") or not parsed.hostname:
        return True  # local masters live in the process that uses them
    try:
        with socket.create_connection((parsed.hostname, parsed.port or 15002), timeout=timeout):
            return True
    except OSError:
        return False


def process_alive(pid: int, *, reap: bool = False, foreign: bool = False) -> bool:
    """Whether a process of this pid exists. With ``reap``, our own child that exited is reaped and
    counts as gone (a zombie still answers kill 0); a process we may not signal (another user's)
    counts as ``foreign``."""
    if reap:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return False
        except ChildProcessError:
            pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return foreign
    return True


def _alive(pid: int) -> bool:
    if not process_alive(pid, reap=True, foreign=True):
        return False
    try:
        # a pid reused by another program after the engine died is not the engine
        return b"SparkConnectServer" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        return True


def read_engine(folder: str | Path) -> EngineInfo | None:
    """The engine recorded in ``folder`` (up or not), or None."""
    try:
        body = json.loads((Path(folder) / "engine.json").read_text())
        return EngineInfo(**body)
    except (OSError, json.JSONDecodeError, TypeError):  # absent, or a root that is a file: no engine
        return None


def running_engine(folder: str | Path) -> EngineInfo | None:
    """The engine recorded in ``folder`` when its process is alive and its port answers."""
    info = read_engine(folder)
    if info is None or not _alive(info.pid) or not reachable(info.url):
        return None
    return info


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(port: int, master: str = DEFAULT_MASTER, driver_memory: str = DEFAULT_DRIVER_MEMORY,
                   conf: dict[str, str] | None = None) -> list[str]:
    """The ``spark-submit`` line of a Connect server on 127.0.0.1:``port``."""
    settings = {
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        # few shuffle partitions on few cores (200 cost 2x on a 5M-row fold)
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.enabled": "false",
        **(conf or {}),
    }
    line = [str(spark_home() / "bin" / "spark-submit"), "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", master,
            "--driver-memory", driver_memory, "--name", "history_pipeline engine"]
    for key, value in settings.items():
        line += ["--conf", f"{key}={value}"]
    return [*line, "spark-internal"]


def start_engine(folder: str | Path, port: int = 0, master: str = DEFAULT_MASTER,
                 driver_memory: str = DEFAULT_DRIVER_MEMORY, conf: dict[str, str] | None = None,
                 timeout: float = START_TIMEOUT_S, on_wait: object = None, warm: bool = True,
                 scope: str | None = None) -> EngineInfo:
    """Start a Spark Connect server on 127.0.0.1 (``port`` 0: a free one), wait until it listens
    and (``warm``) warm it with :func:`warm_engine` for the runs of ``scope``; the one already up
    in ``folder`` is returned as it is."""
    folder = Path(folder)
    up = running_engine(folder)
    if up is not None:
        return up
    folder.mkdir(parents=True, exist_ok=True)
    port = port or _free_port()
    log = folder / "engine.log"
    env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
           # the engine's Python workers run this interpreter, which has this package installed
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    with open(log, "ab") as out:
        proc = subprocess.Popen(server_command(port, master, driver_memory, conf), env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=folder,
                                start_new_session=True)  # outlives the command that started it
    info = EngineInfo(f"sc://127.0.0.1:{port}", proc.pid, master, driver_memory, str(log), time.time())
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            raise EngineError(f"the Spark engine exited with code {proc.returncode} while starting; see {log}")
        if reachable(info.url):
            if warm:
                try:
                    warm_engine(info.url, scope, task_slots(master))
                except Exception as exc:  # an engine that cannot run the runs' kind of job is no engine
                    _terminate(proc.pid, 30)
                    raise EngineError(f"the Spark engine started but failed its first job ({type(exc).__name__}); "
                                      f"see {log}") from None
            (folder / "engine.json").write_text(json.dumps(asdict(info)))
            return info
        if callable(on_wait):
            on_wait(time.monotonic() + timeout - give_up)
        time.sleep(0.5)
    _terminate(proc.pid, 30)
    raise EngineError(f"the Spark engine did not listen on {info.url} within {timeout:.0f}s; see {log}")


def _warm_task(index: int) -> int:
    """One task of the warm-up job: loads the modules a compaction's Python worker loads."""
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)
    return index


def task_slots(master: str) -> int:
    """Task slots of a ``local[N]`` master (``local[*]``: the cores here); 2 for any other."""
    inside = master[len("local["):-1] if master.startswith("local[") and master.endswith("]") else ""
    if inside == "*":
        return os.cpu_count() or 2
    return int(inside.split(",")[0]) if inside.split(",")[0].isdigit() else 2


def warm_engine(url: str, scope: str | None = None, slots: int = 2, now: float | None = None) -> None:
    """Run a tiny job of the runs' kind (an Arrow UDF, one task for each of ``slots`` task slots)
    on the engine at ``url``, so that the first runs find its JVM code paths compiled and its
    Python workers started with the package loaded. With ``scope`` (a Dagster instance's root directory) the
    job runs in the engine session the runs of that instance share now (the engine starts Python
    workers per session), and in the next period's too when the current one is about to end
    (:func:`~history_pipeline.execution.shared_periods_to_warm`); those stay open for the runs.
    Else in a session of its own, released."""
    import uuid

    from history_pipeline.execution import shared_periods_to_warm, shared_session_url

    base = url.rstrip("/")
    if scope is None:
        _warm_session(f"{base}/;session_id={uuid.uuid4()}", slots, shared=False)
        return
    for at in shared_periods_to_warm(time.time() if now is None else now):
        _warm_session(shared_session_url(base, at, scope), slots, shared=True)


def _warm_session(session_url: str, slots: int, shared: bool) -> None:
    """The warm-up job in the engine session ``session_url`` names."""
    from history_pipeline.execution import map_tasks, spark_session

    session = spark_session(session_url)
    try:
        session.addTag(WARM_TAG)
        map_tasks(session, _warm_task, list(range(max(1, slots))))
    finally:
        session.clearTags()
        # a shared session stays on the engine for the runs; only this client's channel closes
        session.release_session_on_close = not shared
        session.stop()


def _terminate(pid: int, timeout: float) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if not _alive(pid):
            return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    while _alive(pid):
        time.sleep(0.1)


def stop_engine(folder: str | Path, timeout: float = 30.0) -> EngineInfo | None:
    """Stop the engine recorded in ``folder`` (SIGTERM, then SIGKILL after ``timeout``) and forget
    it; None when none was recorded."""
    info = read_engine(folder)
    if info is None:
        return None
    if _alive(info.pid):
        _terminate(info.pid, timeout)
    (Path(folder) / "engine.json").unlink(missing_ok=True)
    return info
