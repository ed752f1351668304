"""The erasure job: forget keys of one table on request; the store does the work."""

import dagster as dg

from history_pipeline.orchestration.metadata import md_table
from history_pipeline.orchestration.resources import HistoryRootResource, SparkResource


class ErasureConfig(dg.Config):
    """What to erase, and who asked (recorded in the catalog; the keys and values are not)."""

    database: str
    table: str  # the name as of the newest state, or the table uuid
    keys: list[int]
    requested_by: str
    reason: str = ""
    purge_now: bool = False  # delete the replaced files now instead of after cleanup's grace period
    dry_run: bool = False  # change nothing: report what would be removed and where


@dg.op(description="Erase every version of the keys from the WAL, the table's files, the cold tier and exports.")
def erase_op(
    context: dg.OpExecutionContext, config: ErasureConfig, history: HistoryRootResource, spark: SparkResource
) -> dict:
    store = history.open(config.database)
    summary = store.erase(config.table, config.keys, requested_by=config.requested_by, reason=config.reason,
                          s3=history.s3_options(), purge_now=config.purge_now, spark=spark.session(),
                          dry_run=config.dry_run).as_dict()
    done = "would erase" if config.dry_run else "erased"
    context.log.info(f"{config.database}: {done} {summary['key_count']} key(s) of {summary['table_uuid']} "
                     f"({summary['keys_found']} found)")
    for warning in summary["warnings"]:
        context.log.warning(warning)
    # counts, tiers and paths only: Dagster keeps its metadata beyond an erasure's reach
    context.add_output_metadata({
        "txn_id": summary["txn_id"],
        "dry_run": config.dry_run,
        "summary": md_table(["what", "count"], sorted((k, v) for k, v in summary.items()
                                                       if type(v) is int and k != "txn_id")),
        "places": md_table(["tier", "path", "count"], [(p["tier"], p["path"], p["count"]) for p in summary["places"]]),
    })
    return summary


@dg.job(description="Right to erasure: forget keys of one table everywhere (config: database, table, keys, "
                    "requested_by).")
def erasure_job() -> None:
    erase_op()
