"""Retention, cold-tier export and cleanup on schedules; their settings through dg.Config."""


from datetime import timedelta

import dagster as dg

from history_pipeline.orchestration.assets import cold_tier_export, schema_history, supertables
from history_pipeline.orchestration.metadata import md_table
from history_pipeline.orchestration.resources import HistoryRootResource, SparkResource


class RetentionConfig(dg.Config):
    """Keep this many logical timestamps of history below the frontier; older versions are purged."""

    keep_timestamps: int = 1_000_000
    cold_tier: str | None = None  # where purged history is kept (path or s3://); None: not kept


@dg.op(description="Retention to frontier + 1 - keep_timestamps, for every database.")
def retain_op(
    context: dg.OpExecutionContext, config: RetentionConfig, history: HistoryRootResource, spark: SparkResource
) -> dict:
    done = {}
    for database in history.databases():
        store = history.open(database)
        purge_before = store.frontier + 1 - config.keep_timestamps
        if purge_before <= store.earliest:
            continue
        summary = store.retain(purge_before, cold_tier=config.cold_tier, s3=history.s3_options(),
                               spark=spark.session())
        done[database] = summary.as_dict()
        context.log.info(f"{database}: {done[database]}")
    context.add_output_metadata({
        "databases_purged": len(done),
        "by_database": md_table(["database", "purge_before", "files removed", "files added"],
                                [(d, r.get("purge_before"), r.get("files_removed"), r.get("files_added"))
                                 for d, r in sorted(done.items())]),
    })
    return done


class CleanupConfig(dg.Config):
    grace_seconds: float = 3600.0


@dg.op(description="Delete tombstoned and orphan files past the grace period; prune the catalog log.")
def cleanup_op(context: dg.OpExecutionContext, config: CleanupConfig, history: HistoryRootResource) -> dict:
    done = {}
    for database in history.databases():
        report = history.open(database).cleanup(grace=timedelta(seconds=config.grace_seconds))
        done[database] = report.as_dict()
    context.add_output_metadata({
        "bytes_freed": sum(int(r["bytes_freed"]) for r in done.values()),
        "by_database": md_table(["database", "transactions pruned", "tombstones deleted", "orphans deleted",
                                 "bytes freed"],
                                [(d, r["transactions_pruned"], r["tombstones_deleted"], r["orphans_deleted"],
                                  r["bytes_freed"]) for d, r in sorted(done.items())]),
    })
    return done


@dg.job(description="Retention to a purge timestamp for every database.")
def retention_job() -> None:
    retain_op()


@dg.job(description="Tombstone and orphan cleanup for every database.")
def cleanup_job() -> None:
    cleanup_op()


cold_tier_export_job = dg.define_asset_job("cold_tier_export_job", selection=[cold_tier_export])

#: merge and snapshots after compaction, with the schema history; selecting the assets selects their
#: asset checks too, so the checks run right after the asset they check, in the same run
supertables_job = dg.define_asset_job(
    "supertables_job",
    selection=dg.AssetSelection.assets(supertables, schema_history),
    description="Merge small batches, refresh snapshots, record the schema history, and run the asset checks.",
)

# Every schedule is on by default (the demo shows them working); a deployment turns any off in the UI.
RUNNING = dg.DefaultScheduleStatus.RUNNING
supertables_schedule = dg.ScheduleDefinition(
    job=supertables_job, cron_schedule="*/5 * * * *", name="supertables_schedule", default_status=RUNNING
)
retention_schedule = dg.ScheduleDefinition(
    job=retention_job, cron_schedule="0 3 * * *", name="retention_schedule", default_status=RUNNING
)
cold_tier_export_schedule = dg.ScheduleDefinition(
    job=cold_tier_export_job, cron_schedule="0 4 * * 0", name="cold_tier_export_schedule", default_status=RUNNING
)
cleanup_schedule = dg.ScheduleDefinition(
    job=cleanup_job, cron_schedule="30 3 * * *", name="cleanup_schedule", default_status=RUNNING
)
