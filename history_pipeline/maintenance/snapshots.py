"""Periodic table snapshots: the state of a table at one T, so reads stop growing with history.

A query as of T reads the newest snapshot at or below T plus the versions
written since it. When the versions written since a table's newest snapshot
outnumber ``ratio`` times its live rows (and at least ``min_versions``), a new
snapshot as of ``frontier + 1`` is written and committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from history_pipeline.catalog.files import live_rows, write_parquet
from history_pipeline.catalog.handle import DatabaseHandle
from history_pipeline.catalog.model import AddFile, CatalogState, FileKind
from history_pipeline.schema import replay_schema_history
from history_pipeline.supertable import FileMetadata, new_file_path, supertable_schema


@dataclass
class SnapshotSummary:
    as_of: int
    tables: list[str] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def versions_since_snapshot(state: CatalogState, table_uuid: str) -> tuple[int, int, int | None]:
    """(versions written since the newest snapshot, rows in that snapshot, its as_of)."""
    snapshots = [f for f in state.files_of(table_uuid, FileKind.SNAPSHOT) if f.snapshot_as_of is not None]
    newest = max((f.snapshot_as_of for f in snapshots), default=None)  # type: ignore[type-var]
    snapshot_rows = sum(f.row_count for f in snapshots if f.snapshot_as_of == newest)
    since = sum(
        f.row_count
        for f in state.files_of(table_uuid, FileKind.VERSIONS)
        if newest is None or (f.max_t is not None and f.max_t >= newest)
    )
    return since, snapshot_rows, newest


def refresh_snapshots(store: DatabaseHandle, min_versions: int, ratio: float, force: bool = False) -> SnapshotSummary:
    """Write a snapshot as of frontier + 1 for every table whose history since its last one is long."""
    state: CatalogState = store.catalog.latest()
    as_of = state.frontier + 1
    summary = SnapshotSummary(as_of)
    supers = replay_schema_history(state.schema_history).supercolumns
    added = []
    for table_uuid in sorted({f.table_uuid for f in state.files.values() if f.table_uuid}):
        since, snapshot_rows, newest = versions_since_snapshot(state, table_uuid)
        if newest == as_of or since == 0:
            continue
        if not force and since < max(min_versions, ratio * snapshot_rows):
            continue
        supercolumns = supers.get(table_uuid, ())
        schema = supertable_schema(supercolumns)
        rows = live_rows(store.objects, state, table_uuid, supercolumns, as_of).select(schema.names).cast(schema)
        meta = FileMetadata(store.database, table_uuid, FileKind.SNAPSHOT, state.txn_id + 1, None, as_of,
                            snapshot_as_of=as_of)
        path = new_file_path(store.database, table_uuid, FileKind.SNAPSHOT, state.txn_id + 1)
        entry = write_parquet(store.objects, path, rows, meta)
        added.append(entry)
        summary.tables.append(table_uuid)
        summary.rows += entry.row_count
        summary.bytes += entry.size_bytes
    if added:
        store.catalog.commit(f"snapshot as of {as_of}", lambda current: [AddFile(e) for e in added])
    return summary
