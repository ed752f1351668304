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

import functools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
from history_pipeline.supertable.key_index import Version, newest_version, read_version
from history_pipeline.supertable.read import (
    RowGroupTimes,
    as_dictionaries,
    as_numpy,
    footer,
    gather_with_keys,
    overlay,
    read_key,
    read_row_groups,
    read_row_groups_each,
    survivors_in_key_order,
)


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
        closed_layout=meta.closed_layout,
        holds_versions=meta.holds_versions,
    )


def write_parquet(store: ObjectStore, path: str, table: pa.Table, meta: FileMetadata,
                  row_groups: Sequence[int] | None = None) -> FileEntry:
    """Write ``table`` to ``path`` with ``meta`` in its footer (``row_groups``: their sizes, see
    ``supertable.write_file``); return its catalog entry."""
    return entry_of(write_file(store, path, table, meta, row_groups), meta)


@dataclass(frozen=True)
class FileSelection:
    snapshot: tuple[FileEntry, ...]
    snapshot_as_of: int | None
    versions: tuple[FileEntry, ...]
    #: the oldest snapshot above ``as_of``: the end of the interval being read (None: open interval)
    next_snapshot: int | None = None
    #: the T the files were selected for (None: not known, never a closed read)
    as_of: int | None = None

    @cached_property
    def marked_until(self) -> int | None:
        """U when the files read are marked as of one U: the snapshot's and every version file
        below U carry ``superseded_at`` (their key's next version below U, see
        ``maintenance/snapshots.py``), and every other version file starts at or above U. A
        closed interval's files are marked as of its next snapshot, an open interval's as of the
        frontier at its last marking. None: not so marked."""
        files = self.snapshot + self.versions
        marks = {f.closed_until for f in files if f.closed_until is not None}
        if len(marks) != 1 or any(f.closed_until is None for f in self.snapshot):
            return None
        (mark,) = marks
        lower = self.snapshot_as_of
        for f in self.versions:
            if f.closed_until is None:
                if f.min_t is None or f.min_t < mark:
                    return None
            # marking never takes a version file reaching below its interval's snapshot
            elif f.max_t is None or f.max_t >= mark or (lower is not None and (f.min_t is None or f.min_t < lower)):
                return None
        return mark

    @property
    def closed(self) -> bool:
        """Every file read is marked as of some U at or above ``as_of``: its rows carry
        ``superseded_at`` (their key's next version below U, which is the next version below
        ``as_of`` too), so the read is a filter, no join. The marks may differ from file to file:
        a snapshot piece holding versions (``FileEntry.holds_versions``) read inside its interval
        is marked as of the next interval's end once that closes."""
        files = self.snapshot + self.versions
        if self.as_of is None or not files:
            return False
        if any(f.closed_until is None or f.closed_until < self.as_of for f in files):
            return False
        lower = self.snapshot_as_of
        # marking never takes a version file reaching below its interval's snapshot or past its marks
        return all(f.max_t is not None and f.max_t < f.closed_until  # type: ignore[operator]
                   and (lower is None or (f.min_t is not None and f.min_t >= lower)) for f in self.versions)

    @property
    def marked_and_since(self) -> tuple[int, tuple[FileEntry, ...], tuple[FileEntry, ...]] | None:
        """(U, the files marked as of U, the version files since U) when the files are marked
        (``marked_until``) below ``as_of``: the rows current as of U overlaid with the versions
        since are the answer. None: not so marked, or a closed read."""
        mark = self.marked_until
        if mark is None or self.as_of is None or self.as_of <= mark:
            return None
        marked = self.snapshot + tuple(f for f in self.versions if f.closed_until == mark)
        return mark, marked, tuple(f for f in self.versions if f.closed_until is None)


def select_files(
    state: CatalogState, table_uuid: str, as_of: int, keys: Sequence[int] | None = None
) -> FileSelection:
    """The files needed to read ``table_uuid`` as of ``as_of`` (optionally only some keys).

    A state never changes, so the selection of every key is kept per state for the last T it
    was asked for (a run of lookups as of one T scans the table's files once, not per lookup)."""
    memo = state.derived.setdefault(("select_files", table_uuid), {})
    selection = memo.get(as_of)
    if selection is None:
        selection = _select_files(state, table_uuid, as_of)
        with _selections_lock:
            while len(memo) >= _SELECTIONS_KEPT:
                memo.pop(next(iter(memo)))
            memo[as_of] = selection
    if keys is None:
        return selection
    low, high = min(keys, default=0), max(keys, default=-1)
    return replace(selection, snapshot=tuple(f for f in selection.snapshot if may_hold_keys(f, low, high)),
                   versions=tuple(f for f in selection.versions if may_hold_keys(f, low, high)))


#: selections kept per state and table (the oldest asked for goes first)
_SELECTIONS_KEPT = 64
_selections_lock = threading.Lock()


def _select_files(state: CatalogState, table_uuid: str, as_of: int) -> FileSelection:
    snapshots = [
        f
        for f in state.files_of(table_uuid, FileKind.SNAPSHOT)
        if f.snapshot_as_of is not None and f.snapshot_as_of <= as_of
    ]
    snapshot_as_of = max((f.snapshot_as_of for f in snapshots), default=None)  # type: ignore[type-var]
    next_snapshot = min((f.snapshot_as_of for f in state.files_of(table_uuid, FileKind.SNAPSHOT)
                         if f.snapshot_as_of is not None and f.snapshot_as_of > as_of), default=None)
    # a snapshot's pieces hold disjoint key ranges: read in key order, their rows are in key order
    chosen = tuple(sorted((f for f in snapshots if f.snapshot_as_of == snapshot_as_of), key=by_first_key))
    lower = snapshot_as_of if snapshot_as_of is not None else None
    # the versions since the snapshot: version files, and the pieces of the next snapshot that
    # hold the versions of this interval still current at its end (stored only there; a piece
    # holding versions of an earlier interval ends below ``lower``)
    versions = tuple(
        f
        for f in state.versions_of(table_uuid)
        if f.row_count
        and f.min_t is not None
        and f.min_t < as_of
        and (lower is None or (f.max_t is not None and f.max_t >= lower))
    )
    return FileSelection(chosen, snapshot_as_of, versions, next_snapshot, as_of)


def by_first_key(f: FileEntry) -> tuple[bool, int, str]:
    """Sort key ordering a snapshot's pieces by their key ranges (files without key statistics last)."""
    return (f.min_key is None, f.min_key or 0, f.path)


def may_hold_keys(f: FileEntry, low: int, high: int) -> bool:
    """Can ``f`` hold a key in [low, high]? (A file without key statistics may, unless it is empty.)"""
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
    current: bool = False,
    dictionaries: Sequence[str] = (),
) -> tuple[pa.Table, pa.Table]:
    """(the snapshot's rows, the versions after it and below ``as_of``), both possibly empty.
    ``current`` (a closed read, ``is_closed_read``): a point lookup may skip the row groups
    holding no row current as of ``as_of`` (their rows are older versions than the newest).
    ``dictionaries``: string columns read as dictionaries (``dictionary_reads``; not for a point
    lookup)."""
    schema = supertable_schema(supercolumns)
    wanted = list(columns) if columns is not None else schema.names
    for reserved in (LT, DELETED, KEY):
        if reserved not in wanted:
            wanted.insert(0, reserved)
    empty = schema.empty_table().select(wanted)
    base, changes = empty, empty
    if keys is not None and len(set(keys)) == 1:  # a point lookup: cached footers, bisected row groups
        (key,) = set(keys)
        # files marked as of U skip the row groups holding no row current then: the key's newest
        # version below U is kept (a closed read: U >= as_of; above the marks, the versions since
        # U are read whole and overlay it)
        marks = selection.marked_and_since
        current_at = as_of if current else marks[0] if marks is not None else None

        def skips(f: FileEntry) -> bool:
            return current_at is not None and f.closed_until is not None and f.closed_until >= current_at

        def of_key(files: Sequence[FileEntry], lower: int | None) -> pa.Table:
            marked, rest = [f for f in files if skips(f)], [f for f in files if not skips(f)]
            parts = [read_key(store, group, schema, wanted, key, lower, as_of, at)
                     for group, at in ((marked, current_at), (rest, None)) if group]
            return pa.concat_tables(parts) if len(parts) > 1 else parts[0] if parts else empty

        return of_key(selection.snapshot, None), of_key(selection.versions, selection.snapshot_as_of)
    target = as_dictionaries(schema, dictionaries).empty_table().select(wanted).schema
    if selection.snapshot:
        base = rows_below(store, selection.snapshot, target, as_of, None, keys)
    if selection.versions:
        changes = rows_below(store, selection.versions, target, as_of, selection.snapshot_as_of, keys)
    return base, changes


def rows_below(store: ObjectStore, files: Sequence[FileEntry], target: pa.Schema, as_of: int, lower: int | None,
               keys: Sequence[int] | None = None) -> pa.Table:
    """The rows of ``files`` with ``lower <= t < as_of`` (and one of ``keys``), ``target``'s
    columns, in file order: the row groups whose statistics allow such a row, read through their
    cached footers (``read_row_groups``), then the rows. A bound every row group's statistics
    already meet is not tested row by row (at the latest T, the usual read, neither is)."""
    low, high = (min(keys), max(keys)) if keys else (None, None)
    chosen = []
    for f in files:
        cached = footer(store, f.path)
        in_range = None if low is None or high is None else set(cached.row_groups_overlapping(low, high))
        groups = [rg for rg, times in enumerate(cached.times)
                  if (times.min_t is None or times.min_t < as_of)
                  and (lower is None or times.max_t is None or times.max_t >= lower)
                  and (in_range is None or rg in in_range)]
        if groups:
            chosen.append((f, cached, groups))
    rows = read_row_groups(store, [(f, groups) for f, _, groups in chosen], target)
    times = [cached.times[rg] for _, cached, groups in chosen for rg in groups]
    tests = []
    if any(g.max_t is None or g.max_t >= as_of for g in times):
        tests.append(pc.less(rows.column(LT), as_of))
    if lower is not None and any(g.min_t is None or g.min_t < lower for g in times):
        tests.append(pc.greater_equal(rows.column(LT), lower))
    if keys is not None:
        tests.append(pc.is_in(rows.column(KEY), pa.array(sorted(set(keys)), pa.int64())))
    if not tests:
        return rows
    return rows.filter(tests[0] if len(tests) == 1 else functools.reduce(pc.and_, tests))


def live_rows(
    store: ObjectStore,
    state: CatalogState,
    table_uuid: str,
    supercolumns: Sequence[Supercolumn],
    as_of: int,
    keys: Sequence[int] | None = None,
    columns: Sequence[str] | None = None,
    reserved: bool = True,
) -> pa.Table:
    """The live rows of a supertable as of ``as_of``: synthetic_key, logical_timestamp and supercolumns
    (``reserved=False``: only synthetic_key and ``columns``, for a reader that drops the rest)."""
    selection = select_files(state, table_uuid, as_of, keys)
    closed = is_closed_read(store, selection)
    point = keys is not None and len(set(keys)) == 1
    if closed and not point:
        return read_closed(store, selection, supercolumns, as_of, keys, columns, reserved)
    if not point and is_marked_read(store, selection):
        return read_marked_and_since(store, selection, supercolumns, as_of, keys, columns, reserved)
    kept = None if reserved or columns is None else _key_and(columns)
    # the overlay gathers its rows from the snapshot's and the changes' (none to gather without changes)
    dictionaries = dictionary_reads(store, selection.snapshot + selection.versions, kept or columns or ()) \
        if selection.versions and not point else []
    base, changes = read_parts(store, selection, supercolumns, as_of, keys, columns, current=closed,
                               dictionaries=dictionaries)
    return overlay(base, changes, kept, supertable_schema(supercolumns) if dictionaries else None)


def newest_of_key(store: ObjectStore, selection: FileSelection, as_of: int, key: int) -> Version | None:
    """The version of ``key`` the state as of ``as_of`` holds, found by the files' key indexes
    (``supertable.key_index``): its newest version with ``t < as_of`` among the snapshot's rows and
    the versions since the snapshot, which is what the overlay of ``live_rows`` keeps for a key.
    A delete is returned as such (the key has no row then); None when no version is there.

    Files marked as of some U at or above the time their rows are read at (``as_of`` in a closed
    read, the marks when reading above them) skip the row groups holding no row current then, as
    ``read_parts`` does: the key's newest version below that time is in the others."""
    marks = selection.marked_and_since
    current_at = as_of if selection.closed else marks[0] if marks is not None else None
    best: Version | None = None
    for files, lower in ((selection.snapshot, None), (selection.versions, selection.snapshot_as_of)):
        for f in files:
            if not may_hold_keys(f, key, key):
                continue
            marked = current_at is not None and f.closed_until is not None and f.closed_until >= current_at
            found = newest_version(store, f, key, lower, as_of, current_at if marked else None)
            if found is not None and (best is None or found.t > best.t):
                best = found
    return best


def live_row(
    store: ObjectStore,
    state: CatalogState,
    table_uuid: str,
    supercolumns: Sequence[Supercolumn],
    as_of: int,
    key: int,
    columns: Sequence[str],
) -> pa.Table | None:
    """The live row of ``key`` as of ``as_of`` (``columns`` of it, cast to the supertable's types as
    ``live_rows`` returns them), or None: ``live_rows`` of one key, reading only its row's row
    group (``newest_of_key``). ``supercolumns`` are the table's in ``state``."""
    version = newest_of_key(store, select_files(state, table_uuid, as_of, (key,)), as_of, key)
    if version is None or version.deleted:
        return None
    # the row's schema, kept with the state (its supercolumns are the state's): building it, and
    # hashing the supercolumns to find the supertable's schema, cost a lookup tens of microseconds
    memo = state.derived.setdefault(("row_schema", table_uuid), {})
    target = memo.get(tuple(columns))
    if target is None:
        schema = supertable_schema(supercolumns)
        target = memo[tuple(columns)] = pa.schema([schema.field(c) for c in columns])
    return read_version(store, version, target)


def dictionary_reads(store: ObjectStore, files: Sequence[FileEntry], columns: Iterable[str]) -> list[str]:
    """Of ``columns``, the strings every one of ``files`` stores with a dictionary: read as
    dictionaries, gathered as indices and decoded after the gather (``as_dictionaries``)."""
    return [c for c in columns if files and all(c in footer(store, f.path).dictionary_strings for f in files)]


def _key_and(columns: Sequence[str]) -> list[str]:
    return [KEY, *(c for c in columns if c not in (KEY, LT, DELETED))]


def is_closed_read(store: ObjectStore, selection: FileSelection) -> bool:
    """Can ``selection`` be read by filters alone? Every file is marked as of one U >= as_of
    (``FileSelection.closed``) and holds ``superseded_at`` (footers are cached, so asking again is
    free)."""
    return selection.closed and all(
        SUPERSEDED in footer(store, f.path).columns for f in selection.snapshot + selection.versions)


def is_marked_read(store: ObjectStore, selection: FileSelection) -> bool:
    """Can ``selection`` be read as the rows current at its marks U overlaid with the versions
    since (``FileSelection.marked_and_since``)? Every marked file holds ``superseded_at``."""
    marks = selection.marked_and_since
    return marks is not None and all(SUPERSEDED in footer(store, f.path).columns for f in marks[1])


def closed_row_groups(store: ObjectStore, selection: FileSelection, as_of: int,
                      keys: Sequence[int] | None = None) -> list[tuple[FileEntry, list[int]]]:
    """The row groups of a closed read (``is_closed_read``) that may hold a row current as of
    ``as_of`` (and one of ``keys``), by their statistics (cached footers): the others are not read.
    Correct for any row order; ``supertable.closed_layout`` makes it skip nearly every row group
    not in the answer."""
    return row_groups_current(store, selection.snapshot + selection.versions, as_of, keys)


def row_groups_current(store: ObjectStore, files: Sequence[FileEntry], as_of: int,
                       keys: Sequence[int] | None = None) -> list[tuple[FileEntry, list[int]]]:
    """``closed_row_groups`` of marked ``files`` (each marked as of some U >= ``as_of``)."""
    low, high = (min(keys), max(keys)) if keys else (None, None)
    chosen = []
    for f in files:
        cached = footer(store, f.path)
        groups = cached.row_groups_current(as_of)
        if low is not None and high is not None:
            in_range = set(cached.row_groups_overlapping(low, high))
            groups = [rg for rg in groups if rg in in_range]
        if groups:
            chosen.append((f, groups))
    return chosen


def open_tests(groups: Sequence[RowGroupTimes], as_of: int) -> tuple[bool, bool]:
    """Must a closed read of these row groups test ``is_deleted``, and ``t < as_of``, row by row?
    Not where their statistics settle it: no row group holds a delete, or every t is below
    ``as_of`` (a snapshot's rows, and most of an interval's at a T late in it); a column neither
    tested nor in the answer is then not read at all."""
    return (any(g.any_deleted is not False for g in groups),
            any(g.max_t is None or g.max_t >= as_of for g in groups))


def superseded_settled(groups: Sequence[RowGroupTimes]) -> bool:
    """Is no row of these row groups superseded (every ``superseded_at`` NULL, by their
    statistics)? Then a read current at any T up to their marks need not read the column (the
    rows current at an open interval's marks are such row groups)."""
    return all(g.never_superseded for g in groups)


def read_closed(
    store: ObjectStore,
    selection: FileSelection,
    supercolumns: Sequence[Supercolumn],
    as_of: int,
    keys: Sequence[int] | None = None,
    columns: Sequence[str] | None = None,
    reserved: bool = True,
) -> pa.Table:
    """The live rows as of ``as_of`` of a closed read (``is_closed_read``), in key order: the
    snapshot's and the versions' rows not superseded below ``as_of`` (keys are unique across both,
    so no join). Only the row groups ``closed_row_groups`` keeps are read, then the mask and the
    key order are computed on the integer columns and the rows gathered once, a column per thread."""
    schema = supertable_schema(supercolumns)
    kept = _kept(schema, columns, reserved)
    # every current row is live: is_deleted is known (False) and is read only where it is tested
    gathered = [c for c in kept if c != DELETED]
    rows, current, current_keys = _current_rows(store, selection.snapshot + selection.versions, schema, as_of, keys,
                                                gathered)
    if rows is None:
        return schema.empty_table().select(kept)
    # keys are unique across the current rows: a slot per key orders them (row groups are
    # key-sorted runs, so sparse keys take a stable merge sort of the runs instead)
    none = np.empty(0, dtype=np.int64)
    order, row_keys = survivors_in_key_order(current_keys, None, none, np.empty(0, dtype=bool), none, current)
    live = gather_with_keys(rows.select(gathered), order, row_keys, pa.schema([schema.field(c) for c in gathered]))
    if DELETED in kept:
        live = live.add_column(kept.index(DELETED), schema.field(DELETED), pa.array(np.zeros(len(order), dtype=bool)))
    return live


def read_marked_and_since(
    store: ObjectStore,
    selection: FileSelection,
    supercolumns: Sequence[Supercolumn],
    as_of: int,
    keys: Sequence[int] | None = None,
    columns: Sequence[str] | None = None,
    reserved: bool = True,
) -> pa.Table:
    """The live rows as of ``as_of`` above the marks U of an open interval (``is_marked_read``), in
    key order: the rows current at U (a filter on the marked files, as a closed read as of U) with
    the newest version since U of each key over them (a delete drops its key). The current rows
    are overlaid as they were read, not sorted (``survivors_in_key_order`` takes keys in any
    order), and every row is gathered once."""
    marks = selection.marked_and_since
    assert marks is not None
    mark, marked, since = marks
    schema = supertable_schema(supercolumns)
    kept = _kept(schema, columns, reserved)
    dictionaries = dictionary_reads(store, [*marked, *since], kept)
    read_schema = as_dictionaries(schema, dictionaries)
    rows, current, current_keys = _current_rows(store, marked, schema, mark, keys, kept, dictionaries)
    base = rows.select(kept) if rows is not None else read_schema.empty_table().select(kept)
    changes = read_schema.empty_table().select([*kept, *(c for c in (LT, DELETED) if c not in kept)])
    if since:
        changes = rows_below(store, since, changes.schema, as_of, None, keys)
    return overlay(base, changes, kept, schema if dictionaries else None, current=current, current_keys=current_keys)


def _kept(schema: pa.Schema, columns: Sequence[str] | None, reserved: bool) -> list[str]:
    """The columns a read returns: the reserved ones and ``columns`` (every one when None), or
    only the key and ``columns`` (``reserved=False``)."""
    wanted = list(columns) if columns is not None else schema.names
    for name in (LT, DELETED, KEY):
        if name not in wanted:
            wanted.insert(0, name)
    return wanted if reserved or columns is None else _key_and(columns)


def _current_rows(
    store: ObjectStore,
    files: Sequence[FileEntry],
    schema: pa.Schema,
    as_of: int,
    keys: Sequence[int] | None,
    kept: Sequence[str],
    dictionaries: Sequence[str] | None = None,
) -> tuple[pa.Table | None, np.ndarray, np.ndarray]:
    """The row groups of marked ``files`` that may hold a row current as of ``as_of``, read (the
    ``kept`` columns and what the mask tests; strings every file stores with a
    dictionary as dictionaries unless ``dictionaries`` names them), the indices of the rows
    current then (not deleted, ``t < as_of`` and ``superseded_at`` NULL or at/above it) and their
    keys. None when no row group may hold one. Each file's rows are tested on the thread that read
    them, so the mask of one file runs beside the read of the next."""
    chosen = row_groups_current(store, files, as_of, keys)
    none = np.empty(0, dtype=np.int64)
    if not chosen:
        return None, none, none
    if dictionaries is None:
        dictionaries = dictionary_reads(store, [f for f, _ in chosen], kept)
    marked = as_dictionaries(schema.append(pa.field(SUPERSEDED, pa.int64())), dictionaries)
    times = [footer(store, f.path).times[rg] for f, groups in chosen for rg in groups]
    test_deleted, test_t = open_tests(times, as_of)
    test_superseded = not superseded_settled(times)
    untested = {c for c, tested in ((DELETED, test_deleted), (LT, test_t)) if not tested and c not in kept}
    read = list(dict.fromkeys(c for c in (KEY, DELETED, LT, *kept) if c not in untested))
    tested = [name for name, test in ((SUPERSEDED, test_superseded), (LT, test_t), (DELETED, test_deleted),
                                      (KEY, keys is not None)) if test]

    def current_of(part: pa.Table) -> tuple[int, np.ndarray, np.ndarray]:
        return part.num_rows, *_current_indices(part, tested, as_of, keys)

    rows, parts = read_row_groups_each(store, chosen, pa.schema([marked.field(c) for c in
                                                                  ([*read, SUPERSEDED] if test_superseded else read)]),
                                       current_of)
    offsets = np.cumsum([0] + [n for n, _, _ in parts[:-1]])
    current = [found + offset if offset else found for (_, found, _), offset in zip(parts, offsets, strict=True)]
    return (rows, current[0] if len(current) == 1 else np.concatenate(current),
            parts[0][2] if len(parts) == 1 else np.concatenate([k for _, _, k in parts]))


#: a NULL ``superseded_at`` (never superseded below the marks) compares as this
_NEVER = np.iinfo(np.int64).max


def _current_indices(rows: pa.Table, tested: Sequence[str], as_of: int,
                     keys: Sequence[int] | None) -> tuple[np.ndarray, np.ndarray]:
    """Row numbers of the rows current as of ``as_of`` among ``rows``, by the columns ``tested``
    (those a closed read must test: ``superseded_at``, ``t``, ``is_deleted``, the key when
    ``keys`` is given), as NumPy's index type (indexing by 32-bit row numbers converts them first
    and costs three times as much), and their keys. The tests run on NumPy views of each record
    batch as read: no column is copied whole."""
    if not tested:
        return np.arange(rows.num_rows, dtype=np.intp), as_numpy(rows.column(KEY))
    wanted = np.array(sorted(set(keys)), dtype=np.int64) if keys is not None else None
    parts, found_keys, offset = [], [], 0
    for batch in rows.select(list(dict.fromkeys([KEY, *tested]))).to_batches():
        current: np.ndarray | None = None
        for name in tested:
            column = batch.column(name)
            if name == SUPERSEDED:
                test = pc.fill_null(column, _NEVER).to_numpy() >= as_of
            elif name == LT:
                test = column.to_numpy() < as_of
            elif name == DELETED:
                test = ~column.to_numpy(zero_copy_only=False)
            else:
                test = np.isin(column.to_numpy(), wanted)
            current = test if current is None else np.logical_and(current, test, out=current)
        found = np.flatnonzero(current)
        found_keys.append(batch.column(KEY).to_numpy()[found])
        parts.append(found + offset if offset else found)
        offset += batch.num_rows
    if len(parts) == 1:
        return parts[0], found_keys[0]
    if not parts:
        return np.empty(0, dtype=np.intp), np.empty(0, dtype=np.int64)
    return np.concatenate(parts), np.concatenate(found_keys)
