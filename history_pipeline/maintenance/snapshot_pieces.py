"""A table's snapshot written as pieces over key ranges, one task each, so no process holds the table.

The driver plans: which files a snapshot as of T reads (``select_files``: the newest snapshot
below T and the version files since), and where to cut the key range so that each piece reads
about ``piece_rows`` rows, in at most ``MAX_PIECE_TASKS`` pieces (cuts from the files' key
statistics, see :func:`key_cuts_by_rows`). Each piece is a task (:func:`write_piece`, run by
``execution.map_tasks`` on Spark executors or in-process) that opens the store from configuration
and walks its key range in steps of about ``piece_rows`` rows read (row groups outside a step are
skipped by their statistics), overlays each step into the live image as of T and appends it to a
snapshot file written through the object-store layer (a new file once one holds ``piece_rows``
live rows), and returns their catalog entries. The pieces of one snapshot share
``snapshot_as_of``; every reader takes all files of a table with that ``snapshot_as_of`` as the
snapshot, so a snapshot of one file and one of many answer alike. The driver commits the entries; it never sees a row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from history_pipeline.catalog.files import entry_of, may_hold_keys, select_files
from history_pipeline.catalog.model import CatalogState, FileEntry, FileKind
from history_pipeline.execution import map_tasks, open_executor_store, store_for_tasks
from history_pipeline.schema import Supercolumn
from history_pipeline.supertable import KEY, LT, FileMetadata, new_file_path, supertable_schema, write_file_parts
from history_pipeline.supertable.read import dataset_of, overlay

#: tasks one table's snapshot is written by at most: a first snapshot of a long history reads many
#: versions, and pieces bounded by the rows they read were many small files (160 at 40M versions,
#: which every later compaction part then had to open); a task reads its range in steps instead
MAX_PIECE_TASKS = 16

#: rows a piece's step reads at most (snapshot rows plus versions since, in its key range), when
#: keys are spread as the files' statistics say, and the live rows a piece file holds at most. A
#: snapshot is due once the versions since the last one reach the live rows, so a step of this
#: many rows read holds about half as many live rows; at the bench's row width (6 columns) a
#: Python worker's peak grew by ~100 MiB for such a step, far inside an executor.
PIECE_ROWS = 250_000


@dataclass(frozen=True)
class PieceTask:
    """One piece of one table's snapshot as of ``as_of``: the live rows whose key is in
    ``[low, high)`` (None: unbounded), read from ``snapshot`` (the newest snapshot's files below
    ``as_of`` that may hold such keys) and ``versions`` (the version files since it)."""

    store_config: dict[str, Any]
    database: str
    table_uuid: str
    supercolumns: tuple[Supercolumn, ...]
    as_of: int
    base_as_of: int | None
    snapshot: tuple[FileEntry, ...]
    versions: tuple[FileEntry, ...]
    low: int | None
    high: int | None
    txn_hint: int
    #: write the file even when the range holds no live row (piece 0, so that a table with no
    #: live rows still has a snapshot at ``as_of``)
    always: bool
    #: rows one step of the task reads at most: the range is read in sub-ranges of about this
    #: many rows, and a file is closed once it holds this many live rows
    step_rows: int = PIECE_ROWS


def key_cuts_by_rows(files: Sequence[FileEntry], parts: int) -> tuple[int, ...]:
    """Where to cut the keys of ``files`` into ``parts`` ranges holding about as many rows each:
    every file counts its rows as spread evenly over its [min_key, max_key], and the cuts are the
    quantiles of that distribution (one file: equal widths, as ``frames.key_cuts``; a previous
    snapshot in pieces or many version files: their actual spread). Keys below the first cut
    belong to the first range, at or above the last to the last; () without key statistics."""
    spans = [(float(f.min_key), float(f.max_key) + 1.0, float(f.row_count)) for f in files
             if f.min_key is not None and f.max_key is not None and f.row_count > 0]
    if parts < 2 or not spans:
        return ()
    lows, highs, rows = (np.array(column) for column in zip(*spans, strict=True))
    # the rows below a key are piecewise linear in it: its slope steps up at each file's first key
    # and down past its last, so one sort and two running sums give it at every step (O(n log n))
    steps = np.concatenate([lows, highs])
    density = rows / np.maximum(highs - lows, 1.0)  # keys beyond 2**53 may round to an empty span
    slope_change = np.concatenate([density, -density])
    order = np.argsort(steps, kind="stable")
    edges, slope = steps[order], np.cumsum(slope_change[order])
    below = np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(edges))])
    targets = below[-1] * np.arange(1, parts) / parts
    cuts = np.interp(targets, below, edges)
    # integers strictly inside the key range, increasing; any cuts are correct, only balance varies
    found = sorted({int(math.floor(c)) for c in cuts if edges[0] < math.floor(c) < edges[-1]})
    return tuple(found)


def plan_pieces(
    state: CatalogState,
    store_config: dict[str, Any],
    database: str,
    table_uuid: str,
    supercolumns: Sequence[Supercolumn],
    as_of: int,
    piece_rows: int = PIECE_ROWS,
) -> list[PieceTask]:
    """The pieces of ``table_uuid``'s snapshot as of ``as_of``: as many as the rows to read
    divided by ``piece_rows`` (at least one), each with only the files that overlap its range."""
    selection = select_files(state, table_uuid, as_of)
    files = selection.snapshot + selection.versions
    to_read = sum(f.row_count for f in files)
    pieces = min(MAX_PIECE_TASKS, max(1, math.ceil(to_read / max(1, piece_rows))))
    tasks = []
    for i, (low, high) in enumerate(key_ranges(files, pieces)):
        # select_files gives the pieces in key order (``by_first_key``), and a filter keeps it
        snapshot = tuple(f for f in selection.snapshot if key_range_overlaps(f, low, high))
        tasks.append(PieceTask(
            store_config, database, table_uuid, tuple(supercolumns), as_of, selection.snapshot_as_of, snapshot,
            tuple(f for f in selection.versions if key_range_overlaps(f, low, high)), low, high, state.txn_id + 1,
            always=(i == 0), step_rows=piece_rows))
    return tasks


def key_ranges(files: Sequence[FileEntry], parts: int, low: int | None = None,
               high: int | None = None) -> list[tuple[int | None, int | None]]:
    """[low, high) (None: unbounded) cut into about ``parts`` ranges holding as many of ``files``'
    rows each (``key_cuts_by_rows``; only cuts strictly inside the range are used)."""
    cuts = [c for c in key_cuts_by_rows(files, parts) if (low is None or c > low) and (high is None or c < high)]
    bounds = [low, *cuts, high]
    return list(zip(bounds, bounds[1:], strict=False))


def key_range_filter(low: int | None, high: int | None) -> ds.Expression | None:
    """The scan filter ``low <= key < high`` (None: unbounded; no filter when both are)."""
    lower = None if low is None else ds.field(KEY) >= low
    upper = None if high is None else ds.field(KEY) < high
    return upper if lower is None else lower if upper is None else lower & upper


def key_range_overlaps(f: FileEntry, low: int | None, high: int | None) -> bool:
    """Can ``f`` hold a key in [low, high)? (None: unbounded on that side.)"""
    return may_hold_keys(f, -(2**63) if low is None else low, 2**63 - 1 if high is None else high - 1)


def write_piece(task: PieceTask) -> tuple[FileEntry, ...]:
    """Write the piece's key range as of ``task.as_of`` as snapshot files and return their entries:
    the range is read in sub-ranges of about ``step_rows`` rows (in key order), each overlaid and
    appended to the current file, which is closed once it holds ``step_rows`` live rows. So a task
    holds one sub-range however many versions its range has; none when the range holds no live
    row and the piece is not ``always``."""
    objects = open_executor_store(task.store_config)
    schema = supertable_schema(task.supercolumns)
    steps = _sub_ranges(task)
    written: list[FileEntry] = []
    pending: list[pa.Table] = []
    live = 0
    for low, high in steps:
        rows = _live_in(task, objects, schema, low, high)
        if rows.num_rows:
            pending.append(rows)
            live += rows.num_rows
        if live >= task.step_rows:
            written.append(_write_snapshot_file(task, objects, schema, pending))
            pending, live = [], 0
    if pending or (task.always and not written):
        written.append(_write_snapshot_file(task, objects, schema, pending))
    return tuple(written)


def _sub_ranges(task: PieceTask) -> list[tuple[int | None, int | None]]:
    """The task's key range cut where about ``step_rows`` of its files' rows fall between cuts
    (the files' key spans clipped to the range)."""
    clipped = [_clip(f, task.low, task.high) for f in task.snapshot + task.versions]
    rows = sum(f.row_count for f in clipped)
    return key_ranges(clipped, math.ceil(rows / max(1, task.step_rows)), task.low, task.high)


def _clip(f: FileEntry, low: int | None, high: int | None) -> FileEntry:
    """``f`` as if it held only its keys in [low, high), its rows spread evenly over its keys."""
    if f.min_key is None or f.max_key is None:
        return f
    first = f.min_key if low is None else max(f.min_key, low)
    last = f.max_key if high is None else min(f.max_key, high - 1)
    if last < first:
        return replace(f, row_count=0)
    share = (last - first + 1) / (f.max_key - f.min_key + 1)
    return replace(f, min_key=first, max_key=last, row_count=math.ceil(f.row_count * share))


def _live_in(task: PieceTask, objects: Any, schema: pa.Schema, low: int | None, high: int | None) -> pa.Table:
    """The live rows as of ``task.as_of`` with a key in [low, high), in key order."""
    in_range = ds.field(LT) < task.as_of
    keys = key_range_filter(low, high)
    if keys is not None:
        in_range = in_range & keys
    snapshot = tuple(f for f in task.snapshot if key_range_overlaps(f, low, high))
    versions = tuple(f for f in task.versions if key_range_overlaps(f, low, high))
    base = changes = schema.empty_table()
    if snapshot:
        base = dataset_of(objects, snapshot, schema).to_table(filter=in_range)
    if versions:
        since = in_range if task.base_as_of is None else in_range & (ds.field(LT) >= task.base_as_of)
        changes = dataset_of(objects, versions, schema).to_table(filter=since)
    return overlay(base, changes).select(schema.names).cast(schema)  # overlay returns key order


def _write_snapshot_file(task: PieceTask, objects: Any, schema: pa.Schema, parts: list[pa.Table]) -> FileEntry:
    meta = FileMetadata(task.database, task.table_uuid, FileKind.SNAPSHOT, task.txn_hint, None, task.as_of,
                        snapshot_as_of=task.as_of)
    path = new_file_path(task.database, task.table_uuid, FileKind.SNAPSHOT, task.txn_hint)
    return entry_of(write_file_parts(objects, path, parts, schema, meta), meta)


@dataclass(frozen=True)
class TableSnapshot:
    """The pieces written for one table's snapshot, and the files they were read from (the commit
    adds the pieces only while all of those are still live)."""

    table_uuid: str
    entries: tuple[FileEntry, ...]
    read: tuple[str, ...]


def write_snapshots(
    spark: Any | None,
    state: CatalogState,
    objects: Any,
    database: str,
    tables: Sequence[tuple[str, Sequence[Supercolumn]]],
    as_of: int,
    piece_rows: int = PIECE_ROWS,
) -> list[TableSnapshot]:
    """Write the snapshot as of ``as_of`` of every table in ``tables`` ((uuid, supercolumns)), all
    pieces of all tables as one Spark job (in-process without a session); nothing is committed."""
    config = store_for_tasks(spark, objects)
    plans = [(uuid, plan_pieces(state, config, database, uuid, supercolumns, as_of, piece_rows))
             for uuid, supercolumns in tables]
    tasks = [task for _, pieces in plans for task in pieces]
    written = iter(map_tasks(spark, write_piece, tasks))
    out = []
    for uuid, pieces in plans:
        entries = tuple(e for _ in pieces for e in next(written))
        read = tuple(sorted({f.path for task in pieces for f in task.snapshot + task.versions}))
        out.append(TableSnapshot(uuid, entries, read))
    return out
