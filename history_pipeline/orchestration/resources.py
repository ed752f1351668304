"""Dagster resources: where the history lives, Spark, and S3. Credentials only through dg.EnvVar."""

from __future__ import annotations

from typing import Any

import dagster as dg
from dagster_aws.s3 import S3Resource
from dagster_pyspark import PySparkResource

from history_pipeline.compaction.spark_session import spark_config
from history_pipeline.io.store import S3Options
from history_pipeline.store import HistoryStore, StoreSettings, discover_databases


class HistoryRootResource(dg.ConfigurableResource):
    """The storage root holding every database: a local path (``data``) or ``s3://bucket/prefix``.

    S3 is reached through dagster-aws's ``S3Resource`` (endpoint, region, credentials: secrets
    through ``dg.EnvVar``); its empty fields fall back to the standard AWS environment.
    """

    root: str = "data"
    s3: S3Resource
    snapshot_min_versions: int = 200_000

    def s3_options(self) -> S3Options:
        s3 = self.s3
        return S3Options(s3.endpoint_url, s3.region_name, s3.aws_access_key_id, s3.aws_secret_access_key)

    def databases(self) -> list[str]:
        return discover_databases(self.root)

    def open(self, database: str) -> HistoryStore:
        return HistoryStore.open(
            self.root,
            database=database,
            s3=self.s3_options(),
            # no Spark of its own: work that needs Spark gets the session of the Spark resource
            settings=StoreSettings(snapshot_min_versions=self.snapshot_min_versions, spark_master=None),
        )


def history_root(root: str = "data", **s3: str) -> HistoryRootResource:
    """A HistoryRootResource for ``root`` (S3Resource fields as keyword arguments)."""
    return HistoryRootResource(root=root, s3=S3Resource(**s3))


class SparkResource(dg.ConfigurableResource):
    """Spark for compaction, merge and retention, through dagster-pyspark: ``local[*]`` by
    default, any master and Spark conf by configuration."""

    master: str = "local[*]"
    spark_conf: dict[str, str] = {}
    enabled: bool = True

    def session(self) -> Any:
        """The session for compaction, merge and retention; False runs their tasks in-process."""
        if not self.enabled:
            return False
        return PySparkResource(spark_config=spark_config(self.master, self.spark_conf)).spark_session
