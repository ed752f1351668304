"""Where the data work runs: facts about a SparkSession (classic or Connect) and what executors
need from the driver, passed by configuration, never inside pickled task payloads.

Only DataFrame and session-conf calls are used (no ``sparkContext``): the same code runs on a
local session, a standalone cluster and Spark Connect.
"""

from __future__ import annotations

from typing import Any

from history_pipeline.errors import HistoryError
from history_pipeline.io.store import ObjectStore, S3Options, S3Store, open_store

#: session-conf keys that carry S3 credentials to executors (Spark hands session confs to every
#: task as local properties; the names match Spark's redaction pattern, so UIs and logs hide them)
S3_ACCESS_KEY_CONF = "spark.history_pipeline.s3.access.key"
S3_SECRET_CONF = "spark.history_pipeline.s3.secret"


class ExecutionError(HistoryError):
    """The Spark session cannot run this work as configured (say, executors cannot see a path)."""


def spark_master(spark: Any) -> str:
    """The session's master URL (under Spark Connect: the server's)."""
    try:
        return str(spark.conf.get("spark.master"))
    except Exception:  # noqa: BLE001 - a Connect server may not expose it; treat as remote
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


def share_credentials(spark: Any, objects: ObjectStore) -> None:
    """Put the store's S3 credentials in the session conf, from where executors read them."""
    if isinstance(objects, S3Store) and objects.options.access_key_id:
        spark.conf.set(S3_ACCESS_KEY_CONF, objects.options.access_key_id)
        spark.conf.set(S3_SECRET_CONF, objects.options.secret_access_key or "")


def open_executor_store(config: dict[str, Any]) -> ObjectStore:
    """On an executor: the store of ``config``, with credentials from the task's configuration,
    else from the executor's environment (the usual AWS variables)."""
    if "s3" not in config:
        return open_store(config)
    from pyspark import TaskContext

    context = TaskContext.get()
    access = context.getLocalProperty(S3_ACCESS_KEY_CONF) if context is not None else None
    secret = context.getLocalProperty(S3_SECRET_CONF) if context is not None else None
    s3 = config["s3"]
    options = S3Options(s3.get("endpoint_url"), s3.get("region"), access or None, secret or None)
    return open_store(config["uri"], options)
