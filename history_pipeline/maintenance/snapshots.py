"""Periodic table snapshots: the state of a table at one T, so reads stop growing with history.

A query as of T reads the newest snapshot at or below T plus the versions
written since it. When the versions written since a table's newest snapshot
outnumber ``ratio`` times its live rows (and at least ``min_versions``), a new
snapshot as of ``frontier + 1`` is written and committed.

Once a snapshot S' exists, the interval [S, S') back to the previous snapshot S (or the table's
start) is *closed*: no version can join it. ``close_intervals`` rewrites the files of each closed
interval (snapshot S and the version files inside it) with ``superseded_at``, the t of the row's
key's next version below S' (NULL: none), and marks them ``closed_until = S'``; a read as of T in
[S, S') is then two filtered scans (``superseded_at`` NULL or >= T), no join.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from history_pipeline.catalog.files import write_parquet
from history_pipeline.catalog.handle import DatabaseHandle
from history_pipeline.catalog.model import AddFile, CatalogState, FileEntry, FileKind, RemoveFile
from history_pipeline.errors import CatalogError
from history_pipeline.io.store import ObjectStore, now
from history_pipeline.maintenance.snapshot_pieces import PIECE_ROWS, write_snapshots
from history_pipeline.schema import replay_schema_history
from history_pipeline.supertable import (
    CLOSED_LAYOUT,
    KEY,
    LT,
    SUPERSEDED,
    FileMetadata,
    closed_layout,
    new_file_path,
    read_file_metadata,
)
from history_pipeline.supertable.read import dataset_of


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


def due_tables(state: CatalogState, min_versions: int, ratio: float, force: bool = False) -> list[str]:
    """The tables that get a snapshot as of frontier + 1: those whose history since their last one
    is long (``force``: every table with versions since it)."""
    as_of = state.frontier + 1
    due = []
    for table_uuid in sorted({f.table_uuid for f in state.files.values() if f.table_uuid}):
        since, snapshot_rows, newest = versions_since_snapshot(state, table_uuid)
        if newest == as_of or since == 0:
            continue
        if not force and since < max(min_versions, ratio * snapshot_rows):
            continue
        due.append(table_uuid)
    return due


def refresh_snapshots(store: DatabaseHandle, min_versions: int, ratio: float, force: bool = False,
                      spark: Any | None = None, piece_rows: int = PIECE_ROWS) -> SnapshotSummary:
    """Write a snapshot as of frontier + 1 for every table whose history since its last one is long.

    Each snapshot is written in pieces over key ranges by Spark tasks (in-process without a
    session; see ``snapshot_pieces``); the driver plans and commits them, never reading a row."""
    state: CatalogState = store.catalog.latest()
    as_of = state.frontier + 1
    summary = SnapshotSummary(as_of)
    supers = replay_schema_history(state.schema_history).supercolumns
    due = [(table_uuid, supers.get(table_uuid, ())) for table_uuid in due_tables(state, min_versions, ratio, force)]
    written = write_snapshots(spark, state, store.objects, store.database, due, as_of, piece_rows)

    def build(current: CatalogState) -> list[Any] | None:
        actions: list[Any] = []
        for table in written:
            if any(path not in current.files for path in table.read):
                continue  # a file read went meanwhile (an erasure may have replaced it): next time
            if any(f.snapshot_as_of == as_of for f in current.files_of(table.table_uuid, FileKind.SNAPSHOT)):
                continue  # another refresh took this snapshot already
            actions += [AddFile(e) for e in table.entries]
        return actions or None

    if written:
        committed = store.catalog.commit(f"snapshot as of {as_of}", build)
        for table in written:
            if table.entries and all(e.path in committed.files for e in table.entries):
                summary.tables.append(table.table_uuid)
                summary.rows += sum(e.row_count for e in table.entries)
                summary.bytes += sum(e.size_bytes for e in table.entries)
    close_intervals(store)
    return summary


@dataclass(frozen=True)
class Interval:
    """The files of one closed interval [lower, upper) of a table: snapshot ``lower`` (none when
    ``lower`` is None: the table's start) and the version files inside it."""

    table_uuid: str
    lower: int | None
    upper: int
    files: tuple[FileEntry, ...]

    @property
    def unmarked(self) -> tuple[FileEntry, ...]:
        """Files not marked for this interval, or marked in an older row order (laid out again)."""
        return tuple(f for f in self.files if f.closed_until != self.upper or f.closed_layout != CLOSED_LAYOUT)


def closed_intervals(state: CatalogState, table_uuid: str) -> list[Interval]:
    """The table's closed intervals that have files not yet marked for them. An interval with a
    version file reaching outside it (a merge across a snapshot) is left unmarked: its reads keep
    the layered reconstruction."""
    snapshots = state.files_of(table_uuid, FileKind.SNAPSHOT)
    bounds = sorted({f.snapshot_as_of for f in snapshots if f.snapshot_as_of is not None})
    if not bounds:
        return []
    # interval i is [bounds[i-1], bounds[i]) (i = 0: the table's start); len(bounds) is the open one
    inside: dict[int, list[FileEntry]] = {}
    straddling: set[int] = set()
    for f in state.files_of(table_uuid, FileKind.VERSIONS):
        if not f.row_count or f.min_t is None or f.max_t is None:
            continue
        first, last = bisect.bisect_right(bounds, f.min_t), bisect.bisect_right(bounds, f.max_t)
        inside.setdefault(first, []).append(f)
        if first != last:
            straddling.update(range(first, last + 1))
    found = []
    for i, upper in enumerate(bounds):
        lower = bounds[i - 1] if i else None
        if i in straddling:
            continue
        base = [f for f in snapshots if lower is not None and f.snapshot_as_of == lower]
        interval = Interval(table_uuid, lower, upper, tuple(base + inside.get(i, [])))
        if interval.unmarked:
            found.append(interval)
    return found


def superseded_at(store: ObjectStore, files: Sequence[FileEntry]) -> pa.Table:
    """(file index, key, t, superseded_at) of every row of ``files``, ordered by file, key, t:
    the t of the key's next row among all of them (DuckDB's window; NULL when none)."""
    schema = pa.schema([pa.field(KEY, pa.int64()), pa.field(LT, pa.int64())])
    parts = []
    for i, f in enumerate(files):
        rows = dataset_of(store, [f], schema).to_table(columns=[KEY, LT])
        parts.append(rows.append_column("f", pa.repeat(pa.scalar(i, pa.int32()), rows.num_rows)))
    con = duckdb.connect()
    try:
        con.register("interval_rows", pa.concat_tables(parts))
        return con.sql(
            f"SELECT f, {KEY}, {LT}, lead({LT}) OVER (PARTITION BY {KEY} ORDER BY {LT}) AS {SUPERSEDED} "
            f"FROM interval_rows ORDER BY f, {KEY}, {LT}"
        ).to_arrow_table()
    finally:
        con.close()


def mark_file(store: ObjectStore, database: str, entry: FileEntry, superseded: pa.Table, upper: int,
              txn_hint: int) -> FileEntry:
    """Rewrite one file of a closed interval with its ``superseded_at`` column (``superseded`` holds
    this file's rows in (key, t) order) and the ``closed_until`` mark, its rows in the closed
    layout (``supertable.closed_layout``); every other column and footer field is kept."""
    fs, _ = store.arrow_filesystem()
    table = pq.read_table(store.full_path(entry.path), filesystem=fs)
    if SUPERSEDED in table.column_names:
        table = table.drop_columns([SUPERSEDED])
    table = table.sort_by([(KEY, "ascending"), (LT, "ascending")])
    if not table.column(KEY).equals(superseded.column(KEY)):
        raise CatalogError(f"{entry.path} no longer holds the rows the catalog lists for it; run verify()")
    table = table.append_column(pa.field(SUPERSEDED, pa.int64()), superseded.column(SUPERSEDED))
    meta, _ = read_file_metadata(store, entry.path)
    if meta is None:
        meta = FileMetadata(database, entry.table_uuid, entry.kind, txn_hint, entry.min_t,
                            None if entry.max_t is None else entry.max_t + 1, segments=entry.segments,
                            snapshot_as_of=entry.snapshot_as_of)
    meta = replace(meta, txn_id=txn_hint, replaces=(entry.path,), closed_until=upper, closed_layout=CLOSED_LAYOUT)
    path = new_file_path(database, entry.table_uuid or "", entry.kind, txn_hint)
    table, row_groups = closed_layout(table, entry.snapshot_as_of)
    return write_parquet(store, path, table, meta, row_groups)


#: intervals marked per call and table, newest first: a store written before closed intervals
#: existed is marked over several snapshot refreshes, not in one long transaction
MAX_INTERVALS_PER_CALL = 4


def close_intervals(store: DatabaseHandle, max_intervals: int = MAX_INTERVALS_PER_CALL) -> int:
    """Mark closed intervals' files (see the module docstring), up to ``max_intervals`` per table
    and newest first, in one transaction that replaces them; returns how many files were
    rewritten. A file removed meanwhile (a merge, an erasure) leaves the catalog as it was: the
    next call tries again."""
    state: CatalogState = store.catalog.latest()
    txn_hint = state.txn_id + 1
    replaced: list[tuple[str, FileEntry]] = []
    for table_uuid in sorted({f.table_uuid for f in state.files.values() if f.table_uuid}):
        for interval in closed_intervals(state, table_uuid)[::-1][:max_intervals]:
            unmarked = {f.path for f in interval.unmarked}
            rows = superseded_at(store.objects, interval.files)
            index = rows.column("f")
            for i, f in enumerate(interval.files):
                if f.path in unmarked:
                    mine = rows.filter(pc.equal(index, i))
                    replaced.append((f.path, mark_file(store.objects, store.database, f, mine, interval.upper,
                                                       txn_hint)))
    if not replaced:
        return 0
    removed_at = now()

    def build(current: CatalogState) -> list[Any] | None:
        if any(old not in current.files for old, _ in replaced):
            return None  # a file went meanwhile: its replacement would resurrect it
        return [*(RemoveFile(old, removed_at) for old, _ in replaced), *(AddFile(new) for _, new in replaced)]

    committed = store.catalog.commit("close intervals", build)
    return len(replaced) if all(new.path in committed.files for _, new in replaced) else 0
