"""Where the data work runs: the SparkSession's settings, facts about a session (classic or
Connect), running picklable tasks on it, and what executors need from the driver, passed by
configuration, never inside pickled task payloads.

Only DataFrame and session-conf calls are used (no ``sparkContext``): the same code runs on a
local session, a standalone cluster and Spark Connect.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from history_pipeline.errors import HistoryError
from history_pipeline.io.store import ObjectStore, S3Options, S3Store, open_store

#: session-conf keys that carry S3 credentials to executors (Spark hands session confs to every
#: task as local properties; the names match Spark's redaction pattern, so UIs and logs hide them)
S3_ACCESS_KEY_CONF = "spark.history_pipeline.s3.access.key"
S3_SECRET_CONF = "spark.history_pipeline.s3.secret"


T = TypeVar("T")
R = TypeVar("R")


class ExecutionError(HistoryError):
    """The Spark session cannot run this work as configured (say, executors cannot see a path)."""


def spark_config(master: str = "local[*]", conf: dict[str, str] | None = None) -> dict[str, str]:
    """Spark settings for ``master``: loopback binding and few shuffle partitions when local."""
    settings = {"spark.master": master, "spark.app.name": "history_pipeline", "spark.ui.enabled": "false"}
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors need this interpreter's packages
        settings.update(
            {
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.driver.host": "127.0.0.1",
                "spark.sql.shuffle.partitions": "4",
            }
        )
    settings.update(conf or {})
    return settings


#: how long a Connect client keeps retrying an engine that does not answer before the work fails
#: (pyspark's default policy waits up to 10 minutes: a run would hang on a stopped engine)
CONNECT_RETRIES = 4
CONNECT_MAX_BACKOFF_MS = 2000


class EngineUnavailableError(ExecutionError):
    """The Spark engine stopped answering while work ran on it: nothing of that work was committed."""


def is_connect_url(master: str) -> bool:
    """True for a Spark Connect URL (``sc://host:port``)."""
    return master.startswith("sc://")


#: processes that share an engine session (Dagster's runs) use one server-side session id for this
#: long, then the next: below Spark Connect's idle timeout (60 min by default), so an id is never
#: one the server has closed for idleness
SHARED_SESSION_SECONDS = 1800


def shared_session_url(url: str, now: float, scope: str = "") -> str:
    """``url`` (``sc://host:port[/;params]``) naming the engine session that every process using
    this URL within ``scope`` (a deployment: its settings and credentials go in the session's
    conf, so two deployments on one engine never share a session) shares during the current
    period of :data:`SHARED_SESSION_SECONDS`; unchanged when it names a session already. A Connect
    server starts the Python workers of user code per session: processes that each open a session
    of their own pay that start-up (seconds) on every run."""
    import uuid

    if "session_id=" in url:
        return url
    period = int(now // SHARED_SESSION_SECONDS)
    session_id = uuid.uuid5(uuid.NAMESPACE_URL, f"history-pipeline:{scope}:{url}#{period}")
    return f"{url}{'' if '/;' in url else '/'};session_id={session_id}"


#: an engine warmed less than this long before its shared session's period ends warms the next
#: period's session too: the runs move to it at the period's end and would find it cold
WARM_NEXT_WITHIN_SECONDS = 600


def shared_periods_to_warm(now: float) -> tuple[float, ...]:
    """Times naming the shared sessions (:func:`shared_session_url`) an engine warmed at ``now``
    warms: the current period's, and the next one's when fewer than
    :data:`WARM_NEXT_WITHIN_SECONDS` of the current period remain. That next session is then first
    used within ``WARM_NEXT_WITHIN_SECONDS + SHARED_SESSION_SECONDS`` (below the engine's idle
    timeout), so it is still open when the runs reach it."""
    next_start = (int(now // SHARED_SESSION_SECONDS) + 1) * SHARED_SESSION_SECONDS
    return (now, float(next_start)) if next_start - now < WARM_NEXT_WITHIN_SECONDS else (now,)


def spark_session(master: str = "local[*]", conf: dict[str, str] | None = None) -> Any:
    """A session on ``master``: a Spark Connect client for ``sc://host:port`` (no JVM in this
    process; it fails fast when the engine stops answering), else a classic session
    (:func:`local_spark`: ``local[N]`` or a ``spark://`` master)."""
    if not is_connect_url(master):
        return local_spark(master, conf)
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    builder = ConnectSession.builder.remote(master)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.client.set_retry_policies([DefaultPolicy(max_retries=CONNECT_RETRIES,
                                                     max_backoff=CONNECT_MAX_BACKOFF_MS)])
    return session


def engine_failure(exc: BaseException) -> bool:
    """True when ``exc`` says the Spark Connect engine is gone (not that the work itself failed)."""
    try:
        import grpc
        from pyspark.errors.exceptions.connect import SparkConnectGrpcException
    except ImportError:  # no Connect client installed: no Connect failure either
        return False
    for cause in _chain(exc):
        if isinstance(cause, grpc.RpcError) and cause.code() in (grpc.StatusCode.UNAVAILABLE,
                                                                 grpc.StatusCode.CANCELLED):
            return True
        if isinstance(cause, SparkConnectGrpcException) and any(
                word in str(cause) for word in ("UNAVAILABLE", "Connection refused", "Socket closed",
                                                "failed to connect", "connection reset")):
            return True
    return False


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def raise_engine_failure(exc: BaseException, master: str) -> None:
    """Re-raise a lost engine as one :class:`EngineUnavailableError` naming it; other errors pass."""
    if engine_failure(exc):
        raise EngineUnavailableError(
            f"the Spark engine at {master} stopped answering ({type(exc).__name__}); nothing of this work was "
            "committed: start it again (history-pipeline engine start) and rerun; the sensor retries by itself"
        ) from None


def local_spark(master: str = "local[*]", conf: dict[str, str] | None = None) -> Any:
    """Create (or reuse) a SparkSession: bound to loopback, executors on this interpreter when local."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in spark_config(master, conf).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


_TASKS_DDL = "i long, payload binary"


def map_tasks(spark: Any | None, fn: Callable[[T], R], tasks: Sequence[T]) -> list[R]:
    """``fn`` over picklable tasks, results in the tasks' order: on Spark one partition per task,
    or in-process without a session.

    DataFrames only (no ``sparkContext``, absent under Spark Connect): the partitions of one
    ``spark.range`` are the tasks' indexes, and ``mapInArrow`` runs ``fn`` on the pickled task of
    each and returns its pickled result. The pickled tasks travel with the UDF (``fn`` cloudpickled
    by reference to its module; Spark broadcasts a large one): one stage, no shuffle and no
    sampling job, which a frame of the tasks partitioned by index would cost. Payloads must not
    hold credentials: build them with :func:`store_for_tasks`.
    """
    if not tasks:
        return []
    if spark is None:
        return [fn(task) for task in tasks]
    payloads = tuple(pickle.dumps(task) for task in tasks)
    frame = spark.range(0, len(tasks), 1, len(tasks))
    collected = frame.mapInArrow(_task_runner(fn, payloads), _TASKS_DDL).collect()
    results = {int(row["i"]): pickle.loads(row["payload"]) for row in collected}
    if sorted(results) != list(range(len(tasks))):  # cannot happen unless Spark lost or repeated a row
        raise ExecutionError(f"Spark returned results for tasks {sorted(results)} of {len(tasks)}; rerun the job")
    return [results[i] for i in range(len(tasks))]


def _task_runner(
    fn: Callable[[Any], Any], payloads: Sequence[bytes]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The Arrow UDF of :func:`map_tasks`: task indexes in, (index, pickled result) out."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            indexes = batch.column(0).to_pylist()
            # one Python call per task (a task is a whole file or table of work, not a row)
            results = [pickle.dumps(fn(pickle.loads(payloads[i]))) for i in indexes]
            yield pa.RecordBatch.from_arrays(
                [pa.array(indexes, pa.int64()), pa.array(results, pa.binary())], names=["i", "payload"]
            )

    return run


def spark_master(spark: Any) -> str:
    """The session's master URL (under Spark Connect: the server's)."""
    try:
        return str(spark.conf.get("spark.master"))
    except Exception as exc:  # noqa: BLE001 - a Connect server may not expose it; treat as remote
        if engine_failure(exc):  # a lost engine is said as such, not taken for a remote master
            raise
        return "unknown"


def is_local_master(spark: Any) -> bool:
    """True when every executor runs on the driver's machine (``local``, ``local[N]``, ``local[*]``)."""
    return spark_master(spark).startswith("local")


def check_paths_visible(spark: Any, objects: ObjectStore, wal_dir: Any, shared_paths: bool) -> None:
    """Refuse at start-up what would silently put files on executors' own disks.

    A local-disk root (and the WAL, always on local disk) is visible to executors only when they
    run on this machine, or when the operator declares the paths shared (NFS and the like).
    """
    if shared_paths or is_local_master(spark):
        return
    where = [f"the WAL directory {wal_dir}"]
    if not isinstance(objects, S3Store):
        where.insert(0, f"the storage root {objects.uri}")
    raise ExecutionError(
        f"Spark master {spark_master(spark)} runs executors on other machines, but "
        f"{' and '.join(where)} are local paths: executors would read and write their own disks. "
        "Use an s3:// root and put the WAL on a shared path, then declare it with "
        "StoreSettings(shared_paths=True), or run on a local master."
    )


def executor_store_config(objects: ObjectStore) -> dict[str, Any]:
    """What executors need to open the store, without secrets (they come from configuration)."""
    config = objects.config()
    if "s3" in config:
        config = {**config, "s3": {**config["s3"], "access_key_id": None, "secret_access_key": None}}
    return config


def store_for_tasks(spark: Any | None, objects: ObjectStore) -> dict[str, Any]:
    """The store configuration to put in task payloads: whole when tasks run in-process (nothing is
    shipped), else without secrets, which go to the session conf (:func:`share_credentials`)."""
    if spark is None:
        return objects.config()
    share_credentials(spark, objects)
    return executor_store_config(objects)


def share_credentials(spark: Any, objects: ObjectStore) -> None:
    """Put the store's S3 credentials in the session conf, from where executors read them."""
    if isinstance(objects, S3Store) and objects.options.access_key_id:
        spark.conf.set(S3_ACCESS_KEY_CONF, objects.options.access_key_id)
        spark.conf.set(S3_SECRET_CONF, objects.options.secret_access_key or "")


def open_executor_store(config: dict[str, Any]) -> ObjectStore:
    """On an executor: the store of ``config``, with credentials from the task's configuration,
    else from the executor's environment (the usual AWS variables). A config that still holds its
    credentials (tasks run in-process by :func:`map_tasks`) opens as it is."""
    if "s3" not in config or config["s3"].get("access_key_id"):
        return open_store(config)
    from pyspark import TaskContext

    context = TaskContext.get()
    access = context.getLocalProperty(S3_ACCESS_KEY_CONF) if context is not None else None
    secret = context.getLocalProperty(S3_SECRET_CONF) if context is not None else None
    s3 = config["s3"]
    options = S3Options(s3.get("endpoint_url"), s3.get("region"), access or None, secret or None)
    return open_store(config["uri"], options)
