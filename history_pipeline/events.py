"""The event model: one immutable type per WAL record of the contract.

``parse_event`` turns a decoded JSON object into an event (validating its
shape), ``event_to_record`` turns an event back into the JSON object written
to a segment. Values of row mutations stay in their WAL (JSON) form here;
they are checked against the column types by the schema history, which knows
the types in force at each timestamp.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Union

from history_pipeline.errors import DataTypeError, MalformedRecordError, ValueTypeError
from history_pipeline.types import DataType, decode_value, parse_data_type

MAX_T = 2**63 - 1
MIN_KEY, MAX_KEY = -(2**63), 2**63 - 1

#: The opening close record of a database's very first segment: nothing has happened yet.
GENESIS_T = -1


@dataclass(frozen=True)
class ColumnSpec:
    """A column as declared by ``create_table`` or ``add_column``."""

    column_uuid: str
    column_name: str
    data_type: DataType
    is_nullable: bool = True
    ordinal_key: str | None = None


@dataclass(frozen=True)
class CreateTable:
    t: int
    table_uuid: str
    table_name: str
    columns: tuple[ColumnSpec, ...]


@dataclass(frozen=True)
class DropTable:
    t: int
    table_uuid: str


@dataclass(frozen=True)
class RenameTable:
    t: int
    table_uuid: str
    new_name: str


_NO_DEFAULT: Any = None


@dataclass(frozen=True)
class AddColumn:
    t: int
    table_uuid: str
    column: ColumnSpec
    #: WAL form of the value that rows existing at ``t`` read for the column (None: NULL).
    default: Any = _NO_DEFAULT


@dataclass(frozen=True)
class DropColumn:
    t: int
    table_uuid: str
    column_uuid: str


@dataclass(frozen=True)
class RenameColumn:
    t: int
    table_uuid: str
    column_uuid: str
    new_name: str


@dataclass(frozen=True)
class ChangeColumnType:
    t: int
    table_uuid: str
    column_uuid: str
    data_type: DataType
    #: the rows existing at the change are not cast: they read NULL in the column until the writer gives
    #: each its new value, right after the change (a database that computed them by an expression)
    values_follow: bool = False


@dataclass(frozen=True)
class ChangeColumnNullable:
    t: int
    table_uuid: str
    column_uuid: str
    is_nullable: bool


@dataclass(frozen=True)
class ReorderColumn:
    t: int
    table_uuid: str
    column_uuid: str
    ordinal_key: str


@dataclass(frozen=True)
class Insert:
    t: int
    table_uuid: str
    key: int
    values: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Update:
    t: int
    table_uuid: str
    key: int
    values: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Delete:
    t: int
    table_uuid: str
    key: int


@dataclass(frozen=True)
class Close:
    """No event with a timestamp ``<= t`` follows. ``seal`` is set on a segment's sealing record."""

    t: int
    seal: SealDigest | None = None


@dataclass(frozen=True)
class SealDigest:
    """Record count and SHA-256 of every byte of a segment before its sealing record."""

    records: int
    sha256: str


SchemaChange = Union[
    CreateTable,
    DropTable,
    RenameTable,
    AddColumn,
    DropColumn,
    RenameColumn,
    ChangeColumnType,
    ChangeColumnNullable,
    ReorderColumn,
]
RowMutation = Union[Insert, Update, Delete]
Event = Union[SchemaChange, RowMutation, Close]

SCHEMA_CHANGES = (
    CreateTable,
    DropTable,
    RenameTable,
    AddColumn,
    DropColumn,
    RenameColumn,
    ChangeColumnType,
    ChangeColumnNullable,
    ReorderColumn,
)
ROW_MUTATIONS = (Insert, Update, Delete)

OP_NAMES: dict[type, str] = {
    CreateTable: "create_table",
    DropTable: "drop_table",
    RenameTable: "rename_table",
    AddColumn: "add_column",
    DropColumn: "drop_column",
    RenameColumn: "rename_column",
    ChangeColumnType: "change_column_type",
    ChangeColumnNullable: "change_column_nullable",
    ReorderColumn: "reorder_column",
    Insert: "insert",
    Update: "update",
    Delete: "delete",
    Close: "close",
}

#: the ops as the WAL spells them, for code that matches lines without parsing them (Spark, Arrow)
SCHEMA_OPS = tuple(OP_NAMES[kind] for kind in SCHEMA_CHANGES)
ROW_OPS = tuple(OP_NAMES[kind] for kind in ROW_MUTATIONS)


def is_schema_change(event: Event) -> bool:
    """True for the nine schema-change records."""
    return isinstance(event, SCHEMA_CHANGES)


# --- parsing ----------------------------------------------------------------------


class _Fields:
    """Typed access to a record's fields; every failure names the field."""

    def __init__(self, record: Mapping[str, Any], op: str, allowed: set[str]):
        unknown = set(record) - allowed - {"op", "t"}
        if unknown:
            expected = ", ".join(["op", "t", *sorted(allowed - {"op", "t"})])
            raise ValueError(f"{op}: unknown field(s) {sorted(unknown)}; expected fields: {expected} "
                             "(see docs/wal-format.md)")
        self.record = record
        self.op = op

    def require(self, name: str) -> Any:
        if name not in self.record:
            raise ValueError(f"{self.op}: missing field {name!r}")
        return self.record[name]

    def string(self, name: str) -> str:
        value = self.require(name)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{self.op}: field {name!r} must be a non-empty string")
        return value

    def boolean(self, name: str) -> bool:
        value = self.require(name)
        if not isinstance(value, bool):
            raise ValueError(f"{self.op}: field {name!r} must be true or false")
        return value

    def key(self) -> int:
        value = self.require("key")
        if isinstance(value, bool) or not isinstance(value, int) or not MIN_KEY <= value <= MAX_KEY:
            raise ValueError(f"{self.op}: field 'key' must be a signed 64-bit integer, got {value!r}")
        return value

    def values(self) -> Mapping[str, Any]:
        value = self.require("values")
        if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
            raise ValueError(f"{self.op}: field 'values' must be an object of column_uuid: value")
        return MappingProxyType(dict(value))

    def data_type(self, name: str) -> DataType:
        try:
            return parse_data_type(self.require(name))
        except DataTypeError as exc:
            raise ValueError(f"{self.op}: field {name!r}: {exc}") from exc


def _parse_column(op: str, raw: Any) -> ColumnSpec:
    if not isinstance(raw, dict):
        raise ValueError(f"{op}: a column must be an object")
    fields = _Fields(raw, op, {"column_uuid", "column_name", "data_type", "is_nullable", "ordinal_key"})
    ordinal_key = raw.get("ordinal_key")
    if ordinal_key is not None and not isinstance(ordinal_key, str):
        raise ValueError(f"{op}: ordinal_key must be a string")
    nullable = raw.get("is_nullable", True)
    if not isinstance(nullable, bool):
        raise ValueError(f"{op}: is_nullable must be true or false")
    return ColumnSpec(
        column_uuid=fields.string("column_uuid"),
        column_name=fields.string("column_name"),
        data_type=fields.data_type("data_type"),
        is_nullable=nullable,
        ordinal_key=ordinal_key,
    )


def _parse_t(record: Mapping[str, Any], op: str) -> int:
    t = record.get("t")
    low = GENESIS_T if op == "close" else 0
    if isinstance(t, bool) or not isinstance(t, int) or not low <= t <= MAX_T:
        raise ValueError(f"{op}: field 't' must be an integer in [0, 2^63-1], got {t!r}")
    return t


_ROW_FIELDS = {"op", "t", "table_uuid", "key", "values"}


def _parse_row_fast(record: dict[str, Any]) -> Event | None:
    """The common case (a well-formed insert, update or delete) without the general checks;
    None sends anything unusual to the general parser, which explains what is wrong."""
    op = record.get("op")
    if op == "delete":
        if len(record) != 4:
            return None
        allowed = True
    elif op == "insert" or op == "update":
        allowed = len(record) == 5
    else:
        return None
    if not allowed or not record.keys() <= _ROW_FIELDS:
        return None
    t, key, table_uuid = record.get("t"), record.get("key"), record.get("table_uuid")
    if (
        type(t) is not int
        or not 0 <= t <= MAX_T
        or type(key) is not int
        or not MIN_KEY <= key <= MAX_KEY
        or type(table_uuid) is not str
        or not table_uuid
    ):
        return None
    if op == "delete":
        return Delete(t, table_uuid, key)
    values = record.get("values")
    if type(values) is not dict or not all(type(k) is str and k for k in values):
        return None
    proxy = MappingProxyType(dict(values))
    return Insert(t, table_uuid, key, proxy) if op == "insert" else Update(t, table_uuid, key, proxy)


def _parse(record: Any) -> Event:
    if isinstance(record, dict):
        fast = _parse_row_fast(record)
        if fast is not None:
            return fast
    if not isinstance(record, dict):
        raise ValueError("a record must be a JSON object")
    op = record.get("op")
    if not isinstance(op, str):
        raise ValueError("missing field 'op'")
    t = _parse_t(record, op) if op in _PARSERS else None
    parser = _PARSERS.get(op)
    if parser is None:
        raise ValueError(f"unknown op {op!r}; expected one of {sorted(_PARSERS)}")
    assert t is not None
    return parser(record, op, t)


def _create_table(r: Mapping[str, Any], op: str, t: int) -> CreateTable:
    f = _Fields(r, op, {"table_uuid", "table_name", "columns"})
    raw_columns = f.require("columns")
    if not isinstance(raw_columns, list):
        raise ValueError(f"{op}: field 'columns' must be a list")
    columns = tuple(_parse_column(op, c) for c in raw_columns)
    uuids = [c.column_uuid for c in columns]
    names = [c.column_name for c in columns]
    if len(set(uuids)) != len(uuids):
        raise ValueError(f"{op}: duplicate column_uuid")
    if len(set(names)) != len(names):
        raise ValueError(f"{op}: duplicate column_name")
    return CreateTable(t, f.string("table_uuid"), f.string("table_name"), columns)


def _add_column(r: Mapping[str, Any], op: str, t: int) -> AddColumn:
    f = _Fields(r, op, {"table_uuid", "column", "default"})
    column = _parse_column(op, f.require("column"))
    default = r.get("default")
    if default is not None:
        try:
            decode_value(column.data_type, default)
        except ValueTypeError as exc:
            raise ValueError(f"{op}: default: {exc}") from exc
    return AddColumn(t, f.string("table_uuid"), column, default)


def _ordinal_key(f: _Fields) -> str:
    value = f.require("ordinal_key")
    if not isinstance(value, str):
        raise ValueError(f"{f.op}: field 'ordinal_key' must be a string")
    return value


def _close(r: Mapping[str, Any], op: str, t: int) -> Close:
    _Fields(r, op, {"seal"})
    seal = r.get("seal")
    if seal is None:
        return Close(t)
    if (
        not isinstance(seal, dict)
        or not isinstance(seal.get("records"), int)
        or not isinstance(seal.get("sha256"), str)
    ):
        raise ValueError("close: field 'seal' must be {records: int, sha256: str}")
    return Close(t, SealDigest(seal["records"], seal["sha256"]))


def _drop_table(r: Mapping[str, Any], op: str, t: int) -> DropTable:
    f = _Fields(r, op, {"table_uuid"})
    return DropTable(t, f.string("table_uuid"))


def _rename_table(r: Mapping[str, Any], op: str, t: int) -> RenameTable:
    f = _Fields(r, op, {"table_uuid", "new_name"})
    return RenameTable(t, f.string("table_uuid"), f.string("new_name"))


def _drop_column(r: Mapping[str, Any], op: str, t: int) -> DropColumn:
    f = _Fields(r, op, {"table_uuid", "column_uuid"})
    return DropColumn(t, f.string("table_uuid"), f.string("column_uuid"))


def _rename_column(r: Mapping[str, Any], op: str, t: int) -> RenameColumn:
    f = _Fields(r, op, {"table_uuid", "column_uuid", "new_name"})
    return RenameColumn(t, f.string("table_uuid"), f.string("column_uuid"), f.string("new_name"))


def _change_column_type(r: Mapping[str, Any], op: str, t: int) -> ChangeColumnType:
    f = _Fields(r, op, {"table_uuid", "column_uuid", "data_type", "values_follow"})
    follow = f.boolean("values_follow") if "values_follow" in r else False
    return ChangeColumnType(t, f.string("table_uuid"), f.string("column_uuid"), f.data_type("data_type"), follow)


def _change_column_nullable(r: Mapping[str, Any], op: str, t: int) -> ChangeColumnNullable:
    f = _Fields(r, op, {"table_uuid", "column_uuid", "is_nullable"})
    return ChangeColumnNullable(t, f.string("table_uuid"), f.string("column_uuid"), f.boolean("is_nullable"))


def _reorder_column(r: Mapping[str, Any], op: str, t: int) -> ReorderColumn:
    f = _Fields(r, op, {"table_uuid", "column_uuid", "ordinal_key"})
    return ReorderColumn(t, f.string("table_uuid"), f.string("column_uuid"), _ordinal_key(f))


def _insert(r: Mapping[str, Any], op: str, t: int) -> Insert:
    f = _Fields(r, op, {"table_uuid", "key", "values"})
    return Insert(t, f.string("table_uuid"), f.key(), f.values())


def _update(r: Mapping[str, Any], op: str, t: int) -> Update:
    f = _Fields(r, op, {"table_uuid", "key", "values"})
    return Update(t, f.string("table_uuid"), f.key(), f.values())


def _delete(r: Mapping[str, Any], op: str, t: int) -> Delete:
    f = _Fields(r, op, {"table_uuid", "key"})
    return Delete(t, f.string("table_uuid"), f.key())


_PARSERS: dict[str, Any] = {
    "create_table": _create_table,
    "drop_table": _drop_table,
    "rename_table": _rename_table,
    "add_column": _add_column,
    "drop_column": _drop_column,
    "rename_column": _rename_column,
    "change_column_type": _change_column_type,
    "change_column_nullable": _change_column_nullable,
    "reorder_column": _reorder_column,
    "insert": _insert,
    "update": _update,
    "delete": _delete,
    "close": _close,
}


def parse_event(record: Any, *, segment: str | None = None, line: int | None = None) -> Event:
    """Turn one decoded JSON record into an event, or raise :class:`MalformedRecordError`."""
    if is_event(record):
        return record
    try:
        return _parse(record)
    except ValueError as exc:
        raise MalformedRecordError(str(exc), segment=segment, line=line) from None


def parse_line(text: str | bytes, *, segment: str | None = None, line: int | None = None) -> Event:
    """Parse one JSON line of a segment."""
    try:
        record = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRecordError(f"not valid JSON: {exc}", segment=segment, line=line) from None
    return parse_event(record, segment=segment, line=line)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON; write non-finite floats as strings")


def is_event(obj: Any) -> bool:
    """True for instances of the event types."""
    return type(obj) in OP_NAMES


# --- writing --------------------------------------------------------------------


def _column_record(c: ColumnSpec) -> dict[str, Any]:
    record: dict[str, Any] = {
        "column_uuid": c.column_uuid,
        "column_name": c.column_name,
        "data_type": str(c.data_type),
        "is_nullable": c.is_nullable,
    }
    if c.ordinal_key is not None:
        record["ordinal_key"] = c.ordinal_key
    return record


def event_to_record(event: Event) -> dict[str, Any]:
    """The JSON object of the WAL contract for ``event``."""
    record: dict[str, Any] = {"op": OP_NAMES[type(event)], "t": event.t}
    if isinstance(event, Close):
        if event.seal is not None:
            record["seal"] = {"records": event.seal.records, "sha256": event.seal.sha256}
        return record
    record["table_uuid"] = event.table_uuid
    if isinstance(event, CreateTable):
        record["table_name"] = event.table_name
        record["columns"] = [_column_record(c) for c in event.columns]
    elif isinstance(event, RenameTable):
        record["new_name"] = event.new_name
    elif isinstance(event, AddColumn):
        record["column"] = _column_record(event.column)
        if event.default is not None:
            record["default"] = event.default
    elif isinstance(event, (DropColumn, RenameColumn, ChangeColumnType, ChangeColumnNullable, ReorderColumn)):
        record["column_uuid"] = event.column_uuid
        if isinstance(event, RenameColumn):
            record["new_name"] = event.new_name
        elif isinstance(event, ChangeColumnType):
            record["data_type"] = str(event.data_type)
            if event.values_follow:
                record["values_follow"] = True
        elif isinstance(event, ChangeColumnNullable):
            record["is_nullable"] = event.is_nullable
        elif isinstance(event, ReorderColumn):
            record["ordinal_key"] = event.ordinal_key
    elif isinstance(event, (Insert, Update)):
        record["key"] = event.key
        record["values"] = dict(event.values)
    elif isinstance(event, Delete):
        record["key"] = event.key
    return record


def event_to_line(event: Event) -> bytes:
    """One UTF-8 JSON line (with its newline) for ``event``; a :class:`MalformedRecordError` when
    a string in it is not valid Unicode (a lone surrogate: JSON's ``\\ud800`` escape allows it)."""
    text = json.dumps(event_to_record(event), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end].encode("unicode_escape").decode()
        raise MalformedRecordError(
            f"a string holds {bad}, a lone surrogate that is not valid Unicode (UTF-8 cannot hold it)"
        ) from None
