"""The Dagster code location of history_pipeline (``workspace.yaml`` loads ``defs``)."""

from __future__ import annotations

import dagster as dg
from dagster_aws.s3 import S3Resource

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
from history_pipeline.orchestration.resources import HistoryRootResource, SparkResource
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
from history_pipeline.orchestration.sensors import compact_segment_job, finished_wal_segments_sensor

defs = dg.Definitions(
    assets=[wal_segments, compacted_batches, supertables, schema_history, cold_tier_export],
    asset_checks=[catalog_verifies_check, frontier_lag_check, reconstruction_invariant_check],
    jobs=[compact_segment_job, supertables_job, retention_job, cleanup_job, cold_tier_export_job, erasure_job],
    sensors=[finished_wal_segments_sensor],
    schedules=[supertables_schedule, retention_schedule, cold_tier_export_schedule, cleanup_schedule],
    resources={
        # The embedded default: ``data/`` under the working directory. For S3, a deployment sets
        # root="s3://bucket/prefix" and S3Resource(aws_access_key_id=dg.EnvVar("AWS_ACCESS_KEY_ID"), ...).
        "history": HistoryRootResource(root="data", s3=S3Resource()),
        "spark": SparkResource(),
    },
)
