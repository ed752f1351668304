"""Dagster resources: where the history lives, Spark, and S3. Credentials only through dg.EnvVar."""

from __future__ import annotations

from typing import Any

import dagster as dg
from dagster_pyspark import PySparkResource

from history_pipeline.compaction.spark_session import local_spark
from history_pipeline.io.store import S3Options
from history_pipeline.store import HistoryStore, StoreSettings, discover_databases


class HistoryRootResource(dg.ConfigurableResource):
    """The storage root holding every database: a local path (``data``) or ``s3://bucket/prefix``.

    For S3, set the endpoint and credentials here, secrets through ``dg.EnvVar``; fields left
    empty fall back to the standard AWS environment.
    """

    root: str = "data"
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    snapshot_min_versions: int = 200_000

    def s3_options(self) -> S3Options:
        return S3Options(self.s3_endpoint_url, self.s3_region, self.aws_access_key_id, self.aws_secret_access_key)

    def databases(self) -> list[str]:
        return discover_databases(self.root)

    def open(self, database: str) -> HistoryStore:
        return HistoryStore.open(
            self.root,
            database=database,
            s3=self.s3_options(),
            settings=StoreSettings(snapshot_min_versions=self.snapshot_min_versions),
        )


class SparkResource(dg.ConfigurableResource):
    """Spark for compaction and merges: ``local[*]`` by default, any master by configuration."""

    master: str = "local[*]"
    spark_conf: dict[str, str] = {}
    enabled: bool = True

    def session(self) -> Any | None:
        if not self.enabled:
            return None
        if self.master.startswith("local"):
            return local_spark(self.master, self.spark_conf)
        return PySparkResource(spark_config={"spark.master": self.master, **self.spark_conf}).spark_session
