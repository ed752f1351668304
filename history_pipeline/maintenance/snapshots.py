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

A row's ``superseded_at`` is its key's next version, so marks computed as of any U hold for every
T <= U.

Closing the newest interval [S, S') also stops the snapshot S' repeating it. Most of S' rows
were written inside [S, S') and are current at S': they are the interval's versions whose
``superseded_at`` is NULL. Those versions move into pieces of S' that hold versions
(``holds_versions``), and S' itself keeps only the rows written before S: each row is stored once,
the reads decode the same rows. Such a piece is a snapshot piece to every reader as of T >= S'
and one of the interval's version files to a read as of T in [S, S') and to row history; closing
the next interval marks it as a snapshot piece, and its marks as of that later end hold inside
[S, S') too. A key range whose versions do not equal the snapshot's rows (a snapshot written by a
type change fills a new supercolumn the versions lack) keeps its snapshot rows whole. When a
refresh makes S' for a table whose open interval [S, S') can be closed, S' is written by that
closing itself, from the interval's rows (S' is S overlaid with them), already split: it is never
written whole and read back.

``mark_open_intervals`` marks the open interval [S, frontier + 1) the same way once a
fraction of a snapshot's worth of versions in it are unmarked: a read up to its marks is a
filter, a later one overlays the few versions since on the rows current at the marks. The
rewritten files replace the old ones, so marking adds no bytes.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from history_pipeline.catalog.files import write_parquet
from history_pipeline.catalog.handle import DatabaseHandle
from history_pipeline.catalog.model import AddFile, CatalogState, FileEntry, FileKind, RemoveFile
from history_pipeline.execution import map_tasks, open_executor_store, store_for_tasks
from history_pipeline.io.store import ObjectStore, now
from history_pipeline.maintenance.snapshot_pieces import (
    PIECE_ROWS,
    key_range_filter,
    key_range_overlaps,
    key_ranges,
    write_snapshots,
)
from history_pipeline.schema import Supercolumn, replay_schema_history
from history_pipeline.supertable import (
    CLOSED_LAYOUT,
    DELETED,
    KEY,
    LT,
    SUPERSEDED,
    FileMetadata,
    layout_of,
    new_file_path,
    read_file_metadata,
    supertable_schema,
)
from history_pipeline.supertable.read import as_numpy, dataset_of

#: rows a task closing an interval reads at most (see ``StoreSettings.interval_piece_rows``)
INTERVAL_PIECE_ROWS = 4_000_000
#: stored bytes a task closing an interval reads at most, whatever its rows: a wide table's interval
#: is cut into more key ranges, so that a task's memory stays bounded as the rows' width grows (the
#: bench's 1M-live-row interval, about 3M rows, is some 50 MB and stays one piece)
INTERVAL_PIECE_BYTES = 256 * 1024 * 1024


@dataclass
class SnapshotSummary:
    as_of: int
    tables: list[str] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0
    #: files of closed intervals, and of open intervals, rewritten with their marks
    closed_files: int = 0
    marked_files: int = 0

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
                      spark: Any | None = None, piece_rows: int = PIECE_ROWS,
                      interval_rows: int = INTERVAL_PIECE_ROWS, mark_fraction: float = 0.0) -> SnapshotSummary:
    """Write a snapshot as of frontier + 1 for every table whose history since its last one is long,
    mark the intervals that closed, then the open intervals due a marking (``mark_fraction``).

    Each snapshot is written in pieces over key ranges by Spark tasks (in-process without a
    session; see ``snapshot_pieces``); the driver plans and commits them, never reading a row."""
    state: CatalogState = store.catalog.latest()
    as_of = state.frontier + 1
    summary = SnapshotSummary(as_of)
    supers = replay_schema_history(state.schema_history).supercolumns
    due = [(table_uuid, supers.get(table_uuid, ())) for table_uuid in due_tables(state, min_versions, ratio, force)]
    # a table whose open interval can be closed gets its snapshot written by the closing itself
    openings = {uuid: open_interval(state, uuid) for uuid, _ in due}
    closing = [(openings[uuid], supercolumns) for uuid, supercolumns in due if openings[uuid] is not None]
    summary.closed_files = _snapshot_by_closing(store, state, closing, spark, interval_rows, summary)
    due = [(uuid, supercolumns) for uuid, supercolumns in due if openings[uuid] is None]
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
    summary.tables.sort()
    summary.closed_files += close_intervals(store, spark=spark, piece_rows=interval_rows)
    summary.marked_files = mark_open_intervals(store, min_versions, ratio, mark_fraction, spark=spark,
                                               piece_rows=interval_rows)
    return summary


def _snapshot_by_closing(store: DatabaseHandle, state: CatalogState,
                         closing: Sequence[tuple[Interval, Sequence[Supercolumn]]], spark: Any | None,
                         piece_rows: int, summary: SnapshotSummary) -> int:
    """Write the snapshot as of each open interval's upper bound and close that interval in one
    pass over its rows (``CloseTask.write_next``): the snapshot's pieces come out split as closing
    leaves them, so it is neither written whole nor read back. One transaction adds the snapshots
    and replaces the intervals' files; a table whose files went meanwhile, or that got this
    snapshot meanwhile, is left out (the next refresh takes it). Returns how many files were
    replaced; the summary counts the snapshots' rows."""
    if not closing:
        return 0
    config = store_for_tasks(spark, store.objects)
    plans = [(interval, [replace(task, write_next=True) for task in plan_close(
        state, config, store.database, interval, supercolumns, piece_rows)]) for interval, supercolumns in closing]
    written = iter(map_tasks(spark, close_piece, [task for _, tasks in plans for task in tasks]))
    per_table = [(interval, [e for _ in tasks for e in next(written)]) for interval, tasks in plans]
    removed_at = now()

    def build(current: CatalogState) -> list[Any] | None:
        actions: list[Any] = []
        for interval, entries in per_table:
            if any(f.path not in current.files for f in interval.rewritten):
                continue  # a file went meanwhile (a merge, an erasure): its replacement would resurrect it
            points = current.files_of(interval.table_uuid, FileKind.SNAPSHOT)
            if any(f.snapshot_as_of == interval.upper for f in points):
                continue  # another refresh took this snapshot already
            actions += [RemoveFile(f.path, removed_at) for f in interval.rewritten]
            actions += [AddFile(e) for e in entries]
        return actions or None

    committed = store.catalog.commit("snapshot and close its interval", build)
    replaced = 0
    for interval, entries in per_table:
        if entries and all(e.path in committed.files for e in entries):
            snapshot = [e for e in entries if e.kind is FileKind.SNAPSHOT and e.snapshot_as_of == interval.upper]
            summary.tables.append(interval.table_uuid)
            summary.rows += sum(e.row_count for e in snapshot)
            summary.bytes += sum(e.size_bytes for e in snapshot)
            replaced += len(interval.rewritten)
    return replaced


def open_interval(state: CatalogState, table_uuid: str) -> Interval | None:
    """The table's open interval [newest snapshot, frontier + 1) and its files (the snapshot's and
    the version files since it); None without version files since the snapshot, or when one
    reaches below it (a merge across the snapshot: its reads keep the layered reconstruction)."""
    snapshots = [f for f in state.files_of(table_uuid, FileKind.SNAPSHOT) if f.snapshot_as_of is not None]
    newest = max((f.snapshot_as_of for f in snapshots), default=None)  # type: ignore[type-var]
    versions = [f for f in state.files_of(table_uuid, FileKind.VERSIONS)
                if f.row_count and f.min_t is not None and f.max_t is not None
                and (newest is None or f.max_t >= newest)]
    if not versions or any(newest is not None and f.min_t < newest for f in versions):  # type: ignore[operator]
        return None
    base = tuple(f for f in snapshots if f.snapshot_as_of == newest)
    return Interval(table_uuid, newest, state.frontier + 1, base + tuple(versions))


def marking_share(min_versions: int, ratio: float, snapshot_rows: int, fraction: float) -> float:
    """Unmarked versions that make an open interval due a marking: ``fraction`` of the versions
    that make its next snapshot due, or of its snapshot's rows (the live rows then, at least
    ``min_versions``) when snapshots are spaced further apart: a read as of the latest T then
    decodes at most this many versions beyond the rows current at the marks, however long the
    interval grows."""
    return max(1.0, fraction * max(min_versions, min(ratio, 1.0) * snapshot_rows))


def marking_due(state: CatalogState, min_versions: int, ratio: float, fraction: float) -> list[Interval]:
    """The open intervals to mark as of frontier + 1: those whose unmarked versions reach their
    ``marking_share`` (none at ``fraction`` 0, and none of a table whose snapshot is due: its
    interval closes instead)."""
    if fraction <= 0:
        return []
    due = []
    for table_uuid in sorted({f.table_uuid for f in state.files.values() if f.table_uuid}):
        interval = open_interval(state, table_uuid)
        if interval is None:
            continue
        # what versions_since_snapshot counts, from the interval's files (none straddles the snapshot)
        versions = [f for f in interval.files if f.kind is FileKind.VERSIONS]
        snapshot_rows = sum(f.row_count for f in interval.files if f.kind is FileKind.SNAPSHOT)
        snapshot_after = max(min_versions, ratio * snapshot_rows)
        if sum(f.row_count for f in versions) >= snapshot_after:
            continue
        unmarked = sum(f.row_count for f in versions if f.closed_until is None)
        if unmarked >= marking_share(min_versions, ratio, snapshot_rows, fraction):
            due.append(interval)
    return due


def mark_open_intervals(store: DatabaseHandle, min_versions: int, ratio: float, fraction: float,
                        spark: Any | None = None, piece_rows: int = INTERVAL_PIECE_ROWS) -> int:
    """Mark the open intervals due a marking (``marking_due``) as of frontier + 1, as
    ``close_intervals`` marks closed ones; returns how many files were replaced."""
    state: CatalogState = store.catalog.latest()
    return _mark(store, state, marking_due(state, min_versions, ratio, fraction), spark, piece_rows)


@dataclass(frozen=True)
class Interval:
    """The files of one closed interval [lower, upper) of a table: snapshot ``lower`` (none when
    ``lower`` is None: the table's start) and the version files inside it."""

    table_uuid: str
    lower: int | None
    upper: int
    files: tuple[FileEntry, ...]
    #: the snapshot ``upper`` whole, when closing stops it repeating the interval (the newest
    #: closed interval, its snapshot not yet marked): see the module docstring
    next_snapshot: tuple[FileEntry, ...] = ()

    @property
    def unmarked(self) -> tuple[FileEntry, ...]:
        """Files not marked for this interval (marks as of a later end hold too: a piece holding
        versions is marked for the next interval), or marked in an older row order (laid out again)."""
        return tuple(f for f in self.files
                     if f.closed_until is None or f.closed_until < self.upper or f.closed_layout != CLOSED_LAYOUT)

    @property
    def rewritten(self) -> tuple[FileEntry, ...]:
        """The files closing rewrites: all but the pieces of snapshot ``upper`` holding versions
        that are marked already, as of it or a later end (read for the other rows' marks only:
        their own rows are current at ``upper``, so closing would only lose their later marks)."""
        settled = self.settled
        return tuple(f for f in self.files if f.path not in settled)

    @property
    def settled(self) -> frozenset[str]:
        """Paths of the pieces of snapshot ``upper`` holding versions that closing leaves as they are."""
        unmarked = {f.path for f in self.unmarked}
        return frozenset(f.path for f in self.files
                         if f.holds_versions and f.snapshot_as_of == self.upper and f.path not in unmarked)


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
    for f in snapshots:  # versions stored in the next snapshot's pieces belong inside the interval too
        if f.holds_versions and f.row_count:
            inside.setdefault(bounds.index(f.snapshot_as_of), []).append(f)  # type: ignore[arg-type]
    found = []
    for i, upper in enumerate(bounds):
        lower = bounds[i - 1] if i else None
        if i in straddling:
            continue
        base = [f for f in snapshots if lower is not None and f.snapshot_as_of == lower]
        interval = Interval(table_uuid, lower, upper, tuple(base + inside.get(i, [])))
        if interval.unmarked:
            whole = [f for f in snapshots if f.snapshot_as_of == upper]
            if (i == len(bounds) - 1 and all(not f.holds_versions and f.closed_until is None for f in whole)
                    and any(f.kind is FileKind.VERSIONS for f in interval.files)):
                interval = replace(interval, next_snapshot=tuple(whole))
            found.append(interval)
    return found


@dataclass(frozen=True)
class CloseTask:
    """One key range ``[low, high)`` (None: unbounded) of one closed interval [lower, upper): its
    rows in ``files`` (the interval's files that may hold such keys) get ``superseded_at`` and are
    written back in the closed layout, one file per kind of file they came from."""

    store_config: dict[str, Any]
    database: str
    table_uuid: str
    supercolumns: tuple[Supercolumn, ...]
    lower: int | None
    upper: int
    files: tuple[FileEntry, ...]
    low: int | None
    high: int | None
    txn_hint: int
    #: write the snapshot's file even when the range holds none of its rows (the first range), so
    #: that the snapshot point, which bounds the intervals, never leaves the catalog
    always: bool
    #: the pieces of snapshot ``upper`` that may hold the range's keys, when closing splits it
    #: (``Interval.next_snapshot``); empty: no split
    next_files: tuple[FileEntry, ...] = ()
    #: files read for the marks of the others but not written again (``Interval.settled``)
    settled: frozenset[str] = frozenset()
    #: the interval is the open one and snapshot ``upper`` is due: write its pieces in the task's
    #: range from the interval's own rows, already split (``_snapshot_by_closing``), instead of
    #: writing it whole and splitting it again
    write_next: bool = False


def plan_close(state: CatalogState, store_config: dict[str, Any], database: str, interval: Interval,
               supercolumns: Sequence[Supercolumn], piece_rows: int) -> list[CloseTask]:
    """The key ranges closing ``interval``: as many as its rows divided by ``piece_rows``, or its
    stored bytes by ``INTERVAL_PIECE_BYTES`` when that is more (at least one), each with only the
    files that may hold its keys."""
    rows = sum(f.row_count for f in interval.files)
    stored = sum(f.size_bytes for f in interval.files)
    parts = max(1, -(-rows // max(1, piece_rows)), -(-stored // INTERVAL_PIECE_BYTES))
    ranges = key_ranges(interval.files, parts)
    return [CloseTask(store_config, database, interval.table_uuid, tuple(supercolumns), interval.lower,
                      interval.upper, tuple(f for f in interval.files if key_range_overlaps(f, low, high)),
                      low, high, state.txn_id + 1, always=(i == 0),
                      next_files=tuple(f for f in interval.next_snapshot if key_range_overlaps(f, low, high)),
                      settled=interval.settled)
            for i, (low, high) in enumerate(ranges)]


def superseded_at(keys: np.ndarray, times: np.ndarray) -> pa.Array:
    """For each row, the t of its key's next row among all of them (NULL when none)."""
    order = np.lexsort((times, keys))
    sorted_keys, sorted_times = keys[order], times[order]
    has_next = np.zeros(len(keys), dtype=bool)
    has_next[:-1] = sorted_keys[:-1] == sorted_keys[1:]
    following = np.zeros(len(keys), dtype=np.int64)
    following[:-1] = sorted_times[1:]
    values, valid = np.empty_like(following), np.empty_like(has_next)
    values[order], valid[order] = following, has_next
    return pa.array(values, pa.int64(), mask=~valid)


def close_piece(task: CloseTask) -> tuple[FileEntry, ...]:
    """Read the task's key range of its interval once, give every row its ``superseded_at``, and
    write the rows of each kind of file (the snapshot's, the versions', a snapshot piece's holding
    versions) as one marked file in the closed layout, every footer field of the files it replaces
    kept; when the task splits the next snapshot, the versions current at its end move into a
    piece of it (see the module docstring). Returns the written files' entries."""
    objects = open_executor_store(task.store_config)
    schema = supertable_schema(task.supercolumns)
    in_range = key_range_filter(task.low, task.high)
    # settled files are read for the others' marks but never written: a group of their own
    groups: dict[tuple[FileKind, int | None, bool, bool], list[FileEntry]] = {}
    for f in task.files:
        groups.setdefault((f.kind, f.snapshot_as_of, f.holds_versions, f.path in task.settled), []).append(f)
    parts = [(group, files, dataset_of(objects, files, schema).to_table(filter=in_range))
             for group, files in sorted(groups.items(), key=lambda g: (g[0][0].value, g[0][1] or 0, *g[0][2:]))]
    if not parts:
        return ()
    superseded = superseded_at(
        np.concatenate([as_numpy(rows.column(KEY)) for _, _, rows in parts]),
        np.concatenate([as_numpy(rows.column(LT)) for _, _, rows in parts]))
    outputs: list[tuple[FileMetadata, pa.Table]] = []
    #: (the output the rows were taken from, its files, the versions current at ``upper``)
    tails: list[tuple[int, list[FileEntry], pa.Table]] = []
    #: with ``write_next``: the base snapshot's rows current at ``upper`` (marked, all NULL)
    kept: list[pa.Table] = []
    start = 0
    for (kind, snapshot_as_of, holds, settled), files, rows in parts:
        mine = superseded.slice(start, rows.num_rows)
        start += rows.num_rows
        if settled:
            continue
        marked = rows.append_column(pa.field(SUPERSEDED, pa.int64()), mine)
        current = pc.and_(pc.is_null(mine), pc.invert(pc.fill_null(rows.column(DELETED), False)))
        if (task.next_files or task.write_next) and kind is FileKind.VERSIONS:
            tails.append((len(outputs), files, marked.filter(current)))
            marked = marked.filter(pc.invert(current))
        elif task.write_next and kind is FileKind.SNAPSHOT:  # the base: its rows still current at ``upper``
            kept.append(marked.filter(current))
        outputs.append((_merged_metadata(objects, task, kind, snapshot_as_of, files, holds), marked))
    if task.write_next:
        outputs += _next_snapshot_from_interval(objects, task, schema, kept, tails)
    elif task.next_files:
        replacing, moved = _split_next_snapshot(objects, task, schema, in_range, tails)
        if not moved:  # the versions stay in the files they came from
            for at, _, rows in tails:
                meta, rest = outputs[at]
                outputs[at] = (meta, pa.concat_tables([rest, rows]))
        outputs += replacing
    written = []
    for meta, table in outputs:
        if table.num_rows == 0 and not (task.always and meta.kind is FileKind.SNAPSHOT and not meta.holds_versions):
            continue
        laid_out, row_groups = layout_of(table, meta.snapshot_as_of, meta.holds_versions)
        path = new_file_path(task.database, task.table_uuid, meta.kind, task.txn_hint)
        written.append(write_parquet(objects, path, laid_out, meta, row_groups or None))
    return tuple(written)


def _split_next_snapshot(objects: ObjectStore, task: CloseTask, schema: pa.Schema, in_range: Any,
                         tails: list[tuple[int, list[FileEntry], pa.Table]]
                         ) -> tuple[list[tuple[FileMetadata, pa.Table]], bool]:
    """The files replacing the next snapshot's rows in the task's range, and whether the versions
    moved into them: a piece of the rows written before the interval and a piece holding the
    interval's versions current at its end (``tails``, each with the version files it came from),
    both marked as of ``upper`` (every row current there). Only when the versions equal the
    snapshot's rows written inside the interval, column for column; otherwise the snapshot's rows
    stay whole (and the versions in their files)."""
    whole = dataset_of(objects, task.next_files, schema).to_table(filter=in_range)
    inside = (pc.greater_equal(whole.column(LT), task.lower) if task.lower is not None
              else pa.array(np.ones(whole.num_rows, dtype=bool)))
    before, written_inside = whole.filter(pc.invert(inside)), whole.filter(inside)
    versions = pa.concat_tables([t for _, _, t in tails]) if tails else schema.empty_table().append_column(
        pa.field(SUPERSEDED, pa.int64()), pa.array([], pa.int64()))
    by_key = [(KEY, "ascending")]
    split = versions.select(schema.names).sort_by(by_key).equals(written_inside.select(schema.names).sort_by(by_key))
    snapshot_meta = _merged_metadata(objects, task, FileKind.SNAPSHOT, task.upper, list(task.next_files), False)
    if not split:
        return [(snapshot_meta, _with_no_marks(whole))], False
    outputs = [(snapshot_meta, _with_no_marks(before))]
    if versions.num_rows:
        sources = sorted({f.path: f for _, files, _ in tails for f in files}.values(), key=lambda f: f.path)
        meta = _merged_metadata(objects, task, FileKind.VERSIONS, None, sources, False)
        outputs.append((replace(meta, kind=FileKind.SNAPSHOT, snapshot_as_of=task.upper, holds_versions=True),
                        versions))
    return outputs, True


def _next_snapshot_from_interval(objects: ObjectStore, task: CloseTask, schema: pa.Schema, kept: list[pa.Table],
                                 tails: list[tuple[int, list[FileEntry], pa.Table]]
                                 ) -> list[tuple[FileMetadata, pa.Table]]:
    """Snapshot ``upper``'s files in the task's range, made from the interval's rows as closing
    leaves them split (see ``_split_next_snapshot``): a piece of the base snapshot's rows still
    current at ``upper`` and a piece holding the interval's versions current there. Snapshot
    ``upper`` is by definition those rows (the base overlaid with the versions since it), so
    nothing is compared and no whole snapshot is written first."""
    marked_schema = schema.append(pa.field(SUPERSEDED, pa.int64()))
    before = pa.concat_tables([t.select(marked_schema.names).cast(marked_schema) for t in kept]) if kept \
        else marked_schema.empty_table()
    meta = FileMetadata(task.database, task.table_uuid, FileKind.SNAPSHOT, task.txn_hint, None, task.upper,
                        snapshot_as_of=task.upper, closed_until=task.upper, closed_layout=CLOSED_LAYOUT)
    outputs = [(meta, before)]
    versions = [t for _, _, t in tails if t.num_rows]
    if versions:
        sources = sorted({f.path: f for _, files, _ in tails for f in files}.values(), key=lambda f: f.path)
        held = _merged_metadata(objects, task, FileKind.VERSIONS, None, sources, False)
        outputs.append((replace(held, kind=FileKind.SNAPSHOT, snapshot_as_of=task.upper, holds_versions=True),
                        pa.concat_tables(versions)))
    return outputs


def _with_no_marks(rows: pa.Table) -> pa.Table:
    """A snapshot's rows marked as of its own t: none is superseded there."""
    return rows.append_column(pa.field(SUPERSEDED, pa.int64()), pa.nulls(rows.num_rows, pa.int64()))


def _merged_metadata(objects: ObjectStore, task: CloseTask, kind: FileKind, snapshot_as_of: int | None,
                     files: Sequence[FileEntry], holds_versions: bool) -> FileMetadata:
    """The footer of the file replacing ``files``' rows in the task's range: theirs (the first
    one's fields; t bounds, segments and retention's purge point over all), marked closed."""
    metas = [m for m, _ in (read_file_metadata(objects, f.path) for f in files) if m is not None]
    first = files[0]
    meta = metas[0] if metas else FileMetadata(
        task.database, first.table_uuid, kind, task.txn_hint, first.min_t,
        None if first.max_t is None else first.max_t + 1, snapshot_as_of=snapshot_as_of)
    lowers = [m.lower for m in metas if m.lower is not None]
    uppers = [m.upper for m in metas if m.upper is not None]
    purges = [m.earliest for m in metas if m.earliest is not None]
    return replace(meta, txn_id=task.txn_hint, replaces=tuple(f.path for f in files),
                   lower=min(lowers) if lowers else meta.lower, upper=max(uppers) if uppers else meta.upper,
                   segments=tuple(sorted({s for f in files for s in f.segments})),
                   earliest=max(purges) if purges else None,
                   closed_until=task.upper, closed_layout=CLOSED_LAYOUT, holds_versions=holds_versions)


#: intervals marked per call and table, newest first: a store written before closed intervals
#: existed is marked over several snapshot refreshes, not in one long rewrite
MAX_INTERVALS_PER_CALL = 4


def close_intervals(store: DatabaseHandle, spark: Any | None = None, max_intervals: int = MAX_INTERVALS_PER_CALL,
                    piece_rows: int = INTERVAL_PIECE_ROWS) -> int:
    """Mark closed intervals' files (see the module docstring), up to ``max_intervals`` per table
    and newest first: each interval is rewritten over key ranges by Spark tasks (in-process
    without a session), each reading its range once, so no process holds an interval; one
    transaction replaces all the files. Returns how many files were replaced. A file removed
    meanwhile (a merge, an erasure) leaves the catalog as it was: the next call tries again."""
    state: CatalogState = store.catalog.latest()
    intervals = [interval for table_uuid in sorted({f.table_uuid for f in state.files.values() if f.table_uuid})
                 for interval in closed_intervals(state, table_uuid)[::-1][:max_intervals]]
    return _mark(store, state, intervals, spark, piece_rows)


def _mark(store: DatabaseHandle, state: CatalogState, intervals: Sequence[Interval], spark: Any | None,
          piece_rows: int) -> int:
    """Rewrite the files of ``intervals`` marked as of each one's upper bound, over key ranges by
    Spark tasks, and replace them in one transaction; returns how many files were replaced (0
    when one went meanwhile)."""
    if not intervals:
        return 0
    intervals = _disjoint(intervals)
    supers = replay_schema_history(state.schema_history).supercolumns
    config = store_for_tasks(spark, store.objects)
    tasks = [task for interval in intervals
             for task in plan_close(state, config, store.database, interval,
                                    supers.get(interval.table_uuid, ()), piece_rows)]
    added = [entry for entries in map_tasks(spark, close_piece, tasks) for entry in entries]
    replaced = sorted({f.path for interval in intervals for f in interval.rewritten + interval.next_snapshot})
    removed_at = now()

    def build(current: CatalogState) -> list[Any] | None:
        if any(old not in current.files for old in replaced):
            return None  # a file went meanwhile: its replacement would resurrect it
        return [*(RemoveFile(old, removed_at) for old in replaced), *(AddFile(new) for new in added)]

    committed = store.catalog.commit("close intervals", build)
    return len(replaced) if all(new.path in committed.files for new in added) else 0


def _disjoint(intervals: Sequence[Interval]) -> list[Interval]:
    """The intervals, leaving out any that shares a file with one before it (a piece holding
    versions is in two intervals): one rewrite per file per transaction; the next call marks the
    rest."""
    taken: set[str] = set()
    chosen = []
    for interval in intervals:
        paths = {f.path for f in interval.rewritten + interval.next_snapshot}
        if paths & taken:
            continue
        taken |= paths
        chosen.append(interval)
    return chosen
