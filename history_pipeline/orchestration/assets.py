"""Software-defined assets: the sealed segments, their compaction, the supertables, the schema
history and the cold tier. Bodies stay thin: open the store, call the core, report metadata."""


import json
import os
from collections.abc import Callable, Iterable
from typing import Any

import dagster as dg

from history_pipeline.compaction.compactor import AppliedSegment
from history_pipeline.errors import SegmentQuarantinedError
from history_pipeline.events import OP_NAMES
from history_pipeline.execution import engine_failure, raise_engine_failure
from history_pipeline.io.store import open_store
from history_pipeline.orchestration.metadata import md_table
from history_pipeline.orchestration.partitions import parse_segment_partition_key, segment_partitions
from history_pipeline.orchestration.resources import HistoryRootResource, SparkResource
from history_pipeline.query.engine import QueryContext
from history_pipeline.schema import TableDescriptor
from history_pipeline.store import HistoryStore
from history_pipeline.wal import SegmentState
from history_pipeline.wal.journal import note_change
from history_pipeline.wal.segments import (
    SegmentRef,
    public_reason,
    verify_or_quarantine,
    without_values,
)

GROUP = "history"


def _segment_ref(history: HistoryRootResource, partition_key: str) -> tuple[HistoryStore, SegmentRef]:
    database, segment_id = parse_segment_partition_key(partition_key)
    store = history.open(database)
    return store, store.segment_refs([segment_id])[0]


def value_free(store: HistoryStore, exc: SegmentQuarantinedError) -> SegmentQuarantinedError:
    """The error without any value of the segment's events: Dagster keeps what it is shown (the
    run's failure, the partition's metadata) for good, beyond an erasure's reach."""
    for ref in store.segments(SegmentState.QUARANTINED):
        if ref.name == exc.segment:
            return SegmentQuarantinedError(exc.segment, public_reason(ref) or "no reason recorded")
    return SegmentQuarantinedError(exc.segment, without_values(exc.cause, None))


def report_quarantine(instance: dg.DagsterInstance, partition_key: str, exc: SegmentQuarantinedError) -> None:
    """Say on the partition itself that its segment is quarantined and why, before the run fails."""
    for key in (dg.AssetKey("wal_segments"), dg.AssetKey("compacted_batches")):
        # written to the instance at once: events logged by a step that then fails are not kept
        instance.report_runless_asset_event(
            dg.AssetObservation(
                asset_key=key,
                partition=partition_key,
                metadata={
                    "state": "quarantined",
                    "reason": dg.MetadataValue.text(exc.cause),
                    "what to do": dg.MetadataValue.text(
                        f"history-pipeline repair {int(exc.segment)} --events FILE, or skip {int(exc.segment)} "
                        "--reason TEXT; the sensor then compacts it again"
                    ),
                },
            )
        )


def verified_metadata(store: HistoryStore, ref: SegmentRef) -> dict[str, Any]:
    """Verify one sealed segment (quarantining it, with why, when it does not verify) and describe
    it for its ``wal_segments`` partition. Raises the value-free :class:`SegmentQuarantinedError`."""
    try:
        # the same rule as compaction: a segment that does not verify is quarantined, with why
        contents = verify_or_quarantine(ref, store.wal_dir)
    except SegmentQuarantinedError as exc:
        raise value_free(store, exc) from None
    ops: dict[str, int] = {}
    for _, event in contents.events:
        name = OP_NAMES[type(event)]
        ops[name] = ops.get(name, 0) + 1
    return {
        "database": store.database,
        "segment": ref.name,
        "state": ref.state.value,
        "records": len(contents.events),
        "bytes": contents.size_bytes,
        "lower": contents.lower,
        "upper": contents.upper,
        "records_by_kind": md_table(["op", "records"], sorted(ops.items())),
    }


@dg.asset(partitions_def=segment_partitions, group_name=GROUP, description="A sealed WAL segment, verified.")
def wal_segments(context: dg.AssetExecutionContext, history: HistoryRootResource) -> dg.MaterializeResult:
    store, ref = _segment_ref(history, context.partition_key)
    try:
        metadata = verified_metadata(store, ref)
    except SegmentQuarantinedError as exc:
        report_quarantine(context.instance, context.partition_key, exc)
        raise
    return dg.MaterializeResult(metadata=metadata)


@dg.asset(
    partitions_def=segment_partitions,
    deps=[wal_segments],
    group_name=GROUP,
    description="Exactly this segment compacted on Spark into supertable batches; refused while an earlier "
    "segment of its database is pending (segments apply in order).",
)
def compacted_batches(
    context: dg.AssetExecutionContext, history: HistoryRootResource, spark: SparkResource
) -> dg.MaterializeResult:
    store, ref = _segment_ref(history, context.partition_key)
    metadata = compact_one(store, ref, spark, context.instance, context.partition_key, context.log.info)
    return dg.MaterializeResult(metadata=metadata)


def compact_one(store: HistoryStore, ref: SegmentRef, spark: SparkResource, instance: dg.DagsterInstance,
                partition_key: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Compact exactly one segment and describe that work for its ``compacted_batches`` partition.
    A quarantine is reported on the partition, an engine loss asks the sensor for a retry; both raise."""
    try:
        summary = store.compact(
            spark=spark.session(),
            on_step=lambda step: log(f"compaction of {ref.name}: {step}"),
            only_segment=ref.segment_id,
        )
    except SegmentQuarantinedError as exc:
        shown = value_free(store, exc)
        report_quarantine(instance, partition_key, shown)
        raise shown from None
    except Exception as exc:
        if engine_failure(exc):
            retry_when_engine_is_back(store, ref)
        raise_engine_failure(exc, spark.master)
        raise
    if not summary.applied:
        log(f"segment {ref.name} was already applied")
    return applied_metadata(store, ref, summary.applied[0] if summary.applied else None)


def applied_metadata(store: HistoryStore, ref: SegmentRef, applied: AppliedSegment | None) -> dict[str, Any]:
    """A ``compacted_batches`` partition's metadata: exactly what applying its segment did (None:
    applied before), its tables and preview as of that segment's own frontier."""
    if applied is None:
        frontier = store.frontier
        applied = AppliedSegment(ref.segment_id, 0, 0, 0, frozenset(), 0, frontier, frontier)
        newly = False
    else:
        newly = True
    as_of = applied.frontier + 1
    # one catalog state for the names and the preview: the newest, which covers this segment's frontier
    context = store.query_context()
    tables = context.get_catalog(as_of)
    return {
        "database": store.database,
        "segment": ref.name,
        "state": "applied",
        "newly_applied": newly,
        "versions_written": applied.versions_written,
        "files_written": applied.files_written,
        "bytes_written": applied.bytes_written,
        "schema_changes": applied.schema_changes,
        "timestamp_range": f"[{applied.frontier_before + 1}, {as_of})",
        "frontier": applied.frontier,
        "tables_touched": ", ".join(_table_names(tables, applied.tables_touched)) or "none",
        "preview": dg.MetadataValue.md(_preview(context, tables, as_of)),
    }


def retry_when_engine_is_back(store: HistoryStore, ref: SegmentRef) -> None:
    """Make the sensor request this segment again: a new change time is a new version of the
    segment (a new run key), and the journal marker has the sensor look at its database. The
    sensor requests the run once the engine answers again."""
    try:
        os.utime(ref.path)
    except FileNotFoundError:  # applied before the engine went away: nothing to retry
        return
    note_change(store.wal_dir)


def _table_names(tables: Iterable[TableDescriptor], table_uuids: Iterable[str]) -> list[str]:
    """Names (as in ``tables``) of the touched tables; a uuid when the table is gone."""
    names = {d.table_uuid: d.table_name for d in tables}
    return sorted(names.get(u, u) for u in table_uuids)


def _preview(context: QueryContext, tables: Iterable[TableDescriptor], as_of: int) -> str:
    """Each table's columns and row count as of ``as_of``: never a value, since Dagster keeps its
    metadata for good, beyond an erasure's reach (``history-pipeline query`` shows the rows). The
    counts are read without SQL's sandbox: the next run of the database waits for this one's end."""
    rows = []
    for descriptor in tables:
        columns = ", ".join(f"{c.column_name} {c.data_type}" for c in descriptor.columns)
        rows.append((descriptor.table_name, context.count_rows(descriptor, as_of), columns))
    return md_table(["table", "rows", "columns"], rows, empty="(no tables)").value


@dg.asset(deps=[compacted_batches], group_name=GROUP,
          description="Every database's supertables: small batches merged, snapshots refreshed.")
def supertables(context: dg.AssetExecutionContext, history: HistoryRootResource,
                spark: SparkResource) -> dg.MaterializeResult:
    report: dict[str, Any] = {}
    for database in history.databases():
        store = history.open(database)
        merged = store.merge(spark=spark.session())
        snapshots = store.refresh_snapshots(spark=spark.session())
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
            "files_marked": sum(r["snapshots"]["closed_files"] + r["snapshots"]["marked_files"]
                                for r in report.values()),
            "live_bytes": sum(r["live_bytes"] for r in report.values()),
            "by_database": md_table(
                ["database", "frontier", "live files", "live bytes", "files merged", "snapshots"],
                [(db, r["frontier"], r["live_files"], r["live_bytes"], r["merge"]["files_removed"],
                  len(r["snapshots"]["tables"])) for db, r in sorted(report.items())],
            ),
        }
    )


@dg.asset(deps=[compacted_batches], group_name=GROUP,
          description="_history_catalog.schema_history of every database.")
def schema_history(history: HistoryRootResource) -> dg.MaterializeResult:
    summary = {}
    rows: list[tuple[Any, ...]] = []
    for database in history.databases():
        state = history.open(database).catalog_state()
        summary[database] = len(state.schema_history)
        for e in state.schema_history[-10:]:
            columns = "dropped" if e.descriptor is None else len(e.descriptor.columns)
            rows.append((database, e.logical_timestamp, e.table_name, columns))
    return dg.MaterializeResult(
        metadata={
            "schema_changes": sum(summary.values()),
            "by_database": md_table(["database", "schema changes"], sorted(summary.items())),
            "latest": md_table(["database", "t", "table", "columns"], rows),
        }
    )


class ColdTierConfig(dg.Config):
    """Where point-in-time exports go (a path or s3://bucket/prefix)."""

    destination: str = "data/cold_tier"


@dg.asset(deps=[supertables], group_name=GROUP,
          description="Point-in-time export of every database as of its frontier + 1, to the cold tier.")
def cold_tier_export(
    context: dg.AssetExecutionContext, config: ColdTierConfig, history: HistoryRootResource
) -> dg.MaterializeResult:
    # imported here: the export's query engine is ~2 s of every run process's start otherwise
    from history_pipeline.maintenance.export import export_database

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
            "databases_exported": len(exported),
            "exports": md_table(
                ["database", "as_of", "tables", "rows", "bytes"],
                [(d, e["as_of"], e["tables"], e["rows"], e["bytes"]) for d, e in sorted(exported.items())],
            ),
            "bytes": sum(e["bytes"] for e in exported.values()),
        }
    )
