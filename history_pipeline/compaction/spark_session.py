"""A local SparkSession with the settings that work on small machines (see FACTS.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def local_spark(master: str = "local[*]", conf: dict[str, str] | None = None) -> Any:
    """Create (or reuse) a SparkSession bound to loopback, executors on this interpreter."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("history_pipeline")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def map_tasks(spark: Any | None, fn: Callable[[T], R], tasks: Sequence[T]) -> list[R]:
    """``fn`` over picklable tasks: one Spark partition each, or in-process without a session."""
    if not tasks:
        return []
    if spark is None:
        return [fn(task) for task in tasks]
    return spark.sparkContext.parallelize(list(tasks), numSlices=len(tasks)).map(fn).collect()
