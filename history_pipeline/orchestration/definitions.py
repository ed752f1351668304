"""The Dagster code location of history_pipeline (``workspace.yaml`` loads ``defs``)."""

from __future__ import annotations

import dagster as dg

from history_pipeline.orchestration.assets import (
    cold_tier_export,
    compacted_batches,
    schema_history,
    supertables,
    wal_segments,
)
from history_pipeline.orchestration.checks import (
    catalog_verifies_check,
    frontier_lag_check,
    reconstruction_invariant_check,
)
from history_pipeline.orchestration.erasure import erasure_job
from history_pipeline.orchestration.resources import (
    SENSOR_LISTEN_SECONDS,
    HistoryRootResource,
    S3Settings,
    SparkResource,
    spark_engine,
)
from history_pipeline.orchestration.schedules import (
    cleanup_job,
    cleanup_schedule,
    cold_tier_export_job,
    cold_tier_export_schedule,
    retention_job,
    retention_schedule,
    supertables_job,
    supertables_schedule,
)
from history_pipeline.orchestration.segment_runs import compact_segments_job
from history_pipeline.orchestration.sensors import compact_segment_job, finished_wal_segments_sensor


def build_definitions(history: HistoryRootResource, spark: SparkResource | None = None) -> dg.Definitions:
    """Every asset, check, job, sensor and schedule over one storage root."""
    return dg.Definitions(
        assets=[wal_segments, compacted_batches, supertables, schema_history, cold_tier_export],
        asset_checks=[catalog_verifies_check, frontier_lag_check, reconstruction_invariant_check],
        jobs=[compact_segments_job, compact_segment_job, supertables_job, retention_job, cleanup_job,
              cold_tier_export_job, erasure_job],
        sensors=[finished_wal_segments_sensor],
        schedules=[supertables_schedule, retention_schedule, cold_tier_export_schedule, cleanup_schedule],
        resources={"history": history, "spark": spark or spark_engine()},
    )


def s3_history_root() -> HistoryRootResource:
    """The history resource of a deployment on S3: root, local WAL folder, endpoint, region and
    credentials all come from the environment, resolved by Dagster when a run or tick starts
    (``dg.EnvVar``), never read at import. A variable left unset is a clear Dagster error then."""
    return HistoryRootResource(
        root=dg.EnvVar("HISTORY_PIPELINE_ROOT"),  # s3://bucket/prefix
        wal_root=dg.EnvVar("HISTORY_PIPELINE_WAL_ROOT"),  # local folder with one WAL folder per database
        sensor_listen_seconds=SENSOR_LISTEN_SECONDS,
        s3=S3Settings(
            endpoint_url=dg.EnvVar("AWS_ENDPOINT_URL"),
            region_name=dg.EnvVar("AWS_REGION"),
            aws_access_key_id=dg.EnvVar("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=dg.EnvVar("AWS_SECRET_ACCESS_KEY"),
        ),
    )


#: The embedded default: ``data/`` under the working directory (``make demo``). A deployment on S3
#: loads ``history_pipeline.orchestration.s3_deployment`` instead (see README, "Scaling out").
defs = build_definitions(HistoryRootResource(root="data", s3=S3Settings(),
                                             sensor_listen_seconds=SENSOR_LISTEN_SECONDS))
