"""Software-defined assets: the sealed segments, their compaction, the supertables, the schema
history and the cold tier. Bodies stay thin: open the store, call the core, report metadata."""


import json
from typing import Any

import dagster as dg

from history_pipeline.errors import HistoryError
from history_pipeline.io.store import open_store
from history_pipeline.maintenance.export import export_database
from history_pipeline.orchestration.partitions import parse_segment_partition_key, segment_partitions
from history_pipeline.orchestration.resources import HistoryRootResource, SparkResource
from history_pipeline.wal import SegmentState, read_segment
from history_pipeline.wal.segments import segment_name

GROUP = "history"


def _segment_ref(history: HistoryRootResource, partition_key: str) -> tuple[Any, Any]:
    database, segment_id = parse_segment_partition_key(partition_key)
    store = history.open(database)
    for ref in store.segments():
        if ref.segment_id == segment_id:
            return store, ref
    raise HistoryError(f"segment {segment_name(segment_id)} of {database} is not in {store.wal_dir}")


@dg.asset(partitions_def=segment_partitions, group_name=GROUP, description="A sealed WAL segment, verified.")
def wal_segments(context: dg.AssetExecutionContext, history: HistoryRootResource) -> dg.MaterializeResult:
    store, ref = _segment_ref(history, context.partition_key)
    contents = read_segment(ref)  # verifies count and checksum
    ops: dict[str, int] = {}
    for _, event in contents.events:
        name = type(event).__name__
        ops[name] = ops.get(name, 0) + 1
    return dg.MaterializeResult(
        metadata={
            "database": store.database,
            "segment": ref.name,
            "state": ref.state.value,
            "records": len(contents.events),
            "bytes": contents.size_bytes,
            "lower": contents.lower,
            "upper": contents.upper,
            "records_by_kind": dg.MetadataValue.json(ops),
        }
    )


@dg.asset(
    partitions_def=segment_partitions,
    deps=[wal_segments],
    group_name=GROUP,
    description="The segment compacted on Spark into supertable batches (segments of a database apply in order).",
)
def compacted_batches(
    context: dg.AssetExecutionContext, history: HistoryRootResource, spark: SparkResource
) -> dg.MaterializeResult:
    store, ref = _segment_ref(history, context.partition_key)
    frontier_before = store.frontier
    if ref.state is SegmentState.APPLIED and ref.segment_id in store.catalog_state().applied_segments:
        context.log.info(f"segment {ref.name} was already applied")
        summary_dict = {"segments_applied": [], "versions_written": 0, "files_written": 0, "bytes_written": 0,
                        "tables_touched": [], "frontier": store.frontier}
    else:
        summary = store.compact(spark=spark.session(), on_step=lambda step: context.log.info(f"compaction: {step}"))
        summary_dict = summary.as_dict()
    state = store.catalog_state()
    preview = _preview(store, state.frontier + 1)
    return dg.MaterializeResult(
        metadata={
            "database": store.database,
            "segments_applied": dg.MetadataValue.json(summary_dict["segments_applied"]),
            "versions_written": summary_dict["versions_written"],
            "files_written": summary_dict["files_written"],
            "bytes_written": summary_dict["bytes_written"],
            "timestamp_range": f"[{frontier_before + 1}, {state.frontier + 1})",
            "frontier": state.frontier,
            "tables_touched": ", ".join(summary_dict["tables_touched"]),
            "preview": dg.MetadataValue.md(preview),
        }
    )


def _preview(store: Any, as_of: int, rows: int = 5) -> str:
    lines = []
    for descriptor in store.get_catalog(as_of)[:3]:
        table = store.load_table(descriptor.table_name, as_of).slice(0, rows).to_pylist()
        names = list(table[0].keys()) if table else ["synthetic_key"]
        lines.append(f"**{descriptor.table_name}**\n\n| " + " | ".join(names) + " |\n|" + "---|" * len(names))
        lines += ["| " + " | ".join(str(r[n]) for n in names) + " |" for r in table]
        lines.append("")
    return "\n".join(lines) or "(no tables)"


@dg.asset(deps=[compacted_batches], group_name=GROUP,
          description="Every database's supertables: small batches merged, snapshots refreshed.")
def supertables(context: dg.AssetExecutionContext, history: HistoryRootResource,
                spark: SparkResource) -> dg.MaterializeResult:
    report: dict[str, Any] = {}
    for database in history.databases():
        store = history.open(database)
        merged = store.merge(spark=spark.session())
        snapshots = store.refresh_snapshots()
        state = store.catalog_state()
        report[database] = {
            "merge": merged.as_dict(),
            "snapshots": snapshots.as_dict(),
            "live_files": len(state.files),
            "live_bytes": sum(f.size_bytes for f in state.files.values()),
            "frontier": state.frontier,
        }
        context.log.info(f"{database}: {json.dumps(report[database])}")
    return dg.MaterializeResult(
        metadata={
            "databases": len(report),
            "files_merged": sum(r["merge"]["files_removed"] for r in report.values()),
            "snapshots_written": sum(len(r["snapshots"]["tables"]) for r in report.values()),
            "live_bytes": sum(r["live_bytes"] for r in report.values()),
            "report": dg.MetadataValue.json(report),
        }
    )


@dg.asset(deps=[compacted_batches], group_name=GROUP,
          description="_history_catalog.schema_history of every database.")
def schema_history(history: HistoryRootResource) -> dg.MaterializeResult:
    summary = {}
    rows = []
    for database in history.databases():
        state = history.open(database).catalog_state()
        summary[database] = len(state.schema_history)
        for e in state.schema_history[-10:]:
            columns = "dropped" if e.descriptor is None else len(e.descriptor.columns)
            rows.append(f"| {database} | {e.logical_timestamp} | {e.table_name} | {columns} |")
    table = "| database | t | table | columns |\n|---|---|---|---|\n" + "\n".join(rows)
    return dg.MaterializeResult(
        metadata={"schema_changes": dg.MetadataValue.json(summary), "latest": dg.MetadataValue.md(table)}
    )


class ColdTierConfig(dg.Config):
    """Where point-in-time exports go (a path or s3://bucket/prefix)."""

    destination: str = "data/cold_tier"


@dg.asset(deps=[supertables], group_name=GROUP,
          description="Point-in-time export of every database as of its frontier + 1, to the cold tier.")
def cold_tier_export(
    context: dg.AssetExecutionContext, config: ColdTierConfig, history: HistoryRootResource
) -> dg.MaterializeResult:
    target = open_store(config.destination, history.s3_options())
    exported = {}
    for database in history.databases():
        store = history.open(database)
        as_of = store.frontier + 1
        if as_of <= 0:
            continue
        manifest = export_database(store, as_of, target, on_table=lambda n: context.log.info(f"exported {n}"))
        exported[database] = {"as_of": as_of, "tables": len(manifest["tables"]),
                              "rows": sum(t["rows"] for t in manifest["tables"]),
                              "bytes": sum(t["bytes"] for t in manifest["tables"])}
    return dg.MaterializeResult(
        metadata={
            "destination": config.destination,
            "exports": dg.MetadataValue.json(exported),
            "bytes": sum(e["bytes"] for e in exported.values()),
        }
    )
