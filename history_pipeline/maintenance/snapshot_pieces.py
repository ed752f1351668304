"""A table's snapshot written as pieces over key ranges, one task each, so no process holds the table.

The driver plans: which files a snapshot as of T reads (``select_files``: the newest snapshot
below T and the version files since), and where to cut the key range so that each piece reads
about ``piece_rows`` rows (cuts from the files' key statistics, see :func:`key_cuts_by_rows`).
Each piece is a task (:func:`write_piece`, run by ``execution.map_tasks`` on Spark executors or
in-process) that opens the store from configuration, reads only its key range's rows of those
files (row groups outside the range are skipped by their statistics), overlays them into the
live image as of T, writes it as one snapshot file through the object-store layer and returns its
catalog entry. The pieces of one snapshot share ``snapshot_as_of``; every reader takes all files
of a table with that ``snapshot_as_of`` as the snapshot, so a snapshot of one file and one of
many answer alike. The driver commits the entries; it never sees a row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.dataset as ds

from history_pipeline.catalog.files import may_hold_keys, select_files, write_parquet
from history_pipeline.catalog.model import CatalogState, FileEntry, FileKind
from history_pipeline.execution import map_tasks, open_executor_store, store_for_tasks
from history_pipeline.schema import Supercolumn
from history_pipeline.supertable import KEY, LT, FileMetadata, new_file_path, supertable_schema
from history_pipeline.supertable.read import dataset_of, overlay

#: rows a piece reads at most (snapshot rows plus versions since, in its key range), when keys are
#: spread as the files' statistics say. A snapshot is due once the versions since the last one
#: reach the live rows, so a piece of this many rows read holds about half as many live rows; at
#: the bench's row width (6 columns) a Python worker's peak grew by ~100 MiB for such a piece
#: (``bench/driver_memory.py``), far inside an executor.
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
    cuts = key_cuts_by_rows(files, max(1, math.ceil(to_read / max(1, piece_rows))))
    bounds = [None, *cuts, None]
    tasks = []
    for i in range(len(bounds) - 1):
        low, high = bounds[i], bounds[i + 1]
        snapshot = tuple(sorted((f for f in selection.snapshot if key_range_overlaps(f, low, high)),
                                key=lambda f: (f.min_key is None, f.min_key or 0, f.path)))
        tasks.append(PieceTask(
            store_config, database, table_uuid, tuple(supercolumns), as_of, selection.snapshot_as_of, snapshot,
            tuple(f for f in selection.versions if key_range_overlaps(f, low, high)), low, high, state.txn_id + 1,
            always=(i == 0)))
    return tasks


def key_range_overlaps(f: FileEntry, low: int | None, high: int | None) -> bool:
    """Can ``f`` hold a key in [low, high)? (None: unbounded on that side.)"""
    return may_hold_keys(f, -(2**63) if low is None else low, 2**63 - 1 if high is None else high - 1)


def write_piece(task: PieceTask) -> FileEntry | None:
    """Read the piece's key range as of ``task.as_of``, write it as a snapshot file and return its
    entry (None when the range holds no live row and the piece is not ``always``)."""
    objects = open_executor_store(task.store_config)
    schema = supertable_schema(task.supercolumns)
    in_range = ds.field(LT) < task.as_of
    if task.low is not None:
        in_range = in_range & (ds.field(KEY) >= task.low)
    if task.high is not None:
        in_range = in_range & (ds.field(KEY) < task.high)
    base = changes = schema.empty_table()
    if task.snapshot:
        base = dataset_of(objects, task.snapshot, schema).to_table(filter=in_range)
    if task.versions:
        since = in_range if task.base_as_of is None else in_range & (ds.field(LT) >= task.base_as_of)
        changes = dataset_of(objects, task.versions, schema).to_table(filter=since)
    # overlay orders the rows by key whenever there are changes; without, the base is in file
    # order, which is key order only if the previous pieces' ranges were this one's
    rows = overlay(base, changes).select(schema.names).cast(schema).sort_by([(KEY, "ascending")])
    if rows.num_rows == 0 and not task.always:
        return None
    meta = FileMetadata(task.database, task.table_uuid, FileKind.SNAPSHOT, task.txn_hint, None, task.as_of,
                        snapshot_as_of=task.as_of)
    path = new_file_path(task.database, task.table_uuid, FileKind.SNAPSHOT, task.txn_hint)
    return write_parquet(objects, path, rows, meta)


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
        entries = tuple(e for e in (next(written) for _ in pieces) if e is not None)
        read = tuple(sorted({f.path for task in pieces for f in task.snapshot + task.versions}))
        out.append(TableSnapshot(uuid, entries, read))
    return out
