"""A local SparkSession with the settings that work on small machines (see FACTS.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


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


def local_spark(master: str = "local[*]", conf: dict[str, str] | None = None) -> Any:
    """Create (or reuse) a SparkSession: bound to loopback, executors on this interpreter when local."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in spark_config(master, conf).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def map_tasks(spark: Any | None, fn: Callable[[T], R], tasks: Sequence[T]) -> list[R]:
    """``fn`` over picklable tasks: one Spark partition each, or in-process without a session."""
    if not tasks:
        return []
    if spark is None:
        return [fn(task) for task in tasks]
    return spark.sparkContext.parallelize(list(tasks), numSlices=len(tasks)).map(fn).collect()
