"""``diff``: the keys inserted, deleted and changed between two states of a table, computed by DuckDB.

DuckDB joins the live rows of both states on the key (a FULL OUTER JOIN of two as-of views over the
catalog's files) and keeps the keys present on one side only, or on both with a column that
differs; the answer streams as Arrow record batches (``DIFF_COLUMNS``), inserted keys first, then
deleted, then changed, each in key order. No row becomes a Python value here.

"Differs" is the comparison the API has always made on the Python values (``from_arrow_value``),
NaN equal to NaN: for the stored types whose equality is that comparison's (integers, floats, text,
bytes, UUID, dates and times, intervals, NUMERIC(p, s)) DuckDB decides (``IS DISTINCT FROM``);
unconstrained NUMERIC is compared by its exact text without trailing zeros; a JSONB or array value
whose stored text is unchanged is unchanged. The few rows no SQL comparison settles alone (a JSONB
or array text that changed, a column whose type changed between the states) are compared in
Python, on those rows' values of those columns only, with the CAST of ``casts.py`` that the
compaction applied (an integer column widened is compared in SQL).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from history_pipeline.casts import CastFailure, cast_value
from history_pipeline.schema import ColumnDescriptor, TableDescriptor
from history_pipeline.supertable import KEY
from history_pipeline.types import DataType, TypeKind, from_arrow_values

#: the kinds of change, in the order the answer lists them
KINDS = ("inserted", "deleted", "changed")

#: kinds whose stored values are equal exactly when their Python values are
_EXACT = frozenset({
    TypeKind.BOOLEAN, TypeKind.SMALLINT, TypeKind.INTEGER, TypeKind.BIGINT, TypeKind.REAL, TypeKind.DOUBLE,
    TypeKind.TEXT, TypeKind.VARCHAR, TypeKind.BYTEA, TypeKind.UUID, TypeKind.DATE, TypeKind.TIME,
    TypeKind.TIMESTAMP, TypeKind.TIMESTAMPTZ, TypeKind.INTERVAL,
})
_INTEGERS = frozenset({TypeKind.SMALLINT, TypeKind.INTEGER, TypeKind.BIGINT})
#: a NUMERIC's stored text in positional notation (what the store writes); anything else is left to Python
_PLAIN_NUMBER = r"-?[0-9]+(\.[0-9]*)?"


@dataclass(frozen=True)
class DiffSides:
    """What a diff compares: one table (by uuid) as of two timestamps, with its descriptor at each
    (None where the table does not exist then) and the live views of both states on one cursor."""

    table_uuid: str
    from_: int
    to: int
    before: TableDescriptor | None
    after: TableDescriptor | None
    #: the DuckDB view of the live rows as of ``from_`` / ``to`` (None where the descriptor is)
    before_view: str | None
    after_view: str | None
    #: per supercolumn, its stored Arrow type (what DuckDB's answer is cast back to)
    stored: pa.Schema


def diff_schema(sides: DiffSides, depths: tuple[dict[str, set[int]], dict[str, set[int]]],
                as_stored: bool = False) -> pa.Schema:
    """The answer's schema: kind, key, and the row before and after as structs of the columns named
    and typed as ``load_table`` gives them then, or with ``as_stored`` as the supertable stores
    them (what the service sends: lossless, and read back by ``diff_to_dict`` exactly as the local
    ``diff`` reads them); each field's SQL type is in its ``data_type`` metadata."""
    return pa.schema([
        pa.field("kind", pa.string(), nullable=False),
        pa.field("key", pa.int64(), nullable=False),
        pa.field("before", _side_type(sides, sides.before, depths[0], as_stored)),
        pa.field("after", _side_type(sides, sides.after, depths[1], as_stored)),
    ])


def _side_type(sides: DiffSides, descriptor: TableDescriptor | None, depths: dict[str, set[int]],
               as_stored: bool) -> pa.DataType:
    if descriptor is None:
        return pa.struct([])
    rows = pa.table({KEY: pa.array([], pa.int64()),
                     **{c.supercolumn: pa.array([], sides.stored.field(c.supercolumn).type)
                        for c in descriptor.columns}})
    children = _children(rows, descriptor, depths, as_stored)
    return pa.struct([_field(c, child.type) for c, child in zip(descriptor.columns, children, strict=True)])


def _children(rows: pa.Table, descriptor: TableDescriptor, depths: dict[str, set[int]],
              as_stored: bool) -> list[pa.Array]:
    """The columns of one side, from rows of stored types named by supercolumn."""
    if as_stored:
        return [rows.column(c.supercolumn).combine_chunks() for c in descriptor.columns]
    from history_pipeline.query.engine import project

    shown = project(rows, descriptor, depths)
    return [shown.column(i + 1).combine_chunks() for i in range(len(descriptor.columns))]


def _field(column: ColumnDescriptor, kind: pa.DataType) -> pa.Field:
    return pa.field(column.column_name, kind, metadata={"data_type": str(column.data_type)})


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class _Pair:
    """One column present in both states: its descriptors and its aliases in the joined rows."""

    old: ColumnDescriptor
    new: ColumnDescriptor
    before: str
    after: str

    @property
    def settled_in_sql(self) -> bool:
        """Does the SQL comparison alone decide every row of this column?"""
        s, t = self.old.data_type, self.new.data_type
        if s == t:  # (an unconstrained NUMERIC's text not in positional notation is left to Python)
            return s.kind in _EXACT or s.is_exact_decimal
        return s.kind in _INTEGERS and t.kind in _INTEGERS

    def differs_sql(self) -> str:
        """TRUE: the values differ; FALSE: they are equal; NULL: Python decides (``_python_differs``)."""
        b, a = f"b.{_ident(self.before)}", f"a.{_ident(self.after)}"
        s, t = self.old.data_type, self.new.data_type
        if s == t and (s.kind in _EXACT or s.is_exact_decimal):
            return f"({b} IS DISTINCT FROM {a})"
        if s == t and s.kind is TypeKind.NUMERIC:
            # equal numbers may be written with other trailing zeros ('1.50', '1.5') or signs of zero
            plain = f"regexp_full_match({b}, '{_PLAIN_NUMBER}') AND regexp_full_match({a}, '{_PLAIN_NUMBER}')"
            return (f"(CASE WHEN {b} IS NOT DISTINCT FROM {a} THEN false WHEN {b} IS NULL OR {a} IS NULL THEN true "
                    f"WHEN {plain} THEN {_numeric_text(b)} <> {_numeric_text(a)} END)")
        if s.kind in _INTEGERS and t.kind in _INTEGERS:  # a widened (or narrowed) integer: the same number
            return f"(CAST({b} AS HUGEINT) IS DISTINCT FROM CAST({a} AS HUGEINT))"
        if s == t:  # JSONB, arrays: the same stored text is the same value
            return f"(CASE WHEN {b} IS NOT DISTINCT FROM {a} THEN false END)"
        return f"(CASE WHEN {b} IS NULL AND {a} IS NULL THEN false END)"  # a type change: CAST in Python


def _numeric_text(column: str) -> str:
    """A plain decimal text without trailing fractional zeros, and '0' for any zero."""
    trimmed = f"CASE WHEN contains({column}, '.') THEN rtrim(rtrim({column}, '0'), '.') ELSE {column} END"
    return f"(CASE WHEN ({trimmed}) = '-0' THEN '0' ELSE ({trimmed}) END)"


def _pairs(sides: DiffSides) -> list[_Pair]:
    if sides.before is None or sides.after is None:
        return []
    before = {c.column_uuid: i for i, c in enumerate(sides.before.columns)}
    return [
        _Pair(sides.before.columns[before[c.column_uuid]], c, f"b{before[c.column_uuid]}", f"a{j}")
        for j, c in enumerate(sides.after.columns) if c.column_uuid in before
    ]


def _side_sql(view: str | None, descriptor: TableDescriptor | None, prefix: str) -> str:
    if view is None or descriptor is None:
        return f"(SELECT CAST(NULL AS BIGINT) AS {_ident(KEY)} WHERE false)"
    columns = "".join(f", {_ident(c.supercolumn)} AS {prefix}{i}" for i, c in enumerate(descriptor.columns))
    return f"(SELECT {_ident(KEY)}{columns} FROM {_ident(view)})"


def _joined(sides: DiffSides) -> str:
    return (f"{_side_sql(sides.before_view, sides.before, 'b')} b FULL OUTER JOIN "
            f"{_side_sql(sides.after_view, sides.after, 'a')} a ON b.{_ident(KEY)} = a.{_ident(KEY)}")


def _differs_sql(pairs: Sequence[_Pair]) -> str:
    return "(" + " OR ".join(p.differs_sql() for p in pairs) + ")" if pairs else "false"


def python_differs(pairs: Sequence[tuple[DataType, DataType, list[Any], list[Any]]], count: int) -> list[bool]:
    """Per row, does any of the columns differ? Each pair is (type before, type after, the Python
    values before, after): the value before is CAST to the type after (a failing CAST differs),
    NaN equals NaN."""
    found = [False] * count
    for old, new, before, after in pairs:
        for i in range(count):
            if found[i]:
                continue
            value = before[i]
            if old != new:
                try:
                    value = cast_value(value, old, new)
                except CastFailure:
                    found[i] = True
                    continue
            other = after[i]
            if not (value == other or (value != value and other != other)):  # noqa: PLR0124 (NaN)
                found[i] = True
    return found


def unsettled_changes(con: Any, sides: DiffSides) -> pa.Array:
    """The keys in both states that SQL alone cannot call equal or changed, and that Python finds changed."""
    pairs = _pairs(sides)
    open_pairs = [p for p in pairs if not p.settled_in_sql]
    if not open_pairs:
        return pa.array([], pa.int64())
    names = [name for p in open_pairs for name in (f"b.{_ident(p.before)}", f"a.{_ident(p.after)}")]
    rows = con.sql(
        f"SELECT b.{_ident(KEY)} AS k, {', '.join(names)} FROM {_joined(sides)} "
        f"WHERE b.{_ident(KEY)} IS NOT NULL AND a.{_ident(KEY)} IS NOT NULL AND {_differs_sql(pairs)} IS NULL"
    ).to_arrow_table()
    if rows.num_rows == 0:
        return pa.array([], pa.int64())
    values = []
    for n, p in enumerate(open_pairs):
        before = rows.column(1 + 2 * n).cast(sides.stored.field(p.old.supercolumn).type)
        after = rows.column(2 + 2 * n).cast(sides.stored.field(p.new.supercolumn).type)
        values.append((p.old.data_type, p.new.data_type, from_arrow_values(p.old.data_type, before),
                       from_arrow_values(p.new.data_type, after)))
    changed = python_differs(values, rows.num_rows)
    return pc.filter(rows.column(0), pa.array(changed, pa.bool_())).combine_chunks()


def diff_query(sides: DiffSides) -> str:
    """The SELECT of the answer's rows (kind as 0, 1, 2; the key; the columns before, then after),
    given a table ``__diff_unsettled(k)`` of the keys Python found changed."""
    pairs = _pairs(sides)
    k = _ident(KEY)
    before = "".join(f", b.b{i}" for i in range(len(sides.before.columns) if sides.before else 0))
    after = "".join(f", a.a{i}" for i in range(len(sides.after.columns) if sides.after else 0))
    return (
        f"SELECT CASE WHEN b.{k} IS NULL THEN 0 WHEN a.{k} IS NULL THEN 1 ELSE 2 END AS __kind, "
        f"coalesce(a.{k}, b.{k}) AS __key{before}{after} FROM {_joined(sides)} "
        f"WHERE b.{k} IS NULL OR a.{k} IS NULL OR {_differs_sql(pairs)} "
        f"OR a.{k} IN (SELECT k FROM __diff_unsettled) ORDER BY __kind, __key"
    )


def answer_batches(source: pa.RecordBatchReader, sides: DiffSides, schema: pa.Schema,
                   depths: tuple[dict[str, set[int]], dict[str, set[int]]],
                   as_stored: bool = False) -> Iterator[pa.RecordBatch]:
    """DuckDB's rows of ``diff_query`` as batches of ``schema`` (``diff_schema``'s)."""
    kinds = pa.array(KINDS, pa.string())
    width_before = len(sides.before.columns) if sides.before else 0
    for batch in source:
        n = batch.num_rows
        kind = batch.column(0).cast(pa.int32())
        key = batch.column(1).cast(pa.int64())
        structs = []
        for descriptor, offset, absent, side_depths, field in (
            (sides.before, 2, 0, depths[0], schema.field("before")),
            (sides.after, 2 + width_before, 1, depths[1], schema.field("after")),
        ):
            if descriptor is None:
                structs.append(pa.nulls(n, field.type))
                continue
            rows = pa.table({KEY: key, **{
                c.supercolumn: batch.column(offset + i).cast(sides.stored.field(c.supercolumn).type)
                for i, c in enumerate(descriptor.columns)}})
            children = _children(rows, descriptor, side_depths, as_stored)
            mask = pc.equal(kind, absent)
            if children:
                structs.append(pa.StructArray.from_arrays(children, fields=list(field.type), mask=mask))
            else:
                structs.append(pa.array([None if m else {} for m in mask.to_pylist()], field.type))
        yield pa.RecordBatch.from_arrays([pc.take(kinds, kind), key, *structs], schema=schema)


def diff_to_dict(answer: pa.Table | pa.RecordBatchReader) -> dict[str, list[dict[str, Any]]]:
    """A diff answer of stored types (``as_stored``) in the API's form: {"inserted": [{"key",
    "after"}], "deleted": [{"key", "before"}], "changed": [{"key", "before", "after"}]}, values as
    ``fetch_row`` gives them."""
    out: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for kind, entry in diff_entries(answer):
        out[kind].append(entry)
    return out


def diff_entries(answer: pa.Table | pa.RecordBatchReader) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind, entry) of each key of a diff answer of stored types, one batch converted at a time."""
    batches = answer.to_batches() if isinstance(answer, pa.Table) else answer
    for batch in batches:
        kinds = batch.column(0).to_pylist()
        keys = batch.column(1).to_pylist()
        before, after = _python_rows(batch.column(2)), _python_rows(batch.column(3))
        for kind, key, old, new in zip(kinds, keys, before, after, strict=True):
            entry: dict[str, Any] = {"key": key}
            if kind != "inserted":
                entry["before"] = old
            if kind != "deleted":
                entry["after"] = new
            yield kind, entry


def _python_rows(column: pa.StructArray | pa.ChunkedArray) -> list[dict[str, Any] | None]:
    """Each row of a struct column as {field name: Python value}, typed by each field's data_type."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    names, values = [], []
    from history_pipeline.types import parse_data_type

    for i, field in enumerate(column.type):
        names.append(field.name)
        values.append(from_arrow_values(parse_data_type((field.metadata or {})[b"data_type"].decode()),
                                        column.field(i)))
    valid = column.is_valid().to_pylist()
    rows = zip(*values, strict=True) if values else ([()] * len(column))
    return [dict(zip(names, row, strict=True)) if ok else None for ok, row in zip(valid, rows, strict=True)]
