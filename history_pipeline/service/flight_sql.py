"""Arrow Flight SQL: the standard's messages, the as-of forms of a statement, and the catalog
answers' Arrow forms. Pure: no I/O, no server state.

Flight SQL requests are protobuf messages of Apache Arrow's ``FlightSql.proto`` (package
``arrow.flight.protocol.sql``) packed in a ``google.protobuf.Any``, carried by a FlightDescriptor's
``cmd``, a Ticket or an Action's body. The messages this server reads or writes are declared
here with the standard's field numbers, so any Flight SQL client (ADBC, JDBC, ODBC) is understood.

A statement runs as of T given, in order of precedence, by a leading ``SET as_of = '<T>';`` of the
statement itself (stripped before it runs), by the connection's ``x-history-as-of`` call header,
or else as of the newest answerable state.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from history_pipeline.service.errors import InvalidRequestError

PACKAGE = "arrow.flight.protocol.sql"
TYPE_URL_PREFIX = "type.googleapis.com/"
#: the call header a connection sets (ADBC: ``adbc.flight.sql.rpc.call_header.x-history-as-of``)
AS_OF_HEADER = "x-history-as-of"
#: the one catalog and schema the tenant's tables live in
CATALOG = "history"
DB_SCHEMA = "main"

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _BYTES, _BOOL, _INT32, _UINT32, _INT64 = (
    _F.TYPE_STRING, _F.TYPE_BYTES, _F.TYPE_BOOL, _F.TYPE_INT32, _F.TYPE_UINT32, _F.TYPE_INT64,
)
_REPEATED, _OPTIONAL = "repeated", "optional"

#: message name -> its fields (name, number, type, label): FlightSql.proto's numbering
_MESSAGES: Mapping[str, tuple[tuple[str, int, int, str], ...]] = {
    "CommandGetSqlInfo": (("info", 1, _UINT32, _REPEATED),),
    "CommandGetXdbcTypeInfo": (("data_type", 1, _INT32, _OPTIONAL),),
    "CommandGetCatalogs": (),
    "CommandGetDbSchemas": (
        ("catalog", 1, _STRING, _OPTIONAL), ("db_schema_filter_pattern", 2, _STRING, _OPTIONAL),
    ),
    "CommandGetTables": (
        ("catalog", 1, _STRING, _OPTIONAL), ("db_schema_filter_pattern", 2, _STRING, _OPTIONAL),
        ("table_name_filter_pattern", 3, _STRING, _OPTIONAL), ("table_types", 4, _STRING, _REPEATED),
        ("include_schema", 5, _BOOL, ""),
    ),
    "CommandGetTableTypes": (),
    "CommandGetPrimaryKeys": (
        ("catalog", 1, _STRING, _OPTIONAL), ("db_schema", 2, _STRING, _OPTIONAL), ("table", 3, _STRING, ""),
    ),
    "CommandGetExportedKeys": (
        ("catalog", 1, _STRING, _OPTIONAL), ("db_schema", 2, _STRING, _OPTIONAL), ("table", 3, _STRING, ""),
    ),
    "CommandGetImportedKeys": (
        ("catalog", 1, _STRING, _OPTIONAL), ("db_schema", 2, _STRING, _OPTIONAL), ("table", 3, _STRING, ""),
    ),
    "CommandStatementQuery": (("query", 1, _STRING, ""), ("transaction_id", 2, _BYTES, _OPTIONAL)),
    "CommandStatementUpdate": (("query", 1, _STRING, ""), ("transaction_id", 2, _BYTES, _OPTIONAL)),
    "TicketStatementQuery": (("statement_handle", 1, _BYTES, ""),),
    "CommandPreparedStatementQuery": (("prepared_statement_handle", 1, _BYTES, ""),),
    "CommandPreparedStatementUpdate": (("prepared_statement_handle", 1, _BYTES, ""),),
    "ActionCreatePreparedStatementRequest": (("query", 1, _STRING, ""), ("transaction_id", 2, _BYTES, _OPTIONAL)),
    "ActionCreatePreparedStatementResult": (
        ("prepared_statement_handle", 1, _BYTES, ""), ("dataset_schema", 2, _BYTES, ""),
        ("parameter_schema", 3, _BYTES, ""),
    ),
    "ActionClosePreparedStatementRequest": (("prepared_statement_handle", 1, _BYTES, ""),),
    "DoPutUpdateResult": (("record_count", 1, _INT64, ""),),
    "DoPutPreparedStatementResult": (("prepared_statement_handle", 1, _BYTES, _OPTIONAL),),
}


def _build_messages() -> dict[str, type[Message]]:
    """The message classes, from a file descriptor declared in code (no generated module)."""
    proto = descriptor_pb2.FileDescriptorProto(name="history_pipeline_flight_sql.proto", package=PACKAGE,
                                               syntax="proto3")
    for name, message_fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field_name, number, kind, label in message_fields:
            field = message.field.add(name=field_name, number=number, type=kind)
            field.label = _F.LABEL_REPEATED if label == _REPEATED else _F.LABEL_OPTIONAL
            if label == _OPTIONAL:  # proto3 `optional`: a synthetic oneof of its own
                field.proto3_optional = True
                field.oneof_index = len(message.oneof_decl)
                message.oneof_decl.add(name=f"_{field_name}")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in _MESSAGES
    }


MESSAGES: Mapping[str, type[Message]] = _build_messages()


def message(name: str, **values: Any) -> Message:
    """A Flight SQL message by its name in FlightSql.proto."""
    return MESSAGES[name](**values)


def pack(msg: Message) -> bytes:
    """A message packed in a ``google.protobuf.Any``, serialized (a descriptor's cmd, a ticket)."""
    wrapper = any_pb2.Any(type_url=TYPE_URL_PREFIX + msg.DESCRIPTOR.full_name, value=msg.SerializeToString())
    return wrapper.SerializeToString()


def unpack(data: bytes) -> Message | None:
    """The Flight SQL message packed in ``data``; None when ``data`` is not a Flight SQL Any
    (the service's own JSON tickets are not); InvalidRequestError for one this server does not know."""
    if not data or data[:1] != b"\x0a":  # an Any starts with its type_url (field 1, length-delimited)
        return None
    wrapper = any_pb2.Any()
    try:
        wrapper.ParseFromString(data)
    except DecodeError:
        return None
    prefix = TYPE_URL_PREFIX + PACKAGE + "."
    if not wrapper.type_url.startswith(prefix):
        return None
    name = wrapper.type_url[len(prefix):]
    cls = MESSAGES.get(name)
    if cls is None:
        raise InvalidRequestError(f"the Flight SQL command {name} is not offered by this server")
    msg = cls()
    try:
        msg.ParseFromString(wrapper.value)
    except DecodeError as exc:
        raise InvalidRequestError(f"a malformed Flight SQL {name}: {exc}") from None
    return msg


def name_of(msg: Message) -> str:
    """The message's name in FlightSql.proto."""
    return msg.DESCRIPTOR.name


# --- as of ------------------------------------------------------------------------------------

_SET_AS_OF = re.compile(
    r"^\s*SET\s+as_of\s*(?:=|TO)\s*(?:'(?P<quoted>[^']*)'|(?P<bare>[0-9A-Fa-f/]+))\s*;(?P<rest>.*)$",
    re.IGNORECASE | re.DOTALL,
)
_SET_ONLY = re.compile(r"^\s*SET\s+as_of\b", re.IGNORECASE)


@dataclass(frozen=True)
class Statement:
    """A statement as it will run: its SQL and the as-of it names (None: the connection's, else the newest)."""

    query: str
    as_of: str | None


def split_as_of(sql: str) -> Statement:
    """A statement with its leading ``SET as_of = '<T>';`` taken off (T: an integer or an X/Y LSN)."""
    match = _SET_AS_OF.match(sql)
    if match is None:
        if _SET_ONLY.match(sql):
            raise InvalidRequestError(
                "SET as_of applies to the statement it precedes: send "
                "\"SET as_of = '<timestamp or X/Y LSN>'; SELECT ...\" as one statement, or set the "
                f"connection's {AS_OF_HEADER} call header"
            )
        return Statement(sql, None)
    value = match.group("quoted") if match.group("quoted") is not None else match.group("bare")
    rest = match.group("rest")
    if not rest.strip():
        raise InvalidRequestError(f"SET as_of = '{value}'; must be followed by the statement to run as of it")
    return Statement(rest, value.strip())


# --- catalog answers ------------------------------------------------------------------------

CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8(), nullable=False)])
DB_SCHEMAS_SCHEMA = pa.schema([
    pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8(), nullable=False),
])
TABLES_SCHEMA = pa.schema([
    pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8()),
    pa.field("table_name", pa.utf8(), nullable=False), pa.field("table_type", pa.utf8(), nullable=False),
])
TABLES_WITH_SCHEMA_SCHEMA = TABLES_SCHEMA.append(pa.field("table_schema", pa.binary(), nullable=False))
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", pa.utf8(), nullable=False)])
PRIMARY_KEYS_SCHEMA = pa.schema([
    pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8()),
    pa.field("table_name", pa.utf8(), nullable=False), pa.field("column_name", pa.utf8(), nullable=False),
    pa.field("key_sequence", pa.int32(), nullable=False), pa.field("key_name", pa.utf8()),
])
TABLE_TYPE = "TABLE"
#: the synthetic key every table is keyed by
KEY_COLUMN = "synthetic_key"


def like_matches(pattern: str | None, value: str) -> bool:
    """Whether ``value`` matches a Flight SQL filter pattern (SQL LIKE: ``%`` any, ``_`` one)."""
    if pattern is None:
        return True
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.DOTALL) is not None


def catalogs_table() -> pa.Table:
    """GetCatalogs: the one catalog."""
    return pa.table({"catalog_name": [CATALOG]}, schema=CATALOGS_SCHEMA)


def db_schemas_table(catalog: str | None, pattern: str | None) -> pa.Table:
    """GetDbSchemas: the one schema, when the filters admit it."""
    keep = (catalog is None or catalog == CATALOG) and like_matches(pattern, DB_SCHEMA)
    rows = [CATALOG] if keep else []
    return pa.table({"catalog_name": rows, "db_schema_name": [DB_SCHEMA] * len(rows)}, schema=DB_SCHEMAS_SCHEMA)


def tables_table(command: Message, schemas: Mapping[str, pa.Schema]) -> pa.Table:
    """GetTables over the tables (name -> Arrow schema as a query returns them) as of T."""
    admitted = (
        (not command.HasField("catalog") or command.catalog == CATALOG)
        and like_matches(command.db_schema_filter_pattern if command.HasField("db_schema_filter_pattern") else None,
                         DB_SCHEMA)
        and (not command.table_types or TABLE_TYPE in command.table_types)
    )
    pattern = command.table_name_filter_pattern if command.HasField("table_name_filter_pattern") else None
    names = sorted(n for n in schemas if admitted and like_matches(pattern, n))
    columns: dict[str, list[Any]] = {
        "catalog_name": [CATALOG] * len(names), "db_schema_name": [DB_SCHEMA] * len(names),
        "table_name": names, "table_type": [TABLE_TYPE] * len(names),
    }
    if command.include_schema:
        columns["table_schema"] = [schemas[n].serialize().to_pybytes() for n in names]
        return pa.table(columns, schema=TABLES_WITH_SCHEMA_SCHEMA)
    return pa.table(columns, schema=TABLES_SCHEMA)


def table_types_table() -> pa.Table:
    """GetTableTypes: tables only."""
    return pa.table({"table_type": [TABLE_TYPE]}, schema=TABLE_TYPES_SCHEMA)


def primary_keys_table(command: Message, tables: set[str]) -> pa.Table:
    """GetPrimaryKeys: the synthetic key of the named table (none when it does not exist as of T)."""
    admitted = (
        (not command.HasField("catalog") or command.catalog == CATALOG)
        and (not command.HasField("db_schema") or command.db_schema == DB_SCHEMA)
        and command.table in tables
    )
    n = 1 if admitted else 0
    return pa.table({
        "catalog_name": [CATALOG] * n, "db_schema_name": [DB_SCHEMA] * n, "table_name": [command.table] * n,
        "column_name": [KEY_COLUMN] * n, "key_sequence": [1] * n, "key_name": [None] * n,
    }, schema=PRIMARY_KEYS_SCHEMA)


# --- GetSqlInfo -------------------------------------------------------------------------------

_INFO_VALUE = pa.dense_union([
    pa.field("string_value", pa.utf8()), pa.field("bool_value", pa.bool_()),
    pa.field("bigint_value", pa.int64()), pa.field("int32_bitmask", pa.int32()),
    pa.field("string_list", pa.list_(pa.field("item", pa.utf8()))),
    pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.field("item", pa.int32())))),
])
SQL_INFO_SCHEMA = pa.schema([
    pa.field("info_name", pa.uint32(), nullable=False), pa.field("value", _INFO_VALUE, nullable=False),
])
#: SqlInfo ids of FlightSql.proto -> the value this server gives (str: string_value, bool: bool_value)
SQL_INFO: Mapping[int, str | bool] = {
    0: "history_pipeline",         # FLIGHT_SQL_SERVER_NAME
    1: "0.1.0",                    # FLIGHT_SQL_SERVER_VERSION
    2: pa.__version__,             # FLIGHT_SQL_SERVER_ARROW_VERSION
    3: True,                       # FLIGHT_SQL_SERVER_READ_ONLY
    4: True,                       # FLIGHT_SQL_SERVER_SQL
    5: False,                      # FLIGHT_SQL_SERVER_SUBSTRAIT
    504: '"',                      # SQL_IDENTIFIER_QUOTE_CHAR
}


def sql_info_table(ids: list[int]) -> pa.Table:
    """GetSqlInfo: the infos asked for that this server knows (every one when none is named)."""
    wanted = [i for i in (ids or sorted(SQL_INFO)) if i in SQL_INFO]
    strings = [i for i in wanted if isinstance(SQL_INFO[i], str)]
    bools = [i for i in wanted if isinstance(SQL_INFO[i], bool)]
    codes = pa.array([0 if i in strings else 1 for i in wanted], pa.int8())
    offsets = pa.array([strings.index(i) if i in strings else bools.index(i) for i in wanted], pa.int32())
    children = [
        pa.array([SQL_INFO[i] for i in strings], pa.utf8()), pa.array([SQL_INFO[i] for i in bools], pa.bool_()),
        pa.array([], pa.int64()), pa.array([], pa.int32()), pa.array([], _INFO_VALUE.field(4).type),
        pa.array([], _INFO_VALUE.field(5).type),
    ]
    value = pa.UnionArray.from_dense(codes, offsets, children, [f.name for f in _INFO_VALUE])
    return pa.Table.from_arrays([pa.array(wanted, pa.uint32()), value], schema=SQL_INFO_SCHEMA)


# --- GetXdbcTypeInfo --------------------------------------------------------------------------

XDBC_TYPE_INFO_SCHEMA = pa.schema([
    pa.field("type_name", pa.utf8(), nullable=False), pa.field("data_type", pa.int32(), nullable=False),
    pa.field("column_size", pa.int32()), pa.field("literal_prefix", pa.utf8()),
    pa.field("literal_suffix", pa.utf8()),
    pa.field("create_params", pa.list_(pa.field("item", pa.utf8(), nullable=False))),
    pa.field("nullable", pa.int32(), nullable=False), pa.field("case_sensitive", pa.bool_(), nullable=False),
    pa.field("searchable", pa.int32(), nullable=False), pa.field("unsigned_attribute", pa.bool_()),
    pa.field("fixed_prec_scale", pa.bool_(), nullable=False), pa.field("auto_increment", pa.bool_()),
    pa.field("local_type_name", pa.utf8()), pa.field("minimum_scale", pa.int32()),
    pa.field("maximum_scale", pa.int32()), pa.field("sql_data_type", pa.int32(), nullable=False),
    pa.field("datetime_subcode", pa.int32()), pa.field("num_prec_radix", pa.int32()),
    pa.field("interval_precision", pa.int32()),
])
#: the column types of the store (PostgreSQL's names) with their XDBC codes (FlightSql.proto's
#: XdbcDataType; dates and times: sql_data_type 9 with their subcode) and literal quotes
_XDBC_TYPES: tuple[tuple[str, int, int, int | None, str | None, bool], ...] = (
    # (type_name, data_type, sql_data_type, datetime_subcode, literal quote, fixed_prec_scale)
    ("boolean", -7, -7, None, None, False),
    ("bigint", -5, -5, None, None, False),
    ("bytea", -3, -3, None, "'", False),
    ("character", 1, 1, None, "'", False),
    ("numeric", 2, 2, None, None, True),
    ("integer", 4, 4, None, None, False),
    ("smallint", 5, 5, None, None, False),
    ("real", 7, 7, None, None, False),
    ("double precision", 8, 8, None, None, False),
    ("interval", 10, 10, None, "'", False),
    ("character varying", 12, 12, None, "'", False),
    ("jsonb", 12, 12, None, "'", False),
    ("text", 12, 12, None, "'", False),
    ("uuid", 12, 12, None, "'", False),
    ("date", 91, 9, 1, "'", False),
    ("time", 92, 9, 2, "'", False),
    ("timestamp", 93, 9, 3, "'", False),
    ("timestamp with time zone", 93, 9, 3, "'", False),
)
_CREATE_PARAMS = {"numeric": ["precision", "scale"], "character": ["length"], "character varying": ["length"]}


def xdbc_type_info_table(data_type: int | None) -> pa.Table:
    """GetXdbcTypeInfo: the store's column types (those of ``data_type`` only, when given)."""
    rows = [r for r in _XDBC_TYPES if data_type is None or r[1] == data_type]
    text = {"character", "character varying", "text", "jsonb"}
    columns = {
        "type_name": [r[0] for r in rows], "data_type": [r[1] for r in rows],
        "column_size": [38 if r[0] == "numeric" else None for r in rows],
        "literal_prefix": [r[4] for r in rows], "literal_suffix": [r[4] for r in rows],
        "create_params": [_CREATE_PARAMS.get(r[0]) for r in rows],
        "nullable": [1] * len(rows),  # NULLABILITY_NULLABLE
        "case_sensitive": [r[0] in text for r in rows],
        "searchable": [3] * len(rows),  # SEARCHABLE_FULL
        "unsigned_attribute": [False if r[1] in (-5, 2, 4, 5, 7, 8) else None for r in rows],
        "fixed_prec_scale": [r[5] for r in rows], "auto_increment": [False] * len(rows),
        "local_type_name": [r[0] for r in rows],
        "minimum_scale": [0 if r[0] == "numeric" else None for r in rows],
        "maximum_scale": [38 if r[0] == "numeric" else None for r in rows],
        "sql_data_type": [r[2] for r in rows], "datetime_subcode": [r[3] for r in rows],
        "num_prec_radix": [10 if r[0] == "numeric" else None for r in rows],
        "interval_precision": [None] * len(rows),
    }
    return pa.table(columns, schema=XDBC_TYPE_INFO_SCHEMA)


# --- prepared statements and their parameters -----------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """A prepared statement as its handle carries it: the SQL and its bound parameters (one row, as
    an Arrow IPC stream), so that the server holds nothing for it."""

    query: str
    parameters: bytes | None = None

    def handle(self) -> bytes:
        """The handle a client keeps and sends back."""
        body = {"query": self.query, "parameters": None if self.parameters is None
                else base64.b64encode(self.parameters).decode("ascii")}
        return json.dumps(body).encode("utf-8")

    @staticmethod
    def of(handle: bytes) -> Prepared:
        """The prepared statement a handle names (InvalidRequestError for one this server did not make)."""
        try:
            body = json.loads(handle)
            parameters = body["parameters"]
            return Prepared(str(body["query"]), None if parameters is None else base64.b64decode(parameters))
        except (ValueError, KeyError, TypeError):
            raise InvalidRequestError("a prepared statement handle this server did not make") from None

    def bound_query(self) -> str:
        """The SQL with each placeholder (``?`` in order, or ``$n``) replaced by its parameter's literal."""
        if self.parameters is None:
            return self.query
        table = pa.ipc.open_stream(self.parameters).read_all()
        if table.num_rows != 1:
            raise InvalidRequestError(
                f"a prepared statement runs with one row of parameters, got {table.num_rows}"
            )
        literals = [sql_literal(column[0], field) for column, field in zip(table.columns, table.schema, strict=True)]
        return bind_placeholders(self.query, literals)


_DUCKDB_INTS = {
    pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER", pa.int64(): "BIGINT",
    pa.uint8(): "UTINYINT", pa.uint16(): "USMALLINT", pa.uint32(): "UINTEGER", pa.uint64(): "UBIGINT",
}


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def sql_literal(value: pa.Scalar, field: pa.Field) -> str:
    """A parameter as a SQL literal of its exact type (InvalidRequestError for a type not bindable)."""
    kind = value.type
    if not value.is_valid:
        return "NULL"
    python = value.as_py()
    if pa.types.is_boolean(kind):
        return "TRUE" if python else "FALSE"
    if kind in _DUCKDB_INTS:
        return f"CAST({int(python)} AS {_DUCKDB_INTS[kind]})"
    if pa.types.is_floating(kind):
        return f"CAST({_quote(repr(float(python)))} AS {'FLOAT' if kind == pa.float32() else 'DOUBLE'})"
    if pa.types.is_decimal(kind):
        return f"CAST({_quote(str(python))} AS DECIMAL({kind.precision}, {kind.scale}))"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return _quote(python)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return "'" + "".join(f"\\x{b:02X}" for b in python) + "'::BLOB"
    if pa.types.is_date32(kind) or pa.types.is_date64(kind):
        return f"DATE {_quote(python.isoformat())}"
    if pa.types.is_time(kind):
        return f"TIME {_quote(python.isoformat())}"
    if pa.types.is_timestamp(kind):
        if kind.tz is None:
            return f"TIMESTAMP {_quote(python.isoformat())}"
        return f"TIMESTAMPTZ {_quote(python.isoformat())}"
    raise InvalidRequestError(f"parameter {field.name!r} has the type {kind}, which cannot be bound here")


_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/|\$(\d+)|\?", re.DOTALL)


def bind_placeholders(query: str, literals: list[str]) -> str:
    """``query`` with ``?`` (in order) or ``$n`` placeholders replaced; quoted text and comments are
    left alone. Refuses a count of placeholders that differs from the parameters'."""
    used: set[int] = set()
    position = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal position
        token = match.group(0)
        if token == "?":
            position += 1
            index = position
        elif match.group(1) is not None:
            index = int(match.group(1))
        else:
            return token  # a string, a quoted name or a comment
        if not 1 <= index <= len(literals):
            raise InvalidRequestError(f"placeholder {token} has no parameter: {len(literals)} given")
        used.add(index)
        return literals[index - 1]

    bound = _TOKEN.sub(replace, query)
    if len(used) != len(literals):
        raise InvalidRequestError(f"{len(literals)} parameters given for {len(used)} placeholders")
    return bound
