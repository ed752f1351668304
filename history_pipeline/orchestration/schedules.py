"""Retention, cold-tier export and cleanup on schedules; their settings through dg.Config."""


from datetime import timedelta

import dagster as dg

from history_pipeline.orchestration.assets import cold_tier_export
from history_pipeline.orchestration.resources import HistoryRootResource


class RetentionConfig(dg.Config):
    """Keep this many logical timestamps of history below the frontier; older versions are purged."""

    keep_timestamps: int = 1_000_000
    cold_tier: str | None = None  # where purged history is kept (path or s3://); None: not kept


@dg.op(description="Retention to frontier + 1 - keep_timestamps, for every database.")
def retain_op(context: dg.OpExecutionContext, config: RetentionConfig, history: HistoryRootResource) -> dict:
    done = {}
    for database in history.databases():
        store = history.open(database)
        purge_before = store.frontier + 1 - config.keep_timestamps
        if purge_before <= store.earliest:
            continue
        summary = store.retain(purge_before, cold_tier=config.cold_tier, s3=history.s3_options())
        done[database] = summary.as_dict()
        context.log.info(f"{database}: {done[database]}")
    context.add_output_metadata({"retention": dg.MetadataValue.json(done)})
    return done


class CleanupConfig(dg.Config):
    grace_seconds: float = 3600.0


@dg.op(description="Delete tombstoned and orphan files past the grace period; prune the catalog log.")
def cleanup_op(context: dg.OpExecutionContext, config: CleanupConfig, history: HistoryRootResource) -> dict:
    done = {}
    for database in history.databases():
        report = history.open(database).cleanup(grace=timedelta(seconds=config.grace_seconds))
        done[database] = report.as_dict()
    context.add_output_metadata({"cleanup": dg.MetadataValue.json(done)})
    return done


@dg.job(description="Retention to a purge timestamp for every database.")
def retention_job() -> None:
    retain_op()


@dg.job(description="Tombstone and orphan cleanup for every database.")
def cleanup_job() -> None:
    cleanup_op()


cold_tier_export_job = dg.define_asset_job("cold_tier_export_job", selection=[cold_tier_export])

retention_schedule = dg.ScheduleDefinition(job=retention_job, cron_schedule="0 3 * * *", name="retention_schedule")
cold_tier_export_schedule = dg.ScheduleDefinition(
    job=cold_tier_export_job, cron_schedule="0 4 * * 0", name="cold_tier_export_schedule"
)
cleanup_schedule = dg.ScheduleDefinition(job=cleanup_job, cron_schedule="30 3 * * *", name="cleanup_schedule")
