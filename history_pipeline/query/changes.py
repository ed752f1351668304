"""The change feed: every committed row version and schema change with t in [since, until), in
(t, table, key) order, each with the row before (as of t) and after (as of t + 1).

Read from what compaction wrote, through one catalog state: the version files whose t range
meets the window (their rows filtered on ``logical_timestamp``, so row groups outside it are
skipped by their statistics), and the row before each key's first version in the window. Where
the files below the window are marked as of its end (``superseded_at``, docs/format.md), that row
is the one whose ``superseded_at`` is in the window: a filter whose row groups are chosen by their
t and ``superseded_at`` statistics, so its cost follows the changes, not the history. Elsewhere (an
open interval not marked yet) it is the key's row as of the window's start (the reconstruction
``fetch_row`` does). The window is cut at each schema change of the table, so that within a part
every version and the row before it are images under one schema, and at each snapshot, so that a
part's files are one interval's; each version is paired with the one before it by sorting the
part's keys and times. A long window is read in pieces, and the newest row
of each key a piece delivered is carried to the next, which then looks up only the keys it has
not seen.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from history_pipeline.catalog.files import live_rows, rows_below, select_files
from history_pipeline.catalog.model import CatalogState, FileKind
from history_pipeline.errors import (
    FutureTimestampError,
    NegativeTimestampError,
    PurgedTimestampError,
    QueryError,
    TableNotFoundError,
)
from history_pipeline.io.store import ObjectStore
from history_pipeline.query.engine import project
from history_pipeline.schema import SchemaHistoryEntry, Supercolumn, TableDescriptor, replay_schema_history
from history_pipeline.supertable import DELETED, KEY, LT, SUPERSEDED, column_chunks, supertable_schema
from history_pipeline.supertable.read import Footer, footer, read_row_groups

#: the operations of row records; a schema change is named by its WAL operation
ROW_OPS = ("insert", "update", "delete")


@dataclass(frozen=True)
class ChangeBatch:
    """Changes in (t, table, key) order, and where a consumer resumes once it has processed them.

    ``records`` columns: ``t``, ``table`` (its name as of t), ``table_uuid``, ``key`` (null for a
    schema change), ``op``, ``before`` and ``after``. In a batch of row changes ``before`` and
    ``after`` are structs of the table's columns under their names as of t (null: no row); in a
    batch of schema changes they are the table's descriptors as JSON text (null: no table).
    ``cursor`` is the ``since`` that delivers exactly the changes after this batch's whole
    transactions: the next t when the transaction of the batch's last t is complete, else that t
    (its rows already delivered come again: at-least-once)."""

    records: pa.RecordBatch
    cursor: int


RECORD_NAMES = ("t", "table", "table_uuid", "key", "op", "before", "after")


def empty_batch() -> pa.RecordBatch:
    """A batch of no changes (a cursor moved over a window that held none)."""
    types = [pa.int64(), pa.string(), pa.string(), pa.int64(), pa.string(), pa.string(), pa.string()]
    return pa.RecordBatch.from_arrays([pa.array([], t) for t in types], names=list(RECORD_NAMES))


def check_window(state: CatalogState, since: int, until: int) -> None:
    """A typed error unless [since, until) is answerable: 0 <= since <= until <= frontier + 1,
    ``since`` not below the purge point."""
    for name, value in (("since", since), ("until", until)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise QueryError(f"{name} must be an integer logical timestamp, got {value!r}")
    if since < 0:
        raise NegativeTimestampError(f"since={since} is negative: logical timestamps start at 0")
    if until > state.frontier + 1:
        raise FutureTimestampError(
            f"until={until} is in the future of the compacted history: the frontier is {state.frontier}, "
            f"so until must be <= {state.frontier + 1}")
    if since > until:
        raise QueryError(f"since={since} is after until={until}: the window [since, until) is empty backwards")
    if since < state.earliest:
        raise PurgedTimestampError(
            f"since={since} is before the purge point: history before {state.earliest} was removed by "
            f"retention; the earliest point a change feed can start from is {state.earliest}")


def matching_tables(history: Sequence[SchemaHistoryEntry], tables: Sequence[str] | None) -> list[str]:
    """The uuids of the tables asked for: every table (None), else each table that bore one of the
    names at some time or has it as uuid, so a feed started before a rename keeps following it."""
    uuids = list(dict.fromkeys(e.table_uuid for e in history))
    if tables is None:
        return uuids
    wanted = set(tables)
    found = [u for u in uuids if u in wanted or any(e.table_uuid == u and e.table_name in wanted for e in history)]
    missing = [name for name in tables if not any(
        name == u or any(e.table_uuid == u and e.table_name == name for e in history) for u in uuids)]
    if missing:
        names = ", ".join(sorted({e.table_name for e in history})) or "none"
        raise TableNotFoundError(f"no table named {', '.join(map(repr, missing))} at any time; tables ever: {names}")
    return found


def _epochs(history: Sequence[SchemaHistoryEntry], uuid: str) -> list[tuple[int, TableDescriptor | None]]:
    """(t of each schema change of a table, its descriptor from t + 1 on), in order."""
    epochs: list[tuple[int, TableDescriptor | None]] = []
    for entry in history:
        if entry.table_uuid == uuid:
            if epochs and epochs[-1][0] == entry.logical_timestamp:
                epochs[-1] = (entry.logical_timestamp, entry.descriptor or epochs[-1][1])
            else:
                epochs.append((entry.logical_timestamp, entry.descriptor))
    return epochs


def _at(epochs: list[tuple[int, TableDescriptor | None]], as_of: int) -> TableDescriptor | None:
    found = None
    for t, descriptor in epochs:
        if t >= as_of:
            break
        found = descriptor
    return found


def schema_kind(before: TableDescriptor | None, after: TableDescriptor | None) -> str:
    """The WAL operation that turned ``before`` into ``after`` (each schema change has a t of its own)."""
    if before is None:
        return "create_table"
    if after is None:
        return "drop_table"
    if before.table_name != after.table_name:
        return "rename_table"
    old = {c.column_uuid: c for c in before.columns}
    new = {c.column_uuid: c for c in after.columns}
    if set(new) - set(old):
        return "add_column"
    if set(old) - set(new):
        return "drop_column"
    for uuid, column in new.items():
        was = old[uuid]
        if was.column_name != column.column_name:
            return "rename_column"
        if was.data_type != column.data_type or was.supercolumn != column.supercolumn:  # a type change to its own type
            return "change_column_type"
        if was.is_nullable != column.is_nullable:
            return "change_column_nullable"
        if was.ordinal_key != column.ordinal_key:
            return "reorder_column"
    return "alter_table"  # a change the descriptors do not tell apart (a default's type, say)


def _schema_records(history: Sequence[SchemaHistoryEntry], uuid: str, since: int, until: int) -> pa.RecordBatch | None:
    epochs = _epochs(history, uuid)
    rows = []
    previous: TableDescriptor | None = None
    for t, descriptor in epochs:
        if since <= t < until:
            name = (descriptor or previous).table_name  # type: ignore[union-attr]
            rows.append((t, name, schema_kind(previous, descriptor), _text(previous), _text(descriptor)))
        previous = descriptor
    if not rows:
        return None
    t, name, op, before, after = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [pa.array(t, pa.int64()), pa.array(name, pa.string()), pa.array([uuid] * len(rows), pa.string()),
         pa.nulls(len(rows), pa.int64()), pa.array(op, pa.string()), pa.array(before, pa.string()),
         pa.array(after, pa.string())],
        names=list(RECORD_NAMES))


def _text(descriptor: TableDescriptor | None) -> str | None:
    return None if descriptor is None else json.dumps(descriptor.to_json())


@dataclass(frozen=True)
class Carried:
    """The versions a window's earlier parts delivered, for one table under one schema: ``rows``
    (the key, ``is_deleted``, t and the part's supercolumns) holds, for every key with a version in
    [``since``, the next part's start), at least its newest. The next part takes the row before a
    key's first version from here, and from the files only for keys it does not hold."""

    since: int
    rows: pa.Table


#: carried rows kept at most: a window touching more keys than this looks the rest up again
CARRY_ROWS = 2_000_000


def _image_schema(schema: pa.Schema, wanted: Sequence[str]) -> pa.Schema:
    return pa.schema([schema.field(KEY), schema.field(DELETED), schema.field(LT), *(schema.field(c) for c in wanted)])


def _row_records(store: ObjectStore, state: CatalogState, uuid: str, descriptor: TableDescriptor,
                 start: int, end: int, carried: Carried | None = None
                 ) -> tuple[pa.RecordBatch | None, Carried]:
    """The row versions of one table with t in [start, end), no schema change of it inside, and
    what the next part of the window carries (``carried``: what the parts before gave, under the
    same schema, ending at ``start``)."""
    supercolumns = replay_schema_history(state.schema_history).supercolumns.get(uuid, ())
    schema = supertable_schema(supercolumns)
    wanted = [c.supercolumn for c in descriptor.columns]
    target = _image_schema(schema, wanted)
    if carried is None or carried.rows.schema != target:
        carried = Carried(start, target.empty_table())
    files = [f for f in state.versions_of(uuid)
             if f.row_count and (f.max_t is None or f.max_t >= start) and (f.min_t is None or f.min_t < end)]
    if not files:
        return None, carried
    # the row groups whose t statistics meet the part, through the cached footers
    versions = rows_below(store, files, target, end, start)
    if versions.num_rows == 0:
        return None, carried
    versions = versions.cast(target)
    keys = pc.unique(versions.column(KEY))
    known = _newest_of(carried.rows.filter(pc.is_in(carried.rows.column(KEY), keys)))
    base = superseded_in(store, state, uuid, target, carried.since, start, end)
    if base is None:  # files not marked as of the part's end: the keys' rows as of its start
        unknown = pc.filter(keys, pc.invert(pc.is_in(keys, known.column(KEY)))).to_pylist()
        base = _as_of(store, state, uuid, supercolumns, target, start, unknown)
    rows = pa.concat_tables([known, base, versions]).combine_chunks()
    after_index, before_index = pair_versions(rows.column(KEY).to_numpy(), rows.column(LT).to_numpy(), start)
    has_before = before_index >= 0
    # the row before is none for a key's first row ever, and after a delete
    has_before[has_before] = ~rows.column(DELETED).to_numpy(zero_copy_only=False)[before_index[has_before]]
    no_before = pa.array(~has_before)
    deleted = pc.take(rows.column(DELETED), after_index)
    op = pc.if_else(deleted, "delete", pc.if_else(no_before, "insert", "update"))
    after = _images(project(rows.take(after_index), descriptor), deleted)
    before = _images(project(rows.take(np.where(has_before, before_index, 0)), descriptor), no_before)
    n = len(after_index)
    records = pa.RecordBatch.from_arrays(
        [pc.take(rows.column(LT), after_index).combine_chunks(),
         pa.repeat(pa.scalar(descriptor.table_name, pa.string()), n), pa.repeat(pa.scalar(uuid, pa.string()), n),
         pc.take(rows.column(KEY), after_index).combine_chunks(),
         op.combine_chunks() if isinstance(op, pa.ChunkedArray) else op, before, after],
        names=list(RECORD_NAMES))
    return records, _carry(carried, versions)


def pair_versions(keys: np.ndarray, times: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
    """(the rows with t >= ``start`` in (t, key) order, the row before each: the same key's row of
    the greatest smaller t, -1 when none). A key has one row per t."""
    by_key = sorted_by(keys, times)
    previous = np.full(len(keys), -1, dtype=np.int64)
    same = keys[by_key][1:] == keys[by_key][:-1]
    previous[by_key[1:][same]] = by_key[:-1][same]
    delivered = np.flatnonzero(times >= start)
    delivered = delivered[sorted_by(times[delivered], keys[delivered])]
    return delivered, previous[delivered]


def sorted_by(major: np.ndarray, minor: np.ndarray) -> np.ndarray:
    """The indices ordering integer rows by (``major``, ``minor``): one sort of a combined integer
    when both ranges fit in 62 bits together (a third of a two-key sort's time), else Arrow's."""
    if len(major) == 0:
        return np.empty(0, dtype=np.int64)
    low, high = int(major.min()), int(major.max())
    least, most = int(minor.min()), int(minor.max())
    span = most - least + 1
    if (high - low + 1) * span < 2**62:
        combined = (major.astype(np.int64) - low) * span + (minor.astype(np.int64) - least)
        return np.argsort(combined, kind="stable")
    order = pc.sort_indices(pa.table({"a": major, "b": minor}), sort_keys=[("a", "ascending"), ("b", "ascending")])
    return order.to_numpy()


def _newest_of(rows: pa.Table) -> pa.Table:
    """Each key's row of the greatest t."""
    if rows.num_rows == 0:
        return rows
    keys = rows.column(KEY).to_numpy()
    order = sorted_by(keys, rows.column(LT).to_numpy())
    last = np.ones(len(order), dtype=bool)
    last[:-1] = keys[order][1:] != keys[order][:-1]
    return rows.take(order[last])


def _carry(carried: Carried, versions: pa.Table) -> Carried:
    """``carried`` and ``versions`` for the next part (each key's newest row is taken when it is
    asked for); past ``CARRY_ROWS`` only the newest row of each key is kept, and when even those
    are more, nothing: the next part starts afresh."""
    rows = pa.concat_tables([carried.rows, versions])
    if rows.num_rows <= CARRY_ROWS:
        return Carried(carried.since, rows)
    rows = _newest_of(rows.combine_chunks())
    if rows.num_rows <= CARRY_ROWS:
        return Carried(carried.since, rows)
    return Carried(int(pc.max(versions.column(LT)).as_py()) + 1, rows.schema.empty_table())


def superseded_in(store: ObjectStore, state: CatalogState, uuid: str, target: pa.Schema, below: int,
                  start: int, end: int) -> pa.Table | None:
    """The rows of a table with t below ``below`` (<= ``start``) current as of ``start`` and
    superseded in [start, end), ``target``'s columns: the row before the first version in the part
    of each key whose newest version below ``start`` is older than ``below``. Read from the files
    the table as of ``start`` is read from, when every one is marked as of ``end`` or later (a
    row's ``superseded_at`` is then its key's next version, here the one in the part); only the
    row groups whose statistics allow such a row are read. None when the files are not so marked."""
    selection = select_files(state, uuid, start)
    files = selection.snapshot + selection.versions
    if not files:
        return target.empty_table()  # nothing below start: every key's first version is an insert
    if not replace(selection, as_of=end).closed or any(SUPERSEDED not in footer(store, f.path).columns
                                                       for f in files):
        return None
    chosen = [(f, groups) for f in files if (groups := _superseded_groups(footer(store, f.path), below, start, end))]
    if not chosen:
        return target.empty_table()
    rows = read_row_groups(store, chosen, target.append(pa.field(SUPERSEDED, pa.int64())))
    superseded = rows.column(SUPERSEDED)
    keep = pc.and_(pc.and_(pc.less(rows.column(LT), below), pc.greater_equal(superseded, start)),
                   pc.less(superseded, end))
    return rows.filter(keep).select(target.names)


def _superseded_groups(cached: Footer, below: int, start: int, end: int) -> list[int]:
    """The row groups of a marked file whose statistics allow a row with t < ``below`` and
    ``superseded_at`` in [start, end)."""
    chunk = column_chunks(cached.meta).get(SUPERSEDED, -1)
    chosen = []
    for rg, times in enumerate(cached.times):
        if (times.min_t is not None and times.min_t >= below) or times.never_superseded:
            continue
        if times.max_superseded is not None and times.max_superseded < start:
            continue
        stats = cached.meta.row_group(rg).column(chunk).statistics if chunk >= 0 else None
        if stats is not None and stats.has_min_max and stats.min >= end:
            continue
        chosen.append(rg)
    return chosen


def _as_of(store: ObjectStore, state: CatalogState, uuid: str, supercolumns: Sequence[Supercolumn],
           target: pa.Schema, as_of: int, keys: Sequence[int]) -> pa.Table:
    """The live rows of ``keys`` as of ``as_of`` (the reconstruction ``fetch_row`` does), ``target``'s
    columns, t shown as -1 (below every part)."""
    if not keys:
        return target.empty_table()
    wanted = target.names[3:]
    base = live_rows(store, state, uuid, supercolumns, as_of, keys=keys, columns=wanted, reserved=False)
    return pa.table([base.column(KEY).cast(pa.int64()), pa.array(np.zeros(base.num_rows, dtype=bool)),
                     pa.array(np.full(base.num_rows, -1, dtype=np.int64)),
                     *(base.column(c).cast(target.field(c).type) for c in wanted)], schema=target)


def _images(rows: pa.Table, absent: pa.Array | pa.ChunkedArray) -> pa.StructArray:
    """The table's columns (``project``'s, after synthetic_key) as one struct, null where ``absent``."""
    mask = absent.combine_chunks() if isinstance(absent, pa.ChunkedArray) else absent
    columns = [rows.column(i).combine_chunks() for i in range(1, rows.num_columns)]
    if not columns:
        return pa.array([None if m else {} for m in mask.to_pylist()], pa.struct([]))
    return pa.StructArray.from_arrays(columns, names=rows.column_names[1:], mask=mask)


def _parts(epochs: list[tuple[int, TableDescriptor | None]], since: int, until: int,
           snapshots: Sequence[int] = ()) -> list[tuple[int, int]]:
    """[start, end) pieces of the window with no schema change of the table strictly inside, cut
    at its snapshots too (so that a part's files are one interval's)."""
    cuts = sorted({t + 1 for t, _ in epochs if since <= t < until} | {s for s in snapshots if since < s < until})
    bounds = [since, *cuts, until]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if a < b]


def change_runs(store: ObjectStore, state: CatalogState, since: int, until: int,
                tables: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Every change with t in [since, until) of the tables asked for, as record batches whose
    concatenation is in (t, table, key) order (each batch is one table's, rows or schema). The
    window and the tables are checked before this returns; the files are read as it is iterated."""
    check_window(state, since, until)
    history = state.schema_history
    uuids = matching_tables(history, tables)
    for uuid in uuids:
        earliest = state.earliest_of(uuid)
        if since < earliest:
            name = next(e.table_name for e in reversed(history) if e.table_uuid == uuid)
            raise PurgedTimestampError(
                f"since={since} is before the purge point of table {name!r}: its history before {earliest} was "
                f"removed by its time-to-live; the earliest point its change feed can start from is {earliest}")
    return _runs(store, state, since, until, uuids)


#: versions read together at most (estimated from the files' row counts and t ranges): a longer
#: window is delivered in pieces of t, so memory stays bounded whatever the window
CHUNK_ROWS = 1_000_000


def chunks(state: CatalogState, uuids: Sequence[str], since: int, until: int,
           chunk_rows: int | None = None) -> list[tuple[int, int]]:
    """[since, until) cut into equal pieces of t, each estimated to hold at most about
    ``chunk_rows`` versions (a file's rows counted as spread evenly over its t range)."""
    chunk_rows = chunk_rows or CHUNK_ROWS
    rows = 0.0
    for uuid in uuids:
        for f in state.versions_of(uuid):
            if f.row_count and f.min_t is not None and f.max_t is not None and f.max_t >= since and f.min_t < until:
                overlap = min(f.max_t, until - 1) - max(f.min_t, since) + 1
                rows += f.row_count * overlap / (f.max_t - f.min_t + 1)
    pieces = max(1, min(until - since, int(rows // chunk_rows) + 1))
    bounds = [since + (until - since) * i // pieces for i in range(pieces + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if a < b] or [(since, until)]


def _runs(store: ObjectStore, state: CatalogState, since: int, until: int,
          uuids: Sequence[str]) -> Iterator[pa.RecordBatch]:
    history = state.schema_history
    epochs = {uuid: _epochs(history, uuid) for uuid in uuids}
    snapshots = {uuid: sorted({f.snapshot_as_of for f in state.files_of(uuid, FileKind.SNAPSHOT)
                               if f.snapshot_as_of is not None}) for uuid in uuids}
    carried: dict[str, Carried | None] = dict.fromkeys(uuids)
    for low, high in chunks(state, uuids, since, until):
        sources: list[pa.RecordBatch] = []
        for uuid in uuids:
            schema = _schema_records(history, uuid, low, high)
            if schema is not None:
                sources.append(schema)
            for start, end in _parts(epochs[uuid], low, high, snapshots[uuid]):
                descriptor = _at(epochs[uuid], start)
                if descriptor is None:
                    carried[uuid] = None
                    continue
                if carried[uuid] is not None and _at(epochs[uuid], carried[uuid].since) is not descriptor:
                    carried[uuid] = None  # a schema change between: the images before it are not this schema's
                rows, carried[uuid] = _row_records(store, state, uuid, descriptor, start, end, carried[uuid])
                if rows is not None:
                    sources.append(rows)
        yield from merge_in_order(sources)


def merge_in_order(sources: Sequence[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Slices of ``sources`` (each in (t, key) order, one table each) in (t, table, key) order."""
    times = [s.column(0).to_numpy() for s in sources]
    order = [(s.column(1)[0].as_py(), s.column(2)[0].as_py()) for s in sources]
    heap = [(int(times[i][0]), order[i], i, 0) for i in range(len(sources)) if len(sources[i])]
    heapq.heapify(heap)
    while heap:
        t, name, i, pos = heapq.heappop(heap)
        if heap:
            next_t, next_name = heap[0][0], heap[0][1]
            # rows at the other's t come first when this table's name sorts first
            end = int(np.searchsorted(times[i], next_t, side="right" if name < next_name else "left"))
            end = max(end, pos + 1)
        else:
            end = len(times[i])
        yield sources[i].slice(pos, end - pos)
        if end < len(times[i]):
            heapq.heappush(heap, (int(times[i][end]), name, i, end))


def changes(store: ObjectStore, state: CatalogState, since: int, until: int,
            tables: Sequence[str] | None = None) -> Iterator[ChangeBatch]:
    """``change_runs`` with the cursor a consumer resumes from after each batch."""
    return _with_cursors(change_runs(store, state, since, until, tables), until)


def _with_cursors(runs: Iterator[pa.RecordBatch], until: int) -> Iterator[ChangeBatch]:
    previous: pa.RecordBatch | None = None
    for batch in runs:
        if previous is not None:
            last = previous.column(0)[-1].as_py()
            yield ChangeBatch(previous, last if batch.column(0)[0].as_py() == last else last + 1)
        previous = batch
    if previous is not None:
        yield ChangeBatch(previous, until)
