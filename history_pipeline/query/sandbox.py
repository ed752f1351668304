"""The read-only DuckDB sandboxes queries run in, reused across queries.

A new DuckDB database costs 50-100 ms, more than a small query. So one sandboxed
database is kept per catalog state (root, database, transaction): its only readable
files are that state's live files (``allowed_paths``, set before external access goes
off), its configuration is locked, and it holds nothing but the empty
``_history_catalog`` schema. Each query takes a cursor of it (microseconds) and
creates its views there as TEMP objects, which vanish with the cursor; queries are
SELECT only, so no query can leave anything behind for the next.

Parsing (syntax checks, naming the tables a query reads) uses one more sandbox with no
readable file at all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

#: the sandboxes kept (the newest states of the stores a process reads)
KEPT = 4

_SCHEMA_HISTORY_SCHEMA = pa.schema([
    pa.field("table_uuid", pa.string()),
    pa.field("table_name", pa.string()),
    pa.field("logical_timestamp", pa.int64()),
    pa.field("schema_descriptor", pa.json_()),
])

_lock = threading.Lock()
_sandboxes: OrderedDict[tuple[str, ...], duckdb.DuckDBPyConnection] = OrderedDict()
_parser: list[duckdb.DuckDBPyConnection] = []


def _sql_list(items: Sequence[str]) -> str:
    return "[" + ", ".join("'" + item.replace("'", "''") + "'" for item in items) + "]"


def _new_sandbox(allowed_paths: Sequence[str] | None) -> duckdb.DuckDBPyConnection:
    database = duckdb.connect(":memory:")
    # PostgreSQL's semantics where DuckDB differs by default: integer / integer is integer,
    # and NULLs sort last ascending but first descending
    database.execute("SET GLOBAL integer_division = true")
    database.execute("SET GLOBAL default_null_order = 'nulls_last_on_asc_first_on_desc'")
    # every query's own schema-history rows are registered on its cursor under this name
    database.execute("CREATE SCHEMA _history_catalog")
    database.register("__schema_history", _SCHEMA_HISTORY_SCHEMA.empty_table())
    database.execute("CREATE VIEW _history_catalog.schema_history AS SELECT * FROM __schema_history")
    database.unregister("__schema_history")
    if allowed_paths:
        database.execute("SET allowed_paths = " + _sql_list(sorted(allowed_paths)))
    database.execute("SET enable_external_access = false")
    database.execute("SET lock_configuration = true")
    return database


def query_cursor(key: tuple[str, ...], allowed_paths: Sequence[str] | None) -> duckdb.DuckDBPyConnection:
    """A cursor of the sandbox of catalog state ``key`` (made on first use, reading only ``allowed_paths``)."""
    with _lock:
        database = _sandboxes.get(key)
        if database is None:
            database = _new_sandbox(allowed_paths)
            _sandboxes[key] = database
            while len(_sandboxes) > KEPT:
                _sandboxes.popitem(last=False)  # its open cursors keep it alive until they close
        else:
            _sandboxes.move_to_end(key)
        return database.cursor()


def parser_cursor() -> Any:
    """A cursor on one process-wide sandbox that reads no file: for parsing and naming tables only."""
    with _lock:
        if not _parser:
            _parser.append(_new_sandbox(None))
        return _parser[0].cursor()


def register_schema_history(cursor: duckdb.DuckDBPyConnection, rows: pa.Table) -> None:
    """Give ``_history_catalog.schema_history`` this query's rows (the schema changes before T)."""
    cursor.register("__schema_history", rows.cast(_SCHEMA_HISTORY_SCHEMA))
