"""Dagster resources: where the history lives, Spark, and S3. Credentials only through dg.EnvVar."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import dagster as dg
from pydantic import PrivateAttr

from history_pipeline.engine import reachable
from history_pipeline.execution import is_connect_url, shared_session_url, spark_session
from history_pipeline.io.store import S3Options
from history_pipeline.store import _DATABASE_RE, HistoryStore, StoreSettings, default_wal_base, wal_dir_of
from history_pipeline.wal.segments import segments_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: the sensor scans every WAL once in this many ticks by default (catches WALs written without a
#: journal marker: old writers, hand copies); ``HistoryRootResource.sensor_full_scan_every`` sets it
FULL_SCAN_EVERY = 60
#: how long the code locations' sensor tick listens to the change journal when nothing is due
#: (``HistoryRootResource.sensor_listen_seconds``): just under the sensor daemon's 5 s loop, so a
#: segment sealed between two evaluations is requested within a journal poll, not at the next loop
SENSOR_LISTEN_SECONDS = 4.5


def folder_stamp(wal_dir: str | Path) -> tuple[int, int] | None:
    """Change times (ns) of a WAL's ``segments/`` and ``quarantine/`` folders (0 when absent), or
    None when it is no WAL. A segment sealed, applied, quarantined, repaired or released adds or
    removes a name in one of them, so equal stamps mean nothing to do."""
    try:
        # plain string paths: this runs for every database on every sensor tick
        sealed = os.stat(os.path.join(wal_dir, "segments")).st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        quarantined = os.stat(os.path.join(wal_dir, "quarantine")).st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):
        quarantined = 0
    return sealed, quarantined


class S3Settings(dg.ConfigurableResource):
    """Where and as whom the store reaches S3 (the fields of dagster-aws's ``S3Resource``; secrets
    through ``dg.EnvVar``); empty fields fall back to the standard AWS environment. The store makes
    its own client from them: dagster-aws (boto3 and its components, seconds of import) is not
    loaded by the code location, nor by each run's process."""

    endpoint_url: str | None = None
    region_name: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None


class HistoryRootResource(dg.ConfigurableResource):
    """The storage root holding every database: a local path (``data``) or ``s3://bucket/prefix``.

    S3 is reached with the :class:`S3Settings` in ``s3`` (endpoint, region, credentials). WAL
    segments stay on local disk: ``<root>/<database>/wal`` for a local root, else
    ``<wal_root>/<database>`` (``wal_root`` defaults to ``data/wal/<bucket>/<prefix>``, as the CLI).
    """

    root: str = "data"
    s3: S3Settings
    snapshot_min_versions: int = 200_000
    wal_root: str | None = None
    #: ticks between the sensor's full scans of every WAL (1: every tick); ``dg.EnvVar.int(...)`` works
    sensor_full_scan_every: int = FULL_SCAN_EVERY
    #: seconds a sensor tick with nothing due waits for a change journal marker before it looks
    #: (0: it looks at once); the code locations set :data:`SENSOR_LISTEN_SECONDS`
    sensor_listen_seconds: float = 0.0

    def wal_base(self) -> Path:
        """The local folder holding one folder per database's WAL."""
        return Path(self.wal_root) if self.wal_root else default_wal_base(self.root)

    def wal_dir(self, database: str) -> Path:
        """The WAL directory of one database."""
        return Path(self.wal_root) / database if self.wal_root else wal_dir_of(self.root, database)

    def wal_dirs(self) -> dict[str, str]:
        """Every candidate database under the WAL base and its WAL directory (a string path, as
        :meth:`wal_dir`): one folder read, no stat (the sensor's stamps tell which are WALs)."""
        base = self.wal_base()
        try:
            with os.scandir(base) as entries:
                names = sorted(e.name for e in entries if _DATABASE_RE.match(e.name))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        # the layout of wal_dir() as string joins: pathlib costs more than the stats at 1,000s of databases
        tail = () if self.wal_root or self.root.startswith("s3://") else ("wal",)
        prefix = str(base)
        return {name: os.path.join(prefix, name, *tail) for name in names}

    def s3_options(self) -> S3Options:
        s3 = self.s3
        return S3Options(s3.endpoint_url, s3.region_name, s3.aws_access_key_id, s3.aws_secret_access_key)

    def databases(self) -> list[str]:
        """Every database with a WAL, sorted."""
        return [db for db, wal in self.wal_dirs().items() if segments_dir(Path(wal)).is_dir()]

    def open(self, database: str) -> HistoryStore:
        # absolute local paths: the Spark engine (a server of its own) has another working directory
        root = self.root if self.root.startswith("s3://") else str(Path(self.root).absolute())
        return HistoryStore.open(
            root,
            database=database,
            wal_dir=self.wal_dir(database).absolute(),
            s3=self.s3_options(),
            # no Spark of its own: work that needs Spark gets the session of the Spark resource
            settings=StoreSettings(snapshot_min_versions=self.snapshot_min_versions, spark_master=None),
        )


def history_root(root: str = "data", wal_root: str | None = None, **s3: str) -> HistoryRootResource:
    """A HistoryRootResource for ``root`` (S3Settings fields as keyword arguments)."""
    return HistoryRootResource(root=root, wal_root=wal_root, s3=S3Settings(**s3))


#: the environment variable naming the Spark engine of the code location (``make demo`` sets it to
#: the local Connect server's URL); unset: a classic local session in each run
ENGINE_ENV = "HISTORY_PIPELINE_SPARK"
#: the value of :data:`ENGINE_ENV` that runs the work in each run's own process, without Spark
IN_PROCESS = "in-process"


class SparkResource(dg.ConfigurableResource):
    """The Spark engine that compaction, merge, retention and erasure run on: a Spark Connect URL
    (``sc://host:port``: a long-lived server; the run is a client and starts no JVM), a
    standalone master (``spark://host:port``) or ``local[N]`` (a classic session in the run's
    process). Configure it with ``dg.EnvVar`` (:data:`ENGINE_ENV`); the same code runs on each.

    Under Connect every operation of a run carries the tag ``dagster-run-<run id>``, so the
    engine's job history tells which run did what."""

    master: str = "local[*]"
    spark_conf: dict[str, str] = {}
    enabled: bool = True
    _run_id: str | None = PrivateAttr(default=None)
    _deployment: str = PrivateAttr(default="")

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._run_id = context.run.run_id if context.run else None
        # the runs of one Dagster instance share an engine session; another instance's never do
        self._deployment = context.instance.root_directory if context.instance else ""

    def session(self) -> SparkSession | Literal[False]:
        """The session for compaction, merge and retention; False runs their tasks in-process."""
        if not self.enabled:
            return False
        if not is_connect_url(self.master):
            return spark_session(self.master, self.spark_conf)
        # every run attaches to one engine session: its Python workers are already started
        session = spark_session(shared_session_url(self.master, time.time(), self._deployment), self.spark_conf)
        if _closed(session):  # closed by hand on the server: a session of this run's own
            session = spark_session(f"{self.master.rstrip('/')}/;session_id={uuid.uuid4()}", self.spark_conf)
        if self._run_id:
            session.addTag(run_tag(self._run_id))
        return session

    def reachable(self) -> bool:
        """Whether the engine answers (a Connect server or standalone master accepts connections;
        a local master always does): the sensor requests no run while it does not."""
        return not self.enabled or reachable(self.master)


def _closed(session: SparkSession) -> bool:
    """Whether the engine refuses the session as closed (one round trip); any other failure is
    left to the work, where an engine loss is handled."""
    try:
        session.conf.get("spark.sql.session.timeZone")
    except Exception as exc:
        return "SESSION_CLOSED" in str(exc)
    return False


def run_tag(run_id: str) -> str:
    """The Spark job tag of a Dagster run's operations on a Connect engine."""
    return f"dagster-run-{run_id}"


def spark_engine() -> SparkResource:
    """The code location's engine: ``dg.EnvVar(ENGINE_ENV)`` when that variable is set where the
    code location loads (resolved by Dagster in every run), no Spark at all when it is
    :data:`IN_PROCESS` (small histories, tests), else a classic local session."""
    if os.environ.get(ENGINE_ENV) == IN_PROCESS:
        return SparkResource(enabled=False)
    if os.environ.get(ENGINE_ENV):
        return SparkResource(master=dg.EnvVar(ENGINE_ENV))
    return SparkResource()
