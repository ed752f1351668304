"""Merge: many small version files of a table become fewer large ones, in one transaction.

Merging only regroups rows (sorted by key, timestamp), so every answer at every
T is unchanged; the replaced files become tombstones. The merged file's footer
names the files it replaces (for the record; a rebuild follows the commit records).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from history_pipeline.catalog.files import write_parquet
from history_pipeline.catalog.handle import DatabaseHandle
from history_pipeline.catalog.model import AddFile, CatalogState, FileEntry, FileKind, RemoveFile
from history_pipeline.execution import map_tasks, open_executor_store, store_for_tasks
from history_pipeline.io.store import now
from history_pipeline.schema import Supercolumn, replay_schema_history
from history_pipeline.supertable import (
    CLOSED_LAYOUT,
    KEY,
    LT,
    SUPERSEDED,
    FileMetadata,
    closed_layout,
    new_file_path,
    read_file_metadata,
    supertable_schema,
)
from history_pipeline.supertable.read import dataset_of, footer

DEFAULT_SMALL_FILE_BYTES = 32 * 1024 * 1024
DEFAULT_TARGET_ROWS = 2_000_000


@dataclass(frozen=True)
class MergeTask:
    store_config: dict[str, Any]
    database: str
    table_uuid: str
    files: tuple[FileEntry, ...]
    supercolumns: tuple[Supercolumn, ...]
    txn_hint: int
    target_rows: int


@dataclass
class MergeSummary:
    tables: list[str] = field(default_factory=list)
    files_removed: int = 0
    files_added: int = 0
    bytes_removed: int = 0
    bytes_added: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "tables": list(self.tables),
            "files_removed": self.files_removed,
            "files_added": self.files_added,
            "bytes_removed": self.bytes_removed,
            "bytes_added": self.bytes_added,
        }


def merge_table_task(task: MergeTask) -> tuple[FileEntry, ...]:
    """Read a table's small files, sort by (key, t), write them back as large files."""
    store = open_executor_store(task.store_config)
    schema = supertable_schema(task.supercolumns)
    # files of one closed interval stay marked (merging only regroups its rows, so each row's
    # superseded_at still holds); anything else loses the column and the mark
    closed = task.files[0].closed_until
    if closed is not None and all(f.closed_until == closed and SUPERSEDED in footer(store, f.path).columns
                                  for f in task.files):
        schema = schema.append(pa.field(SUPERSEDED, pa.int64()))
    else:
        closed = None
    rows = dataset_of(store, task.files, schema).to_table().sort_by([(KEY, "ascending"), (LT, "ascending")])
    replaces = tuple(f.path for f in task.files)
    segments = tuple(sorted({s for f in task.files for s in f.segments}))
    # rows a retention kept stay marked with its purge point (verify compares it with the catalog)
    purges = [m.earliest for m, _ in (read_file_metadata(store, f.path) for f in task.files) if m and m.earliest]
    entries = []
    for start in range(0, max(rows.num_rows, 1), task.target_rows):
        part = rows.slice(start, task.target_rows)
        meta = FileMetadata(
            database=task.database,
            table_uuid=task.table_uuid,
            kind=FileKind.VERSIONS,
            txn_id=task.txn_hint,
            lower=min(f.min_t for f in task.files if f.min_t is not None),
            upper=max(f.max_t for f in task.files if f.max_t is not None) + 1,
            segments=segments,
            replaces=replaces,
            earliest=max(purges, default=None),
            closed_until=closed,
            closed_layout=CLOSED_LAYOUT if closed is not None else None,
        )
        path = new_file_path(task.database, task.table_uuid, FileKind.VERSIONS, task.txn_hint)
        # a marked part keeps the closed layout (its row groups skippable by time, see snapshots.py)
        part, row_groups = closed_layout(part, None) if closed is not None else (part, None)
        entries.append(write_parquet(store, path, part, meta, row_groups))
    return tuple(entries)


def plan_merges(
    state: CatalogState, store_config: dict[str, Any], database: str, small_file_bytes: int, target_rows: int
) -> list[MergeTask]:
    """One task per table and closed interval (files marked ``closed_until`` the same snapshot, or
    unmarked) that has at least two small version files: merging within an interval keeps the mark."""
    supers = replay_schema_history(state.schema_history).supercolumns
    tasks = []
    for table_uuid in sorted({f.table_uuid for f in state.files.values() if f.table_uuid}):
        small = [
            f
            for f in state.files_of(table_uuid, FileKind.VERSIONS)
            if f.size_bytes < small_file_bytes and f.row_count > 0
        ]
        marks = sorted({f.closed_until for f in small}, key=lambda m: (m is not None, m or 0))
        for mark in marks:
            group = [f for f in small if f.closed_until == mark]
            if len(group) < 2:
                continue
            tasks.append(
                MergeTask(store_config, database, table_uuid, tuple(group), tuple(supers.get(table_uuid, ())),
                          state.txn_id + 1, target_rows)
            )
    return tasks


def merge(
    store: DatabaseHandle,
    spark: Any | None = None,
    small_file_bytes: int = DEFAULT_SMALL_FILE_BYTES,
    target_rows: int = DEFAULT_TARGET_ROWS,
    on_step: Any = None,
) -> MergeSummary:
    """Merge small version files of every table of ``store`` (on Spark when a session is given)."""
    state = store.catalog.latest()
    tasks = plan_merges(state, store_for_tasks(spark, store.objects), store.database, small_file_bytes, target_rows)
    summary = MergeSummary()
    if not tasks:
        return summary
    results = map_tasks(spark, merge_table_task, tasks)
    if on_step:
        on_step("files_written")
    removed_at = now()

    def build(current: CatalogState) -> Sequence[Any]:
        actions: list[Any] = []
        for task, added in zip(tasks, results, strict=True):
            actions += [RemoveFile(f.path, removed_at) for f in task.files]  # fails cleanly if gone
            actions += [AddFile(e) for e in added]
        return actions

    store.catalog.commit("merge", build)
    for task, added in zip(tasks, results, strict=True):
        if task.table_uuid not in summary.tables:
            summary.tables.append(task.table_uuid)
        summary.files_removed += len(task.files)
        summary.bytes_removed += sum(f.size_bytes for f in task.files)
        summary.files_added += len(added)
        summary.bytes_added += sum(e.size_bytes for e in added)
    return summary
