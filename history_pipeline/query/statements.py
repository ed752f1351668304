"""The SQL statements users of DuckDB and Delta expect besides SELECT, answered as of ``T``.

* ``SHOW TABLES``: the tables in force at ``T`` (name, uuid, column count);
* ``DESCRIBE <table>`` (or ``DESC``, ``SHOW <table>``): its columns at ``T`` as a user knows them;
  ``DESCRIBE EXTENDED <table>`` (as in Spark and Delta) adds each column's ordinal key, uuid and
  supercolumn;
* ``EXPLAIN [ANALYZE] <select>``: DuckDB's plan of the query over the tables as of ``T``, in a
  sandbox as read-only as the one queries run in.

Everything else goes to the query engine. Errors come back one line each: a syntax error says
where, and a missing table never suggests DuckDB's internal tables (``pg_class`` ...) but the
tables that exist at ``T``.
"""

from __future__ import annotations

import difflib
import functools
import re
from typing import Any

import duckdb
import pyarrow as pa

from history_pipeline.errors import QueryError, SandboxViolationError, TableNotFoundError
from history_pipeline.query.sandbox import parser_cursor

_SHOW_TABLES = re.compile(r"^\s*SHOW\s+(?:ALL\s+)?TABLES\s*;?\s*$", re.IGNORECASE)
_DESCRIBE = re.compile(
    r'^\s*(?:DESCRIBE|DESC|SHOW)\s+(?:TABLE\s+)?(EXTENDED\s+)?("(?:[^"]|"")+"|[A-Za-z_][\w$]*)\s*;?\s*$',
    re.IGNORECASE,
)
_EXPLAIN = re.compile(r"^\s*EXPLAIN\s+(ANALYZE\s+)?(.+?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_MISSING = re.compile(r"Table with name (\S+) does not exist", re.IGNORECASE)
_SUGGESTION = re.compile(r'\s*Did you mean "[^"]*"\?', re.IGNORECASE)


def run_sql(context: Any, query: str, as_of: int) -> pa.Table:
    """Answer ``query`` as of ``as_of`` over a :class:`~history_pipeline.query.engine.QueryContext`."""
    if not isinstance(query, str):
        raise QueryError(f"SQL must be a string, got {type(query).__name__}")
    described = _DESCRIBE.match(query)  # before DuckDB's parser, which has no DESCRIBE EXTENDED
    if not described:
        check_syntax(query)
    if _SHOW_TABLES.match(query):
        return show_tables(context, as_of)
    if described:
        name = _unquote(described.group(2))
        if name.lower() != "tables":
            return describe(context, name, as_of, extended=bool(described.group(1)))
    explained = _EXPLAIN.match(query)
    if explained:
        return explain(context, explained.group(2), as_of, analyze=bool(explained.group(1)))
    try:
        return context.sql(query, as_of)
    except TableNotFoundError as exc:
        raise missing_table_error(context, exc, as_of) from None


@functools.lru_cache(maxsize=256)  # only queries that parse are kept: an error is raised, not cached
def check_syntax(query: str) -> None:
    """A :class:`QueryError` naming where DuckDB's parser stopped (one line), if it stops."""
    con = parser_cursor()
    try:
        if not con.extract_statements(query):
            raise SandboxViolationError("empty SQL: give a SELECT, SHOW TABLES, DESCRIBE <table> or EXPLAIN <select>")
    except duckdb.ParserException as exc:
        text = str(exc).removeprefix("Parser Error: ")
        where = re.search(r"LINE (\d+):", text)
        text = _one_line(text.split("LINE ")[0]) + (f" (line {where.group(1)})" if where else "")
        raise QueryError(f"SQL syntax error: {text}") from None
    finally:
        con.close()


def show_tables(context: Any, as_of: int) -> pa.Table:
    """The tables in force at ``as_of``, by name."""
    tables = sorted(context.get_catalog(as_of), key=lambda d: d.table_name)
    return pa.table(
        {
            "name": pa.array([d.table_name for d in tables], pa.string()),
            "table_uuid": pa.array([d.table_uuid for d in tables], pa.string()),
            "columns": pa.array([len(d.columns) for d in tables], pa.int64()),
        }
    )


def describe(context: Any, table: str, as_of: int, extended: bool = False) -> pa.Table:
    """The columns of ``table`` at ``as_of`` in order: name, type, nullability, default; ``extended``
    adds their identity (ordinal key, column uuid, supercolumn)."""
    context.check_as_of(as_of)
    descriptor = context.resolve(table, as_of)
    columns = descriptor.columns
    described = {
        "column_name": pa.array([c.column_name for c in columns], pa.string()),
        "column_type": pa.array([str(c.data_type) for c in columns], pa.string()),
        "null": pa.array(["YES" if c.is_nullable else "NO" for c in columns], pa.string()),
        "default": pa.array([None if c.default is None else str(c.default) for c in columns], pa.string()),
    }
    if extended:
        described |= {
            "ordinal_key": pa.array([c.ordinal_key for c in columns], pa.string()),
            "column_uuid": pa.array([c.column_uuid for c in columns], pa.string()),
            "supercolumn": pa.array([c.supercolumn for c in columns], pa.string()),
        }
    return pa.table(described)


def explain(context: Any, select: str, as_of: int, analyze: bool = False) -> pa.Table:
    """DuckDB's plan of a SELECT over the tables as of ``as_of`` (read-only sandbox)."""
    context.check_as_of(as_of)
    con = duckdb.connect(":memory:")
    try:
        statements = con.extract_statements(select)
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            raise SandboxViolationError("EXPLAIN takes one SELECT query")
        referenced = _referenced(select)
        tables = context.get_catalog(as_of)
        for index, descriptor in enumerate(tables):
            if referenced is not None and descriptor.table_name.lower() not in referenced:
                continue
            raw = f"__explain_{index}"
            con.register(raw, context.load_table(descriptor.table_name, as_of))
            con.execute(f"CREATE VIEW {_ident(descriptor.table_name)} AS SELECT * FROM {raw}")
        con.execute("CREATE SCHEMA _history_catalog")
        con.register("__explain_schema_history", _schema_history(context, as_of))
        con.execute("CREATE VIEW _history_catalog.schema_history AS SELECT * FROM __explain_schema_history")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        try:
            rows = con.sql(f"EXPLAIN {'ANALYZE ' if analyze else ''}{select}").fetchall()
        except duckdb.PermissionException as exc:
            raise SandboxViolationError(f"refused by the read-only sandbox: {_one_line(str(exc))}") from None
        except duckdb.CatalogException as exc:
            raise missing_table_error(context, TableNotFoundError(str(exc)), as_of) from None
        except duckdb.Error as exc:
            raise QueryError(f"EXPLAIN failed as of {as_of}: {_one_line(str(exc))}") from None
    finally:
        con.close()
    return pa.table(
        {
            "explain_key": pa.array([str(r[0]) for r in rows], pa.string()),
            "explain_value": pa.array([str(r[1]) for r in rows], pa.string()),
        }
    )


def missing_table_error(context: Any, exc: TableNotFoundError, as_of: int) -> TableNotFoundError:
    """The engine's missing-table error in one line, suggesting only tables that exist at ``as_of``."""
    names = sorted(d.table_name for d in context.get_catalog(as_of))
    text = _one_line(_SUGGESTION.sub("", str(exc)))
    missing = _MISSING.search(text)
    if missing:
        wanted = missing.group(1).strip('"')
        close = difflib.get_close_matches(wanted, names, n=1)
        hint = f'; did you mean "{close[0]}"?' if close else ""
        text = (
            f"no table {wanted!r} as of {as_of}; tables then: {', '.join(names) or 'none'}"
            f" (and _history_catalog.schema_history){hint}"
        )
    return TableNotFoundError(text)


def _schema_history(context: Any, as_of: int) -> pa.Table:
    """``_history_catalog.schema_history`` as of ``as_of`` (its columns, for planning)."""
    entries = [e for e in context.state.schema_history if e.logical_timestamp < as_of]
    return pa.table(
        {
            "table_uuid": pa.array([e.table_uuid for e in entries], pa.string()),
            "table_name": pa.array([e.table_name for e in entries], pa.string()),
            "logical_timestamp": pa.array([e.logical_timestamp for e in entries], pa.int64()),
            "schema_descriptor": pa.array([e.descriptor_text() for e in entries], pa.string()),
        }
    )


def _referenced(select: str) -> set[str] | None:
    """Lower-cased table names a query names, or None when DuckDB cannot tell."""
    con = parser_cursor()  # reads no file; a new database per call would cost 15-50 ms
    try:
        return {n.lower() for n in con.get_table_names(select)}
    except duckdb.Error:
        return None
    finally:
        con.close()


def _unquote(name: str) -> str:
    return name[1:-1].replace('""', '"') if name.startswith('"') else name


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _one_line(text: str) -> str:
    return " ".join(text.split())
