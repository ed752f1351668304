"""The erasure job: forget keys of one table on request (right to erasure); the store does the work."""

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


@dg.op(description="Erase every version of the keys from the WAL, the table's files, the cold tier and exports.")
def erase_op(
    context: dg.OpExecutionContext, config: ErasureConfig, history: HistoryRootResource, spark: SparkResource
) -> dict:
    store = history.open(config.database)
    summary = store.erase(config.table, config.keys, requested_by=config.requested_by, reason=config.reason,
                          s3=history.s3_options(), purge_now=config.purge_now, spark=spark.session()).as_dict()
    context.log.info(f"{config.database}: erased {summary['key_count']} key(s) of {summary['table_uuid']}")
    context.add_output_metadata({
        "txn_id": summary["txn_id"],
        "summary": md_table(["what", "count"], sorted((k, v) for k, v in summary.items()
                                                       if isinstance(v, int) and k != "txn_id")),
    })
    return summary


@dg.job(description="Right to erasure: forget keys of one table everywhere (config: database, table, keys, "
                    "requested_by).")
def erasure_job() -> None:
    erase_op()
