"""The fold of one key range of a table, vectorized in Arrow (run inside one Spark ``mapInArrow``).

Input: the rows of whole keys sorted by (key, t, line): the prior image (kind ``prior``, or
``gone`` for a key whose newest prior version is a delete; line 0), the segment's decoded
mutations (``insert``/``update``/``delete``, or a decode error), each with per supercolumn a
carrier value ``v<i>`` and a "set" flag ``s<i>`` (an explicit NULL differs from "not given").
Output: the versions to write (one per (key, t)), one snapshot per backfill, and the smallest
failing line. Every step is an Arrow compute kernel over whole columns (shifts, forward fills
within a key, takes); only a backfill's cast runs per value (``casts.py``), as schema changes
are rare.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from history_pipeline.casts import CastFailure, cast_value
from history_pipeline.compaction.carriers import from_carrier, to_carrier
from history_pipeline.compaction.plan import Backfill
from history_pipeline.events import ROW_OPS
from history_pipeline.types import TypeKind, arrow_type, from_arrow_value, to_arrow_value

PRIOR, GONE, BACKFILL = "prior", "gone", "backfill"
SORT = [("key", "ascending"), ("t", "ascending"), ("line", "ascending")]
_INTEGERS = (TypeKind.SMALLINT, TypeKind.INTEGER, TypeKind.BIGINT)


@dataclass(frozen=True)
class Failure:
    """One failing line: the segment is quarantined naming the smallest."""

    line: int
    key: int | None
    error_class: str
    reason: str


@dataclass(frozen=True)
class Folded:
    """A key range folded: versions and snapshots (``key, is_deleted, t, v<i>``) or a failure."""

    versions: pa.Table
    snapshots: tuple[tuple[int, pa.Table], ...]  # (snapshot_as_of, live rows)
    failure: Failure | None
    images: pa.Table | None = None  # each key's newest image afterwards, when asked for


def _col(table: pa.Table, name: str) -> pa.Array:
    column = table.column(name)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _prev(arr: pa.Array) -> pa.Array:
    """``arr`` shifted down by one (the previous row's value; NULL on the first row)."""
    if len(arr) == 0:
        return arr
    return pa.concat_arrays([pa.nulls(1, arr.type), arr.slice(0, len(arr) - 1)])


def _next(arr: pa.Array) -> pa.Array:
    """``arr`` shifted up by one (the next row's value; NULL on the last row)."""
    if len(arr) == 0:
        return arr
    return pa.concat_arrays([arr.slice(1), pa.nulls(1, arr.type)])


def _and_not_null(*masks: Any) -> pa.Array:
    out = masks[0]
    for m in masks[1:]:
        out = pc.and_kleene(out, m)
    return pc.fill_null(out, False)


class _Frame:
    """Shifts and per-key helpers of rows sorted by (key, t, line)."""

    def __init__(self, rows: pa.Table):
        self.rows = rows
        self.n = rows.num_rows
        self.idx = pa.array(np.arange(self.n, dtype=np.int64))  # not from a Python range: no per-row objects
        key = _col(rows, "key")
        self.same_prev = pc.fill_null(pc.equal(key, _prev(key)), False)
        self.same_next = pc.fill_null(pc.equal(key, _next(key)), False)
        self.key_start = pc.fill_null_forward(pc.if_else(self.same_prev, pa.scalar(None, pa.int64()), self.idx))
        self.kind = _col(rows, "kind")
        self.t = _col(rows, "t")
        self.line = _col(rows, "line")

    def last_within_key(self, mask: pa.Array, upto: pa.Array | None = None) -> pa.Array:
        """Per key, the index of the last row at or before each row where ``mask`` holds (or NULL)."""
        found = pc.fill_null_forward(pc.if_else(mask, self.idx, pa.scalar(None, pa.int64())))
        return pc.if_else(pc.fill_null(pc.greater_equal(found, self.key_start), False), found,
                          pa.scalar(None, pa.int64()))

    def image(self, i: int) -> pa.Array:
        """Per row, the index of the newest row of its key (up to it) that set supercolumn ``i``."""
        return self.last_within_key(pc.fill_null(_col(self.rows, f"s{i}"), False))

    def last_of_prefix(self, prefix: pa.Array) -> pa.Array:
        """Rows that are the last of their key where ``prefix`` (a per-key prefix of rows) holds."""
        return _and_not_null(prefix, pc.invert(_and_not_null(self.same_next, _next(prefix))))


def _sorted(rows: pa.Table) -> pa.Table:
    return rows.sort_by(SORT) if rows.num_rows else rows


def _last_prior(rows: pa.Table) -> pa.Table:
    """Keep only each key's newest prior row, and only when it is live."""
    f = _Frame(rows)
    is_prior = pc.is_in(f.kind, pa.array([PRIOR, GONE]))
    newest = f.last_of_prefix(is_prior)
    keep = pc.or_(pc.invert(is_prior), _and_not_null(newest, pc.equal(f.kind, PRIOR)))
    return rows.filter(keep)


def _before(f: _Frame, b: Backfill, inclusive: bool) -> pa.Array:
    at = pc.and_(pc.equal(f.t, b.t), (pc.less_equal if inclusive else pc.less)(f.line, b.line))
    return pc.fill_null(pc.or_(pc.less(f.t, b.t), at), False)


def _cast_values(b: Backfill, keys: list[int], source: pa.Array | None) -> tuple[pa.Array, list[str | None]]:
    """The backfill's value for each live key (a default, or the old value cast) and any failure."""
    target_type = arrow_type(b.target.data_type)
    if b.source is None or source is None:  # a default: one value for every key
        value = pa.array([to_arrow_value(b.target.data_type, b.default)], target_type)
        return to_carrier(value.take(pa.array(np.zeros(len(keys), np.int64))), target_type), [None] * len(keys)
    if b.source.data_type.kind in _INTEGERS and b.target.data_type.kind in _INTEGERS:
        try:  # an integer into an integer is the value itself when it fits: one Arrow cast
            cast = pc.cast(from_carrier(source, arrow_type(b.source.data_type)), target_type, safe=True)
            return to_carrier(cast, target_type), [None] * len(keys)
        except pa.ArrowInvalid:
            pass  # out of range somewhere: the per-value casts below name the key and say why
    values: list[Any] = []
    errors: list[str | None] = []
    old = from_carrier(source, arrow_type(b.source.data_type)).to_pylist()
    for key, raw in zip(keys, old, strict=True):  # casts are per value (casts.py), once per schema change
        try:
            values.append(cast_value(from_arrow_value(b.source.data_type, raw), b.source.data_type,
                                     b.target.data_type))
            errors.append(None)
        except CastFailure as exc:
            values.append(None)
            errors.append(
                f"change of column {b.target.column_uuid} to {b.target.data_type}: "
                f"key {key} holds a value that cannot be cast: {exc}"
            )
    items = [to_arrow_value(b.target.data_type, v) for v in values]
    return to_carrier(pa.array(items, target_type), target_type), errors


def _backfill(rows: pa.Table, b: Backfill, target: int, source: int | None,
              width: int) -> tuple[pa.Table, Failure | None]:
    """``rows`` with a backfill row for every key live just before ``b``, and the first cast failure."""
    f = _Frame(rows)
    last = f.last_of_prefix(_before(f, b, inclusive=False))
    live = _and_not_null(last, pc.not_equal(f.kind, "delete"))
    at = pc.indices_nonzero(live)
    keys = pc.take(_col(rows, "key"), at)
    source_values = None if source is None else pc.take(_col(rows, f"v{source}"), pc.take(f.image(source), at))
    values, errors = _cast_values(b, keys.to_pylist(), source_values)
    n = len(keys)
    columns: dict[str, pa.Array] = {
        "key": keys, "t": pa.array([b.t] * n, pa.int64()), "line": pa.array([b.line] * n, pa.int64()),
        "kind": pa.array([BACKFILL] * n, pa.string()),
    }
    for i in range(width):
        columns[f"v{i}"] = values if i == target else pa.nulls(n, rows.schema.field(f"v{i}").type)
        columns[f"s{i}"] = pa.array([i == target] * n, pa.bool_())
    added = pa.table(columns).select(rows.column_names).cast(rows.schema)
    failed = [(k, e) for k, e in zip(keys.to_pylist(), errors, strict=True) if e is not None]
    failure = None
    if failed:
        key, reason = min(failed)
        failure = Failure(b.line, key, "CastError", reason)
    return _sorted(pa.concat_tables([rows, added])), failure


def _not_null_failure(rows: pa.Table, b: Backfill, target: int) -> Failure | None:
    """A NOT NULL check's failure: the smallest key live just before ``b`` whose image holds NULL
    in supercolumn ``target`` (column kernels over the rows the fold already holds)."""
    f = _Frame(rows)
    live = _and_not_null(f.last_of_prefix(_before(f, b, inclusive=False)), pc.not_equal(f.kind, "delete"))
    at = pc.indices_nonzero(live)
    values = pc.take(_col(rows, f"v{target}"), pc.take(f.image(target), at))
    empty = pc.filter(pc.take(_col(rows, "key"), at), pc.is_null(values))
    if not len(empty):
        return None
    key = pc.min(empty).as_py()
    return Failure(b.line, key, "HistoryConflictError", b.refused(key))


def _snapshot(rows: pa.Table, b: Backfill, width: int) -> pa.Table:
    """The live image of every key just after backfill ``b`` (its t: the key's last event's)."""
    f = _Frame(rows)
    last = f.last_of_prefix(_before(f, b, inclusive=True))
    at = pc.indices_nonzero(_and_not_null(last, pc.not_equal(f.kind, "delete")))
    event = f.last_within_key(pc.not_equal(f.kind, BACKFILL))
    columns = {
        "key": pc.take(_col(rows, "key"), at),
        "is_deleted": pa.array([False] * len(at), pa.bool_()),
        "t": pc.take(f.t, pc.take(event, at)),
    }
    for i in range(width):
        columns[f"v{i}"] = pc.take(_col(rows, f"v{i}"), pc.take(f.image(i), at))
    return pa.table(columns)


def _images(f: _Frame, width: int) -> pa.Table:
    """Each key's image after all its rows (backfills included): ``key, is_deleted, t, v<i>``, t its
    last event's (a delete's image is empty)."""
    at = pc.indices_nonzero(pc.invert(f.same_next))
    deleted = pc.fill_null(pc.equal(pc.take(f.kind, at), "delete"), False)
    event = f.last_within_key(pc.not_equal(f.kind, BACKFILL))
    columns = {"key": pc.take(_col(f.rows, "key"), at), "is_deleted": deleted, "t": pc.take(f.t, pc.take(event, at))}
    for i in range(width):
        source = pc.if_else(deleted, pa.scalar(None, pa.int64()), pc.take(f.image(i), at))
        columns[f"v{i}"] = pc.take(_col(f.rows, f"v{i}"), source)
    return pa.table(columns)


def _sequence_failure(f: _Frame) -> Failure | None:
    """The first insert of a live key, or update/delete of a missing one."""
    live_before = _and_not_null(f.same_prev, pc.not_equal(_prev(f.kind), "delete"))
    insert = pc.equal(f.kind, "insert")
    missing = pc.is_in(f.kind, pa.array(["update", "delete"]))
    bad = pc.or_(_and_not_null(insert, live_before), _and_not_null(missing, pc.invert(live_before)))
    at = pc.indices_nonzero(pc.fill_null(bad, False))
    if len(at) == 0:
        return None
    lines = pc.take(f.line, at)
    first = at[pc.index(lines, pc.min(lines)).as_py()].as_py()
    kind, key, line = f.kind[first].as_py(), f.rows.column("key")[first].as_py(), f.line[first].as_py()
    why = "which is already live" if kind == "insert" else "which does not exist"
    return Failure(line, key, "HistoryConflictError", f"{kind} of key {key}, {why}")


def _versions(f: _Frame, width: int) -> pa.Table:
    """One full image per (key, t); a key born and deleted within one t leaves no version."""
    live_before = _and_not_null(f.same_prev, pc.not_equal(_prev(f.kind), "delete"))
    first_at_t = pc.invert(_and_not_null(f.same_prev, pc.equal(f.t, _prev(f.t))))
    last_at_t = pc.invert(_and_not_null(f.same_next, pc.equal(f.t, _next(f.t))))
    live_at_t = pc.take(live_before, f.last_within_key(first_at_t))
    deleted = pc.fill_null(pc.equal(f.kind, "delete"), False)
    keep = _and_not_null(pc.is_in(f.kind, pa.array(ROW_OPS)), last_at_t,
                         pc.invert(_and_not_null(deleted, pc.invert(live_at_t))))
    at = pc.indices_nonzero(keep)
    kept_deleted = pc.take(deleted, at)
    columns = {"key": pc.take(_col(f.rows, "key"), at), "is_deleted": kept_deleted, "t": pc.take(f.t, at)}
    for i in range(width):
        source = pc.take(f.image(i), at)
        source = pc.if_else(kept_deleted, pa.scalar(None, pa.int64()), source)  # a delete's image is empty
        columns[f"v{i}"] = pc.take(_col(f.rows, f"v{i}"), source)
    return pa.table(columns)


def fold(
    rows: pa.Table, width: int, backfills: Sequence[tuple[Backfill, int, int | None]], images: bool = False
) -> Folded:
    """Fold one key range: ``backfills`` are (backfill, target index, source index or None); with
    ``images`` also each key's newest image afterwards (what a group task carries on)."""
    failures: list[Failure] = []
    failed = pc.is_valid(_col(rows, "error_class"))
    if pc.any(failed).as_py():
        bad = rows.filter(failed).sort_by([("line", "ascending")]).slice(0, 1).to_pylist()[0]
        failures.append(Failure(bad["line"], None, bad["error_class"], bad["reason"]))
        rows = rows.filter(pc.invert(failed))
    rows = _last_prior(_sorted(rows.drop_columns(["error_class", "reason"])))
    snapshots = []
    for b, target, source in backfills:
        if b.refusal is not None:  # a check, not a fill: no rows, no snapshot
            failure = _not_null_failure(rows, b, target)
            if failure is not None:
                failures.append(failure)
            continue
        rows, failure = _backfill(rows, b, target, source, width)
        if failure is not None:
            failures.append(failure)
        snapshots.append((b.t + 1, _snapshot(rows, b, width)))
    f = _Frame(rows)
    failure = _sequence_failure(f)
    if failure is not None:
        failures.append(failure)
    first = min(failures, key=lambda x: (x.line, -1 if x.key is None else x.key)) if failures else None
    return Folded(_versions(f, width), tuple(snapshots), first, _images(f, width) if images and f.n else None)
