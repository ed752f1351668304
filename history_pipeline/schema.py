"""Schema history: table descriptors, and the handler of every schema change.

The state is a :class:`SchemaState` (the live tables and every supercolumn ever
made); each handler is a pure function from a state and one schema-change
event to the next state plus the ``schema_history`` rows it writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from history_pipeline.casts import CastFailure, cast_value
from history_pipeline.errors import HistoryConflictError
from history_pipeline.events import (
    AddColumn,
    ChangeColumnNullable,
    ChangeColumnType,
    ColumnSpec,
    CreateTable,
    DropColumn,
    DropTable,
    RenameColumn,
    RenameTable,
    ReorderColumn,
    SchemaChange,
)
from history_pipeline.types import DataType, decode_value, parse_data_type


@dataclass(frozen=True)
class ColumnDescriptor:
    column_uuid: str
    column_name: str
    data_type: DataType
    is_nullable: bool
    ordinal_key: str
    supercolumn: str
    #: the column's default (from add_column), in WAL form and in the type it was declared with:
    #: an insert that omits the column stores it, cast to the column's type then (as PostgreSQL
    #: keeps a default expression and coerces it on use)
    default: Any = None
    default_type: DataType | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "column_uuid": self.column_uuid,
            "column_name": self.column_name,
            "data_type": str(self.data_type),
            "is_nullable": self.is_nullable,
            "ordinal_key": self.ordinal_key,
            "supercolumn_name": self.supercolumn,
        }
        if self.default is not None:
            out["default"] = self.default
            out["default_type"] = str(self.default_type or self.data_type)
        return out

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> ColumnDescriptor:
        return ColumnDescriptor(
            obj["column_uuid"],
            obj["column_name"],
            parse_data_type(obj["data_type"]),
            obj["is_nullable"],
            obj["ordinal_key"],
            obj["supercolumn_name"],
            obj.get("default"),
            parse_data_type(obj["default_type"]) if obj.get("default_type") else None,
        )

    def default_value(self) -> Any:
        """The Python value an insert that omits this column stores (None: NULL)."""
        if self.default is None:
            return None
        declared = self.default_type or self.data_type
        try:
            return cast_value(decode_value(declared, self.default), declared, self.data_type)
        except CastFailure:
            return None


@dataclass(frozen=True)
class TableDescriptor:
    """A table's schema at one time: columns in their order (by ordinal key)."""

    table_uuid: str
    table_name: str
    columns: tuple[ColumnDescriptor, ...]

    def column(self, column_uuid: str) -> ColumnDescriptor | None:
        for c in self.columns:
            if c.column_uuid == column_uuid:
                return c
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "table_uuid": self.table_uuid,
            "table_name": self.table_name,
            "column_descriptors": [c.to_json() for c in self.columns],
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> TableDescriptor:
        return TableDescriptor(
            obj["table_uuid"],
            obj["table_name"],
            tuple(ColumnDescriptor.from_json(c) for c in obj["column_descriptors"]),
        )


@dataclass(frozen=True)
class Supercolumn:
    """A column of a supertable: never dropped, always nullable."""

    name: str
    column_uuid: str
    data_type: DataType
    created_t: int


@dataclass(frozen=True)
class SchemaHistoryEntry:
    """One row of ``_history_catalog.schema_history``; ``descriptor`` None marks a drop (or old name)."""

    table_uuid: str
    table_name: str
    logical_timestamp: int
    descriptor: TableDescriptor | None

    def to_json(self) -> dict[str, Any]:
        return {
            "table_uuid": self.table_uuid,
            "table_name": self.table_name,
            "logical_timestamp": self.logical_timestamp,
            "schema_descriptor": None if self.descriptor is None else self.descriptor.to_json(),
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> SchemaHistoryEntry:
        d = obj["schema_descriptor"]
        return SchemaHistoryEntry(
            obj["table_uuid"],
            obj["table_name"],
            obj["logical_timestamp"],
            None if d is None else TableDescriptor.from_json(d),
        )

    def descriptor_text(self) -> str | None:
        return None if self.descriptor is None else json.dumps(self.descriptor.to_json())


def _frozen(d: dict[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(d)


@dataclass(frozen=True)
class SchemaState:
    """Live tables by uuid, and every supercolumn each table (live or dropped) ever had."""

    tables: Mapping[str, TableDescriptor] = field(default_factory=lambda: _frozen({}))
    supercolumns: Mapping[str, tuple[Supercolumn, ...]] = field(default_factory=lambda: _frozen({}))

    def table_by_name(self, name: str) -> TableDescriptor | None:
        for table in self.tables.values():
            if table.table_name == name:
                return table
        return None

    def require_table(self, table_uuid: str) -> TableDescriptor:
        table = self.tables.get(table_uuid)
        if table is None:
            raise HistoryConflictError(f"unknown table {table_uuid} (never created, or dropped)")
        return table

    def with_table(self, table: TableDescriptor, new_supercolumn: Supercolumn | None = None) -> SchemaState:
        tables = dict(self.tables)
        tables[table.table_uuid] = table
        supers = dict(self.supercolumns)
        if new_supercolumn is not None:
            supers[table.table_uuid] = supers.get(table.table_uuid, ()) + (new_supercolumn,)
        return SchemaState(_frozen(tables), _frozen(supers))

    def without_table(self, table_uuid: str) -> SchemaState:
        tables = dict(self.tables)
        del tables[table_uuid]
        return SchemaState(_frozen(tables), self.supercolumns)


def supercolumn_name(column_uuid: str, t: int) -> str:
    """``<column_uuid>-<t of creation>``."""
    return f"{column_uuid}-{t}"


def default_ordinal_key(index: int) -> str:
    """Ordinal keys given to columns declared without one, in declaration order."""
    return f"{index:08d}"


def _sorted_columns(columns: Iterable[ColumnDescriptor]) -> tuple[ColumnDescriptor, ...]:
    return tuple(sorted(columns, key=lambda c: (c.ordinal_key, c.column_uuid)))


def _descriptor_column(spec: ColumnSpec, t: int, ordinal_key: str) -> ColumnDescriptor:
    return ColumnDescriptor(
        spec.column_uuid,
        spec.column_name,
        spec.data_type,
        spec.is_nullable,
        ordinal_key,
        supercolumn_name(spec.column_uuid, t),
    )


def _replace_column(table: TableDescriptor, column: ColumnDescriptor) -> TableDescriptor:
    columns = [column if c.column_uuid == column.column_uuid else c for c in table.columns]
    return replace(table, columns=_sorted_columns(columns))


def _require_column(table: TableDescriptor, column_uuid: str) -> ColumnDescriptor:
    column = table.column(column_uuid)
    if column is None:
        raise HistoryConflictError(
            f"table {table.table_name} ({table.table_uuid}) has no column {column_uuid}"
        )
    return column


def _check_name_free(state: SchemaState, name: str, except_uuid: str | None = None) -> None:
    other = state.table_by_name(name)
    if other is not None and other.table_uuid != except_uuid:
        raise HistoryConflictError(f"a table named {name!r} already exists ({other.table_uuid})")


def _check_column_name_free(table: TableDescriptor, name: str, except_uuid: str | None = None) -> None:
    for c in table.columns:
        if c.column_name == name and c.column_uuid != except_uuid:
            raise HistoryConflictError(f"table {table.table_name} already has a column named {name!r}")


def apply_schema_change(
    state: SchemaState, event: SchemaChange
) -> tuple[SchemaState, tuple[SchemaHistoryEntry, ...]]:
    """The handler of ``event``: the next state and the schema_history rows written."""
    t = event.t
    if isinstance(event, CreateTable):
        if event.table_uuid in state.tables or event.table_uuid in state.supercolumns:
            raise HistoryConflictError(f"table {event.table_uuid} already exists (or existed)")
        _check_name_free(state, event.table_name)
        columns = [
            _descriptor_column(spec, t, spec.ordinal_key or default_ordinal_key(i))
            for i, spec in enumerate(event.columns)
        ]
        table = TableDescriptor(event.table_uuid, event.table_name, _sorted_columns(columns))
        supers = tuple(Supercolumn(c.supercolumn, c.column_uuid, c.data_type, t) for c in columns)
        tables = dict(state.tables)
        tables[table.table_uuid] = table
        all_supers = dict(state.supercolumns)
        all_supers[table.table_uuid] = supers
        return SchemaState(_frozen(tables), _frozen(all_supers)), (
            SchemaHistoryEntry(table.table_uuid, table.table_name, t, table),
        )

    table = state.require_table(event.table_uuid)
    if isinstance(event, DropTable):
        return state.without_table(table.table_uuid), (
            SchemaHistoryEntry(table.table_uuid, table.table_name, t, None),
        )
    if isinstance(event, RenameTable):
        if event.new_name == table.table_name:
            raise HistoryConflictError(f"table {table.table_name} is already named {event.new_name!r}")
        _check_name_free(state, event.new_name, table.table_uuid)
        renamed = replace(table, table_name=event.new_name)
        return state.with_table(renamed), (
            SchemaHistoryEntry(table.table_uuid, table.table_name, t, None),
            SchemaHistoryEntry(table.table_uuid, event.new_name, t, renamed),
        )
    if isinstance(event, AddColumn):
        spec = event.column
        if table.column(spec.column_uuid) is not None:
            raise HistoryConflictError(f"table {table.table_name} already has column {spec.column_uuid}")
        if any(s.column_uuid == spec.column_uuid for s in state.supercolumns.get(table.table_uuid, ())):
            raise HistoryConflictError(
                f"column {spec.column_uuid} existed before in table {table.table_name}; "
                "a re-added column needs a new column_uuid"
            )
        _check_column_name_free(table, spec.column_name)
        key = spec.ordinal_key or _key_after(table)
        column = replace(
            _descriptor_column(spec, t, key),
            default=event.default,
            default_type=spec.data_type if event.default is not None else None,
        )
        new_table = replace(table, columns=_sorted_columns(table.columns + (column,)))
        return state.with_table(
            new_table, Supercolumn(column.supercolumn, column.column_uuid, column.data_type, t)
        ), (SchemaHistoryEntry(table.table_uuid, table.table_name, t, new_table),)

    column = _require_column(table, event.column_uuid)
    new_super: Supercolumn | None = None
    if isinstance(event, DropColumn):
        new_table = replace(table, columns=tuple(c for c in table.columns if c is not column))
    elif isinstance(event, RenameColumn):
        _check_column_name_free(table, event.new_name, column.column_uuid)
        new_table = _replace_column(table, replace(column, column_name=event.new_name))
    elif isinstance(event, ChangeColumnType):
        changed = replace(
            column,
            data_type=event.data_type,
            supercolumn=supercolumn_name(column.column_uuid, t),
        )
        if not _default_survives(column, event.data_type):
            changed = replace(changed, default=None, default_type=None)
        new_super = Supercolumn(changed.supercolumn, changed.column_uuid, changed.data_type, t)
        new_table = _replace_column(table, changed)
    elif isinstance(event, ChangeColumnNullable):
        new_table = _replace_column(table, replace(column, is_nullable=event.is_nullable))
    elif isinstance(event, ReorderColumn):
        new_table = _replace_column(table, replace(column, ordinal_key=event.ordinal_key))
    else:  # pragma: no cover - the union is exhausted above
        raise TypeError(f"not a schema change: {event!r}")
    return state.with_table(new_table, new_super), (
        SchemaHistoryEntry(table.table_uuid, table.table_name, t, new_table),
    )


def _default_survives(column: ColumnDescriptor, target: DataType) -> bool:
    """Can the column's default still be stored once the column is of type ``target``?"""
    if column.default is None:
        return False
    declared = column.default_type or column.data_type
    try:
        return cast_value(decode_value(declared, column.default), declared, target) is not None
    except CastFailure:
        return False


def _key_after(table: TableDescriptor) -> str:
    if not table.columns:
        return default_ordinal_key(0)
    return max(c.ordinal_key for c in table.columns) + "0"


def replay_schema_history(entries: Iterable[SchemaHistoryEntry]) -> SchemaState:
    """The schema state after a sequence of schema_history rows (in timestamp order)."""
    tables: dict[str, TableDescriptor] = {}
    supers: dict[str, list[Supercolumn]] = {}
    for entry in entries:
        if entry.descriptor is None:
            current = tables.get(entry.table_uuid)
            if current is not None and current.table_name == entry.table_name:
                del tables[entry.table_uuid]
            continue
        tables[entry.table_uuid] = entry.descriptor
        known = {s.name for s in supers.setdefault(entry.table_uuid, [])}
        for c in entry.descriptor.columns:
            if c.supercolumn not in known:
                created = int(c.supercolumn.rsplit("-", 1)[1])
                supers[entry.table_uuid].append(Supercolumn(c.supercolumn, c.column_uuid, c.data_type, created))
                known.add(c.supercolumn)
    return SchemaState(_frozen(tables), _frozen({k: tuple(v) for k, v in supers.items()}))


def descriptor_at(
    entries: Iterable[SchemaHistoryEntry], name_or_uuid: str, as_of: int
) -> TableDescriptor | None:
    """The descriptor of a table by name or uuid as of ``as_of`` (entries with t < as_of)."""
    state = replay_schema_history(e for e in entries if e.logical_timestamp < as_of)
    table = state.table_by_name(name_or_uuid)
    if table is None:
        table = state.tables.get(name_or_uuid)
    return table


def tables_at(entries: Iterable[SchemaHistoryEntry], as_of: int) -> tuple[TableDescriptor, ...]:
    """Every table in force as of ``as_of``, sorted by name."""
    state = replay_schema_history(e for e in entries if e.logical_timestamp < as_of)
    return tuple(sorted(state.tables.values(), key=lambda d: d.table_name))
