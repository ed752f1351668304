"""Supertable files as the catalog sees them: writing one returns its entry, and reading a table
as of a timestamp selects its entries, then reads them.

For ``as_of = T`` a table is read from its newest snapshot with
``snapshot_as_of <= T`` plus the version files holding timestamps in
``[snapshot_as_of, T)`` (or all versions below ``T`` when no snapshot is that
old). Cost grows with the live rows and the changes since that snapshot, not
with the whole history. Only files the catalog lists are read. When T lies in a closed
interval (every file read is marked ``closed_until`` the next snapshot, see
``maintenance/snapshots.py``), the rows are a filter on ``superseded_at``: no per-key grouping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from history_pipeline.catalog.model import CatalogState, FileEntry, FileKind
from history_pipeline.io.store import ObjectStore
from history_pipeline.schema import Supercolumn
from history_pipeline.supertable import (
    DELETED,
    KEY,
    LT,
    SUPERSEDED,
    FileMetadata,
    WrittenFile,
    supertable_schema,
    write_file,
)
from history_pipeline.supertable.read import dataset_of, footer, overlay, read_key


def entry_of(written: WrittenFile, meta: FileMetadata) -> FileEntry:
    """The catalog entry of a file written with ``meta``."""
    return FileEntry(
        path=written.path,
        kind=meta.kind,
        table_uuid=meta.table_uuid,
        size_bytes=written.size_bytes,
        row_count=written.row_count,
        min_t=written.min_t,
        max_t=written.max_t,
        min_key=written.min_key,
        max_key=written.max_key,
        segments=meta.segments,
        snapshot_as_of=meta.snapshot_as_of,
        closed_until=meta.closed_until,
    )


def write_parquet(store: ObjectStore, path: str, table: pa.Table, meta: FileMetadata) -> FileEntry:
    """Write ``table`` to ``path`` with ``meta`` in its footer; return its catalog entry."""
    return entry_of(write_file(store, path, table, meta), meta)


@dataclass(frozen=True)
class FileSelection:
    snapshot: tuple[FileEntry, ...]
    snapshot_as_of: int | None
    versions: tuple[FileEntry, ...]
    #: the oldest snapshot above ``as_of``: the end of the interval being read (None: open interval)
    next_snapshot: int | None = None

    @property
    def closed(self) -> bool:
        """Every file read is marked closed for this interval: its rows carry ``superseded_at``
        (their key's next version below ``next_snapshot``), so the read is a filter, no join."""
        files = self.snapshot + self.versions
        lower = self.snapshot_as_of
        return (self.next_snapshot is not None and bool(files)
                and all(f.closed_until == self.next_snapshot for f in files)
                # marking never takes a version file reaching below its interval's snapshot
                and all(lower is None or (f.min_t is not None and f.min_t >= lower) for f in self.versions))


def select_files(
    state: CatalogState, table_uuid: str, as_of: int, keys: Sequence[int] | None = None
) -> FileSelection:
    """The files needed to read ``table_uuid`` as of ``as_of`` (optionally only some keys)."""
    snapshots = [
        f
        for f in state.files_of(table_uuid, FileKind.SNAPSHOT)
        if f.snapshot_as_of is not None and f.snapshot_as_of <= as_of
    ]
    snapshot_as_of = max((f.snapshot_as_of for f in snapshots), default=None)  # type: ignore[type-var]
    next_snapshot = min((f.snapshot_as_of for f in state.files_of(table_uuid, FileKind.SNAPSHOT)
                         if f.snapshot_as_of is not None and f.snapshot_as_of > as_of), default=None)
    chosen = tuple(f for f in snapshots if f.snapshot_as_of == snapshot_as_of)
    lower = snapshot_as_of if snapshot_as_of is not None else None
    versions = tuple(
        f
        for f in state.files_of(table_uuid, FileKind.VERSIONS)
        if f.row_count
        and f.min_t is not None
        and f.min_t < as_of
        and (lower is None or (f.max_t is not None and f.max_t >= lower))
    )
    if keys is not None:
        low, high = min(keys, default=0), max(keys, default=-1)
        chosen = tuple(f for f in chosen if _overlaps(f, low, high))
        versions = tuple(f for f in versions if _overlaps(f, low, high))
    return FileSelection(chosen, snapshot_as_of, versions, next_snapshot)


def _overlaps(f: FileEntry, low: int, high: int) -> bool:
    if f.min_key is None or f.max_key is None:
        return f.row_count > 0
    return f.min_key <= high and low <= f.max_key


def read_parts(
    store: ObjectStore,
    selection: FileSelection,
    supercolumns: Sequence[Supercolumn],
    as_of: int,
    keys: Sequence[int] | None = None,
    columns: Sequence[str] | None = None,
) -> tuple[pa.Table, pa.Table]:
    """(the snapshot's rows, the versions after it and below ``as_of``), both possibly empty."""
    schema = supertable_schema(supercolumns)
    wanted = list(columns) if columns is not None else schema.names
    for reserved in (LT, DELETED, KEY):
        if reserved not in wanted:
            wanted.insert(0, reserved)
    empty = schema.empty_table().select(wanted)
    base, changes = empty, empty
    if keys is not None and len(set(keys)) == 1:  # a point lookup: cached footers, bisected row groups
        (key,) = set(keys)
        base = read_key(store, selection.snapshot, schema, wanted, key, None, as_of)
        changes = read_key(store, selection.versions, schema, wanted, key, selection.snapshot_as_of, as_of)
        return base, changes
    key_filter = ds.field(KEY).isin(pa.array(sorted(set(keys)), pa.int64())) if keys is not None else None
    if selection.snapshot:
        expr = ds.field(LT) < as_of
        if key_filter is not None:
            expr = expr & key_filter
        base = dataset_of(store, selection.snapshot, schema).to_table(columns=wanted, filter=expr)
    if selection.versions:
        expr = ds.field(LT) < as_of
        if selection.snapshot_as_of is not None:
            expr = expr & (ds.field(LT) >= selection.snapshot_as_of)
        if key_filter is not None:
            expr = expr & key_filter
        changes = dataset_of(store, selection.versions, schema).to_table(columns=wanted, filter=expr)
    return base, changes


def live_rows(
    store: ObjectStore,
    state: CatalogState,
    table_uuid: str,
    supercolumns: Sequence[Supercolumn],
    as_of: int,
    keys: Sequence[int] | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """The live rows of a supertable as of ``as_of``: synthetic_key, logical_timestamp and supercolumns."""
    selection = select_files(state, table_uuid, as_of, keys)
    if is_closed_read(store, selection) and not (keys is not None and len(set(keys)) == 1):
        return read_closed(store, selection, supercolumns, as_of, keys, columns)
    base, changes = read_parts(store, selection, supercolumns, as_of, keys, columns)
    return overlay(base, changes)


def is_closed_read(store: ObjectStore, selection: FileSelection) -> bool:
    """Can ``selection`` be read by filters alone? Its interval is closed (every file marked for
    it) and every file holds ``superseded_at`` (footers are cached, so asking again is free)."""
    return selection.closed and all(
        SUPERSEDED in footer(store, f.path).columns for f in selection.snapshot + selection.versions)


#: a version file with more than this share of its t range at or after as_of is filtered while scanned
LATE_SHARE = 0.25


def _share_at_or_after(f: FileEntry, as_of: int) -> float:
    """The share of ``f``'s timestamp range at or after ``as_of`` (its rows are not read at T)."""
    if f.min_t is None or f.max_t is None:
        return 0.0
    return max(0, f.max_t - as_of + 1) / (f.max_t - f.min_t + 1)


def read_closed(
    store: ObjectStore,
    selection: FileSelection,
    supercolumns: Sequence[Supercolumn],
    as_of: int,
    keys: Sequence[int] | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """The live rows as of ``as_of`` of a closed interval (``is_closed_read``), in key order: the
    snapshot's and the versions' rows not superseded below ``as_of`` (keys are unique across both,
    so no join). One scan of every file (snapshot rows are all below ``as_of``, and the marked
    version files hold no t below the snapshot), then the mask and the key order are computed on
    the four integer columns and the rows gathered by a single take."""
    schema = supertable_schema(supercolumns)
    wanted = list(columns) if columns is not None else schema.names
    for reserved in (LT, DELETED, KEY):
        if reserved not in wanted:
            wanted.insert(0, reserved)
    key_filter = ds.field(KEY).isin(pa.array(sorted(set(keys)), pa.int64())) if keys is not None else None
    marked = schema.append(pa.field(SUPERSEDED, pa.int64()))
    # a version file mostly at or after as_of (a T early in the interval) drops those rows while
    # scanning; elsewhere the mask below is cheaper than the scan's filter
    late = tuple(f for f in selection.versions if _share_at_or_after(f, as_of) > LATE_SHARE)
    groups = [(selection.snapshot + tuple(f for f in selection.versions if f not in late), key_filter),
              (late, ds.field(LT) < as_of if key_filter is None else key_filter & (ds.field(LT) < as_of))]
    parts = [dataset_of(store, files, marked).to_table(columns=[*wanted, SUPERSEDED], filter=where)
             for files, where in groups if files]
    rows = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    superseded = rows.column(SUPERSEDED)
    current = pc.and_(pc.and_(pc.invert(rows.column(DELETED)), pc.less(rows.column(LT), as_of)),
                      pc.or_kleene(pc.is_null(superseded), pc.greater_equal(superseded, as_of)))
    chosen = pc.indices_nonzero(current)
    in_key_order = pc.take(chosen, pc.sort_indices(pc.take(rows.column(KEY), chosen)))
    return rows.select(wanted).take(in_key_order)
