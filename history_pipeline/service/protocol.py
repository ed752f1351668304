"""The HistoryService messages (FetchRow, LoadTable, GetCatalog, plus Sql, RowHistory,
Diff, Status and Changes) and their Arrow forms.

A request travels as a Flight ticket: JSON ``{"op": ..., <the message's fields>}``. Every answer
travels as an Arrow stream. A ``FetchRow`` may also travel as the body of a ``DoAction`` of type
``FETCH_ROW_ACTION`` (what the client sends): one round trip whose one result is the answer's
Arrow stream in one message, where a DoGet streams the schema and the batch as messages of their own.

- ``LoadTable`` and ``Sql``: the result table itself, in record batches. For ``LoadTable`` each
  column's field metadata carries its ``column_uuid`` (the ``column_uuid_mapping`` of the answer).
- ``FetchRow``: one row (none when the key is not live) whose fields are the table's columns as
  of the query timestamp, typed as stored (extension types as their storage), with
  ``column_uuid`` and ``data_type`` in their metadata; the schema metadata says whether the row
  was ``found``.
- ``GetCatalog``: one row per table (uuid, name, the descriptor as JSON).
- ``Changes``: one row per change of the feed, with the cursor after it.
- ``RowHistory``: one row per version; the row values, whose columns and types vary between
  versions, as a JSON text that tags every non-JSON value (:func:`encode_value` / :func:`decode_value`).
- ``Diff``: the Arrow answer of the local ``diff_reader`` as it is (kind, key, and the row before
  and after as typed structs whose fields carry their SQL type), built by DuckDB without a Python
  value per row: in the stored types (``as_stored``), or as ``load_table`` types them when asked.

Everything here is pure: no I/O, no server or client state.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from decimal import Decimal
from typing import Any

import pyarrow as pa

from history_pipeline.query.diff import diff_to_dict
from history_pipeline.schema import TableDescriptor
from history_pipeline.service.errors import InvalidRequestError, ServiceError
from history_pipeline.types import DataType, Interval, arrow_type, from_arrow_value, parse_data_type, to_arrow_value

# --- requests ------------------------------------------------------------------------


def _check_int(message: str, name: str, value: Any) -> None:
    # the local API refuses a non-integer timestamp with TypeError: so does the client, before sending
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{message}.{name} must be an integer, got {value!r}")


def _check_str(message: str, name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{message}.{name} must be a string, got {value!r}")


@dataclass(frozen=True)
class FetchRowRequest:
    """A FetchRow request. ``table_uuid`` also accepts the table's name as of the timestamp."""

    table_uuid: str
    synthetic_key: int
    query_timestamp: int

    def __post_init__(self) -> None:
        _check_str("FetchRowRequest", "table_uuid", self.table_uuid)
        _check_int("FetchRowRequest", "synthetic_key", self.synthetic_key)
        _check_int("FetchRowRequest", "query_timestamp", self.query_timestamp)


@dataclass(frozen=True)
class LoadTableRequest:
    """A LoadTable request. ``table_uuid`` also accepts the table's name as of the timestamp."""

    table_uuid: str
    query_timestamp: int
    #: False: the rows in no promised order (``HistoryStore.load_table``'s default). A ticket without
    #: the field (a client from before it) asks for key order, as it got then; ``HistoryClient``
    #: always sends it
    ordered: bool = True

    def __post_init__(self) -> None:
        _check_str("LoadTableRequest", "table_uuid", self.table_uuid)
        _check_int("LoadTableRequest", "query_timestamp", self.query_timestamp)
        if not isinstance(self.ordered, bool):
            raise TypeError(f"LoadTableRequest.ordered must be a boolean, got {self.ordered!r}")


@dataclass(frozen=True)
class GetCatalogRequest:
    """A GetCatalog request."""

    query_timestamp: int

    def __post_init__(self) -> None:
        _check_int("GetCatalogRequest", "query_timestamp", self.query_timestamp)


@dataclass(frozen=True)
class SqlRequest:
    """Read-only SQL against the database as of ``query_timestamp``."""

    query: str
    query_timestamp: int

    def __post_init__(self) -> None:
        _check_str("SqlRequest", "query", self.query)
        _check_int("SqlRequest", "query_timestamp", self.query_timestamp)


@dataclass(frozen=True)
class RowHistoryRequest:
    """Every retained version of one row."""

    table_uuid: str
    synthetic_key: int

    def __post_init__(self) -> None:
        _check_str("RowHistoryRequest", "table_uuid", self.table_uuid)
        _check_int("RowHistoryRequest", "synthetic_key", self.synthetic_key)


@dataclass(frozen=True)
class DiffRequest:
    """Keys inserted, deleted and changed between two query timestamps."""

    table_uuid: str
    from_timestamp: int
    to_timestamp: int
    #: False: the rows' columns in their stored types (lossless: ``diff`` reads them back exactly);
    #: True: typed as ``load_table`` gives them (``diff_reader``)
    load_table_types: bool = False

    def __post_init__(self) -> None:
        _check_str("DiffRequest", "table_uuid", self.table_uuid)
        _check_int("DiffRequest", "from_timestamp", self.from_timestamp)
        _check_int("DiffRequest", "to_timestamp", self.to_timestamp)
        if not isinstance(self.load_table_types, bool):
            raise TypeError(f"DiffRequest.load_table_types must be a boolean, got {self.load_table_types!r}")


@dataclass(frozen=True)
class ChangesRequest:
    """Every committed change with t in [since, until) (None: up to the frontier) of ``tables``
    (names or uuids; None: every table), as ``HistoryStore.changes`` delivers them."""

    since: int
    until: int | None = None
    tables: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _check_int("ChangesRequest", "since", self.since)
        if self.until is not None:
            _check_int("ChangesRequest", "until", self.until)
        if self.tables is not None:
            if isinstance(self.tables, str) or not isinstance(self.tables, list | tuple):
                raise TypeError(f"ChangesRequest.tables must be a list of names, got {self.tables!r}")
            for name in self.tables:
                _check_str("ChangesRequest", "tables", name)
            object.__setattr__(self, "tables", tuple(self.tables))  # a ticket's JSON list, kept immutable


@dataclass(frozen=True)
class TableSchemasRequest:
    """The name and the Arrow schema of a ``SELECT *`` of every table as of ``query_timestamp``
    (Flight SQL's GetTables)."""

    query_timestamp: int

    def __post_init__(self) -> None:
        _check_int("TableSchemasRequest", "query_timestamp", self.query_timestamp)


@dataclass(frozen=True)
class StatusRequest:
    """The frontier and the earliest answerable timestamp of the tenant's database."""


Request = (
    FetchRowRequest | LoadTableRequest | GetCatalogRequest | SqlRequest | RowHistoryRequest | DiffRequest
    | StatusRequest | ChangesRequest | TableSchemasRequest
)

OPERATIONS: Mapping[str, type] = {
    "FetchRow": FetchRowRequest,
    "LoadTable": LoadTableRequest,
    "GetCatalog": GetCatalogRequest,
    "Sql": SqlRequest,
    "RowHistory": RowHistoryRequest,
    "Diff": DiffRequest,
    "Status": StatusRequest,
    "Changes": ChangesRequest,
    "TableSchemas": TableSchemasRequest,
}
_OP_OF = {cls: op for op, cls in OPERATIONS.items()}

#: the DoAction type of a point lookup: its body a FetchRow request, its one result the answer
FETCH_ROW_ACTION = "FetchRow"


def operation(request: Request) -> str:
    """The operation name of a request message."""
    return _OP_OF[type(request)]


def encode_request(request: Request) -> bytes:
    """A request as the bytes of a Flight ticket."""
    return json.dumps({"op": operation(request), **asdict(request)}).encode()


@functools.cache
def _field_names(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    """A request message's fields, and those it must be given: a field with a default may be left
    out (a ticket of a client from before the field)."""
    return (frozenset(f.name for f in fields(cls)),
            frozenset(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING))


def decode_request(ticket: bytes) -> Request:
    """A Flight ticket back to its request message (InvalidRequestError when it is not one)."""
    try:
        body = json.loads(ticket)
    except ValueError as exc:
        raise InvalidRequestError(f"the ticket is not a JSON request: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("op"), str) or body["op"] not in OPERATIONS:
        raise InvalidRequestError(
            f"unknown operation {body.get('op') if isinstance(body, dict) else body!r}; "
            f"known: {', '.join(OPERATIONS)}"
        )
    cls = OPERATIONS[body.pop("op")]
    expected, required = _field_names(cls)
    if not required <= body.keys() <= expected:
        raise InvalidRequestError(
            f"{cls.__name__} takes the fields {sorted(expected)}, got {sorted(body)}"
        )
    try:
        return cls(**body)
    except TypeError as exc:
        raise InvalidRequestError(str(exc)) from None


# --- tagged JSON values (RowHistory, Diff) -------------------------------------------------


def encode_value(value: Any) -> Any:
    """A query-result value as JSON that :func:`decode_value` turns back into an equal value.

    JSON's own scalars and lists pass as they are; every other type (and every object, so that
    a JSONB object can never be mistaken for a tag) becomes a one-key ``{"$tag": ...}`` object.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, dt.time):
        return {"$time": value.isoformat()}
    if isinstance(value, Interval):
        return {"$interval": [value.months, value.days, value.micros]}
    if isinstance(value, (list, tuple)):
        return [encode_value(item) for item in value]
    if isinstance(value, dict):
        return {"$object": {str(k): encode_value(v) for k, v in value.items()}}
    raise TypeError(f"no wire form for a {type(value).__name__} value: {value!r}")


_DECODERS = {
    "$float": float,
    "$decimal": Decimal,
    "$uuid": uuid.UUID,
    "$bytes": lambda text: base64.b64decode(text),
    "$datetime": dt.datetime.fromisoformat,
    "$date": dt.date.fromisoformat,
    "$time": dt.time.fromisoformat,
    "$interval": lambda parts: Interval(*parts),
}


def decode_value(value: Any) -> Any:
    """The value :func:`encode_value` encoded."""
    if isinstance(value, list):
        return [decode_value(item) for item in value]
    if isinstance(value, dict):
        ((tag, body),) = value.items()
        if tag == "$object":
            return {k: decode_value(v) for k, v in body.items()}
        return _DECODERS[tag](body)
    return value


def _json_or_null(value: Any) -> str | None:
    return None if value is None else json.dumps(encode_value(value))


def _from_json_or_null(text: str | None) -> Any:
    return None if text is None else decode_value(json.loads(text))


# --- responses ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FetchRowResponse:
    """A FetchRow answer; ``values`` is None when no live row has the key."""

    column_uuid_mapping: tuple[str, ...]
    column_names: tuple[str, ...]
    values: tuple[Any, ...] | None

    def as_row(self) -> dict[str, Any] | None:
        """The row as the local ``fetch_row`` returns it: {column name: value}, or None."""
        if self.values is None:
            return None
        return dict(zip(self.column_names, self.values, strict=True))


@dataclass(frozen=True)
class LoadTableResponse:
    """A LoadTable answer: the column uuids in order and the values as an Arrow table."""

    column_uuid_mapping: tuple[str, ...]
    table: pa.Table


@dataclass(frozen=True)
class GetCatalogResponse:
    """A GetCatalog answer."""

    table_descriptors: tuple[TableDescriptor, ...]


def resolve_descriptor(
    catalog: Sequence[TableDescriptor], table: str
) -> TableDescriptor | None:
    """A table of a catalog by name first, else by uuid (the local API's resolution order)."""
    for descriptor in catalog:
        if descriptor.table_name == table:
            return descriptor
    for descriptor in catalog:
        if descriptor.table_uuid == table:
            return descriptor
    return None


def _wire_type(arrow: pa.DataType) -> pa.DataType:
    """An Arrow type with every extension type (UUID, JSON) replaced by its storage type.

    pyarrow cannot build lists of extension values from Python values; the column's SQL type
    travels beside it, and ``from_arrow_value`` reads the storage values back.
    """
    if isinstance(arrow, pa.BaseExtensionType):
        return _wire_type(arrow.storage_type)
    if pa.types.is_list(arrow):
        return pa.list_(_wire_type(arrow.value_type))
    return arrow


#: a FetchRow answer's columns: (uuid, name, type) of each
_RowColumns = tuple[tuple[str, str, DataType], ...]


#: the end of an Arrow IPC stream: a continuation marker and a zero length
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


@dataclass(frozen=True)
class _RowShape:
    """A FetchRow answer's schema, its fields as one struct (the row converts from Python in one
    call) and the schema as the first message of an Arrow IPC stream."""

    schema: pa.Schema
    row_type: pa.StructType
    head: bytes


@functools.lru_cache(maxsize=1024)
def _fetch_row_shape(columns: _RowColumns, found: bool) -> _RowShape:
    """The shape of a FetchRow answer (built once per table schema: a lookup's answer is sent
    for every event, and building the fields costs several times the row's own arrays)."""
    schema = pa.schema(
        [pa.field(name, _wire_type(arrow_type(data_type)),
                  metadata={"column_uuid": uuid_, "data_type": str(data_type)})
         for uuid_, name, data_type in columns],
        metadata={"found": "true" if found else "false"},
    )
    return _RowShape(schema, pa.struct(list(schema)), schema.serialize().to_pybytes())


def _fetch_row_batch(descriptor: TableDescriptor, row: Mapping[str, Any] | None) -> tuple[_RowShape, pa.RecordBatch]:
    shape = _fetch_row_shape(tuple((c.column_uuid, c.column_name, c.data_type) for c in descriptor.columns),
                             row is not None)
    values = [] if row is None else [
        {c.column_name: to_arrow_value(c.data_type, row[c.column_name]) for c in descriptor.columns}
    ]
    return shape, pa.RecordBatch.from_arrays(pa.array(values, shape.row_type).flatten(), schema=shape.schema)


def fetch_row_to_arrow(descriptor: TableDescriptor, row: Mapping[str, Any] | None) -> pa.Table:
    """A fetched row as a typed Arrow table of zero or one row (see the module docstring)."""
    return pa.Table.from_batches([_fetch_row_batch(descriptor, row)[1]])


def fetch_row_stream(descriptor: TableDescriptor, row: Mapping[str, Any] | None) -> tuple[int, bytes]:
    """:func:`fetch_row_to_arrow`'s table as the Arrow IPC stream the server sends, and its rows:
    the schema's message (kept per table schema), the row's batch and the end of the stream."""
    shape, batch = _fetch_row_batch(descriptor, row)
    return batch.num_rows, b"".join((shape.head, batch.serialize().to_pybytes(), _END_OF_STREAM))


#: a column's SQL type from its text (the same few texts come with every answer)
_data_type = functools.lru_cache(maxsize=1024)(parse_data_type)


@dataclass(frozen=True)
class _RowReading:
    """What a FetchRow answer's schema says: the schema, each column's uuid, name and SQL type, and
    whether a row was found."""

    schema: pa.Schema
    column_uuids: tuple[str, ...]
    column_names: tuple[str, ...]
    data_types: tuple[DataType, ...]
    found: bool


def _reading(schema: pa.Schema) -> _RowReading:
    metas = [field.metadata or {} for field in schema]
    return _RowReading(schema, tuple(meta[b"column_uuid"].decode() for meta in metas), tuple(schema.names),
                       tuple(_data_type(meta[b"data_type"].decode()) for meta in metas),
                       (schema.metadata or {}).get(b"found") == b"true")


@functools.lru_cache(maxsize=1024)
def _stream_reading(schema_message: bytes) -> _RowReading:
    """``_reading`` of an answer's schema message (the same bytes head every answer of a table)."""
    return _reading(pa.ipc.read_schema(pa.py_buffer(schema_message)))


def _response(reading: _RowReading, columns: Sequence[pa.Array | pa.ChunkedArray]) -> FetchRowResponse:
    values = None
    if reading.found:
        values = tuple(from_arrow_value(data_type, column.to_pylist()[0])
                       for data_type, column in zip(reading.data_types, columns, strict=True))
    return FetchRowResponse(reading.column_uuids, reading.column_names, values)


def fetch_row_from_arrow(table: pa.Table) -> FetchRowResponse:
    """The FetchRowResponse a :func:`fetch_row_to_arrow` table carries."""
    return _response(_reading(table.schema), table.columns)


def fetch_row_from_stream(body: pa.Buffer | bytes) -> FetchRowResponse:
    """The FetchRowResponse of a FetchRow answer as its Arrow IPC stream (:func:`fetch_row_stream`'s
    bytes): the schema message read once per table schema, then the row's batch against it
    (ServiceError when the bytes are not such a stream)."""
    try:
        messages = pa.ipc.MessageReader.open_stream(body)
        reading = _stream_reading(messages.read_next_message().serialize().to_pybytes())
        if not reading.found:
            return _response(reading, ())
        batch = pa.ipc.read_record_batch(messages.read_next_message(), reading.schema)
    except (pa.ArrowException, StopIteration, KeyError) as exc:
        raise ServiceError(f"the FetchRow answer is not an Arrow stream of a row: {exc}") from None
    if batch.num_rows != 1:
        raise ServiceError(f"a found FetchRow answer has one row, got {batch.num_rows}")
    return _response(reading, batch.columns)


def load_table_to_arrow(descriptor: TableDescriptor, table: pa.Table) -> pa.Table:
    """A loaded table with each column's uuid in its field metadata (the column_uuid_mapping)."""
    by_name = {c.column_name: c.column_uuid for c in descriptor.columns}
    schema = pa.schema(
        [
            field.with_metadata({"column_uuid": by_name[field.name]}) if field.name in by_name else field
            for field in table.schema
        ]
    )
    return pa.Table.from_arrays(table.columns, schema=schema)


def load_table_from_arrow(table: pa.Table) -> LoadTableResponse:
    """The LoadTableResponse of a streamed table; its table is exactly the local ``load_table``'s."""
    uuids = tuple(
        (field.metadata or {})[b"column_uuid"].decode()
        for field in table.schema
        if b"column_uuid" in (field.metadata or {})
    )
    plain = pa.schema([field.remove_metadata() for field in table.schema])
    return LoadTableResponse(uuids, pa.Table.from_arrays(table.columns, schema=plain))


def catalog_to_arrow(descriptors: Sequence[TableDescriptor]) -> pa.Table:
    """Table descriptors as rows: uuid, name and the descriptor in its JSON form."""
    return pa.table(
        {
            "table_uuid": pa.array([d.table_uuid for d in descriptors], pa.string()),
            "table_name": pa.array([d.table_name for d in descriptors], pa.string()),
            "schema_descriptor": pa.array([json.dumps(d.to_json()) for d in descriptors], pa.string()),
        }
    )


def catalog_from_arrow(table: pa.Table) -> GetCatalogResponse:
    """The GetCatalogResponse of :func:`catalog_to_arrow` rows."""
    texts = table.column("schema_descriptor").to_pylist()
    return GetCatalogResponse(tuple(TableDescriptor.from_json(json.loads(text)) for text in texts))


def row_history_to_arrow(versions: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Row versions as rows: logical_timestamp, is_deleted and the values as tagged JSON."""
    return pa.table(
        {
            "logical_timestamp": pa.array([v["logical_timestamp"] for v in versions], pa.int64()),
            "is_deleted": pa.array([v["is_deleted"] for v in versions], pa.bool_()),
            "values": pa.array([_json_or_null(v["values"]) for v in versions], pa.string()),
        }
    )


def row_history_from_arrow(table: pa.Table) -> list[dict[str, Any]]:
    """The row versions as the local ``row_history`` returns them."""
    return [
        {"logical_timestamp": row["logical_timestamp"], "is_deleted": row["is_deleted"],
         "values": _from_json_or_null(row["values"])}
        for row in table.to_pylist()
    ]


def diff_from_arrow(table: pa.Table) -> dict[str, list[dict[str, Any]]]:
    """The diff as the local ``diff`` returns it, from the answer ``diff_reader`` streams."""
    return diff_to_dict(table)


_CHANGE_FIELDS = ("t", "table", "table_uuid", "key", "op")


def changes_to_arrow(batches: Any) -> pa.Table:
    """Change-feed batches as rows: t, table, table_uuid, key, op, before and after as tagged JSON
    (a schema change's descriptors as objects), and the cursor to resume from after each row."""
    rows: list[dict[str, Any]] = []
    for batch in batches:
        records = batch.records.to_pylist()
        for i, row in enumerate(records):
            following = records[i + 1]["t"] if i + 1 < len(records) else None
            cursor = batch.cursor if following is None else row["t"] + 1 if following > row["t"] else row["t"]
            images = [row["before"], row["after"]]
            if row["key"] is None:  # a schema change: descriptors as JSON text
                images = [None if text is None else json.loads(text) for text in images]
            else:  # as fetch_row gives them: an Arrow interval as an Interval
                images = [None if image is None else {k: _interval(v) for k, v in image.items()} for image in images]
            rows.append({**{k: row[k] for k in _CHANGE_FIELDS}, "before": _json_or_null(images[0]),
                         "after": _json_or_null(images[1]), "cursor": cursor})
    types = {"t": pa.int64(), "table": pa.string(), "table_uuid": pa.string(), "key": pa.int64(), "op": pa.string(),
             "before": pa.string(), "after": pa.string(), "cursor": pa.int64()}
    return pa.table({name: pa.array([r[name] for r in rows], kind) for name, kind in types.items()})


def _interval(value: Any) -> Any:
    if isinstance(value, pa.MonthDayNano):
        return Interval(value.months, value.days, value.nanoseconds // 1000)
    if isinstance(value, list):
        return [_interval(item) for item in value]
    return value


def changes_from_arrow(table: pa.Table) -> list[dict[str, Any]]:
    """The changes of :func:`changes_to_arrow` rows, one dict each (before and after decoded)."""
    return [{**row, "before": _from_json_or_null(row["before"]), "after": _from_json_or_null(row["after"])}
            for row in table.to_pylist()]


def table_schemas_to_arrow(schemas: Mapping[str, pa.Schema]) -> pa.Table:
    """Tables' names and their Arrow schemas (IPC-serialized), as rows."""
    return pa.table({
        "table_name": pa.array(list(schemas), pa.string()),
        "table_schema": pa.array([s.serialize().to_pybytes() for s in schemas.values()], pa.binary()),
    })


def table_schemas_from_arrow(table: pa.Table) -> dict[str, pa.Schema]:
    """The names and schemas of :func:`table_schemas_to_arrow` rows."""
    names = table.column("table_name").to_pylist()
    return {n: pa.ipc.read_schema(pa.py_buffer(b)) for n, b in zip(names, table.column("table_schema").to_pylist(),
                                                                     strict=True)}


def status_to_arrow(frontier: int, earliest: int) -> pa.Table:
    """The database's frontier and earliest answerable timestamp, as one row."""
    return pa.table({"frontier": pa.array([frontier], pa.int64()), "earliest": pa.array([earliest], pa.int64())})


def status_from_arrow(table: pa.Table) -> tuple[int, int]:
    """(frontier, earliest) of a :func:`status_to_arrow` row."""
    row = table.to_pylist()[0]
    return row["frontier"], row["earliest"]
