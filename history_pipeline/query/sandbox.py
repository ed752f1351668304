"""The read-only DuckDB sandboxes queries run in, reused across queries.

A new DuckDB database costs 50-100 ms, more than a small query. So one sandboxed
database is kept per catalog state (root, database, transaction): its only readable
files are that state's live files (``allowed_paths``, set before external access goes
off), its configuration is locked, and it holds the empty ``_history_catalog`` schema
plus the views of its tables as of each T asked so far: schema ``__hp_asof_<T>``, one
view per table, made on first use by the engine (binding a view over Parquet files
costs milliseconds, so it is bound once per (state, T, table), not per query). Each
query takes a cursor (microseconds), ``USE``s the schema of its T, and creates its
schema-history rows, datasets and macros as TEMP objects, which vanish with the cursor;
queries are SELECT only, so no query can leave anything behind for the next.

Parsing (syntax checks, naming the tables a query reads) uses one more sandbox with no
readable file at all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from history_pipeline.query.scan import AS_OF_VARIABLE, CHANGES_TOKEN

#: the sandboxes kept (the newest states of the stores a process reads)
KEPT = 4
#: the most bytes one sandbox keeps as tables, over every T: each key's newest change since a
#: snapshot (16 bytes a key), a small tail's newest rows (their files' uncompressed bytes), the
#: live rows of tables asked at one T twice (``kept_table_bytes``) and the rows of each set of files
#: read (``LiveSql.interval``); past it, what the least recent queries read is dropped first
KEPT_BYTES = 512_000_000
#: the ask for a set of files' rows (``LiveSql.interval``) from which they are kept
KEEP_ROWS_FROM = 2
#: the most T one sandbox remembers a shared schema served (past it they are forgotten: a second
#: query at such a T then reads the shared schema again, its answer the same)
KEPT_SHARED_AT = 4096
#: the most as-of schemas one sandbox holds; past it the state gets a fresh sandbox (a service asked
#: at ever new T would otherwise grow one schema of views per T for the state's lifetime)
KEPT_AS_OF = 256

_SCHEMA_HISTORY_SCHEMA = pa.schema([
    pa.field("table_uuid", pa.string()),
    pa.field("table_name", pa.string()),
    pa.field("logical_timestamp", pa.int64()),
    pa.field("schema_descriptor", pa.json_()),
])

_lock = threading.Lock()


#: idle cursors kept per as-of schema of a sandbox, for the next queries of that T
IDLE_CURSORS = 4
#: where ``SandboxViews.idle`` keeps the cursors of a forgotten T, for a query at any T
_SPARE = ""


class PooledCursor:
    """A cursor of a sandbox and what was set up on it (``USE`` of its schema, registrations,
    macros: the same for every query of its (state, T)), so that the next query skips them."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.done: set[str] = set()
        #: the TEMP macros made on it: they depend on the state and query only, so they serve every T
        self.macros: set[str] = set()
        #: the datasets registered on it (object-store reads): named per T, dropped when it serves another
        self.registered: list[str] = []
        self.poolable = True
        #: the T in its ``AS_OF_VARIABLE`` (None: never set), which outlives a move to another schema
        self.as_of: int | None = None
        #: how many times the schema it was taken for had been dropped then (``SandboxViews.drops``):
        #: dropped again while it ran, what it set up for it is gone and it is given back set up anew
        self.drops = 0


class SandboxViews:
    """The views made once in one sandbox and kept for its lifetime: one schema per T
    (``AS_OF_SCHEMA``), one view per table there (created on first use, from any cursor)."""

    def __init__(self) -> None:
        # reentrant: a sql_reader dropped unread gives its cursor back when it is collected, which
        # may happen in this thread while it holds the lock
        self.lock = threading.RLock()
        self.created: set[tuple[str, str]] = set()
        self.schemas: set[str] = set()
        self.kept_bytes = 0
        #: the part of ``kept_bytes`` each as-of schema's tables take (freed when it is forgotten)
        self.schema_bytes: dict[str, int] = {}
        self.idle: dict[str, list[PooledCursor]] = {}
        #: views whose live rows are kept as a table when next named (``live_bytes``): their bound
        self.deferred: dict[tuple[str, str], int] = {}
        #: tables of an open read's rows with their next t (``LiveSql.interval``), kept for every T
        #: reading the same files: by name, the qualified table and its bytes; how many T asked for each
        self.intervals: dict[str, tuple[str, int]] = {}
        self.interval_asks: dict[str, int] = {}
        #: the as-of schemas whose T a shared schema served (``ensure_shared``): a second query at
        #: such a T makes its own schema and keeps its live rows at once, as a T's second query does
        self.shared_at: set[str] = set()
        #: the schemas (as-of and shared) and kept ``intervals`` by how recently a query read them,
        #: least recent first: past ``KEPT_BYTES``, the least recent's kept tables are dropped first
        self.recent: OrderedDict[str, None] = OrderedDict()
        #: the kept ``intervals`` each schema's views read (dropping one drops those schemas too)
        self.reads: dict[str, set[str]] = {}
        #: how many times each schema was dropped (``PooledCursor.drops``)
        self.drops: dict[str, int] = {}
        #: how many queries hold a cursor taken for each schema (``take`` to ``give_back``): what
        #: they read is never dropped to make room
        self.using: dict[str, int] = {}

    def take(self, schema: str, fresh: duckdb.DuckDBPyConnection) -> PooledCursor:
        """An idle cursor that a finished query of ``schema`` gave back (already ``USE``-ing it); else
        one of another T, set up anew for ``schema`` but for its macros (``macros``); else ``fresh``
        (closed when not used). Marks ``schema`` and the kept rows it reads as the most recent, and in
        use until the cursor is given back."""
        with self.lock:
            self.using[schema] = self.using.get(schema, 0) + 1
            for name in (schema, *self.reads.get(schema, ())):
                self.recent[name] = None
                self.recent.move_to_end(name)
            drops = self.drops.get(schema, 0)
            idle = self.idle.get(schema)
            pooled = idle.pop() if idle else None
            other = None if pooled else next((cursors for cursors in self.idle.values() if cursors), None)
            if other is not None:
                pooled = other.pop()
        if pooled is None:
            pooled = PooledCursor(fresh)
        else:
            fresh.close()
            if other is not None:
                _reset(pooled)
        pooled.drops = drops
        return pooled

    def give_back(self, schema: str, cursor: PooledCursor, keep: bool = True) -> None:
        """A query taken for ``schema`` is done: with ``keep``, its cursor is kept for the next query
        of ``schema`` (at most ``IDLE_CURSORS``); else closed."""
        with self.lock:
            left = self.using.pop(schema, 1) - 1
            if left:
                self.using[schema] = left
            if keep:
                if cursor.drops != self.drops.get(schema, 0):
                    # its schema was dropped while it ran (forgotten): set up for none, it serves any T
                    schema = _SPARE
                    cursor.con.execute("USE memory.main")
                    _reset(cursor)
                idle = self.idle.setdefault(schema, [])
                if len(idle) < IDLE_CURSORS:
                    idle.append(cursor)
                    return
        cursor.con.close()

    def ensure(self, cursor: duckdb.DuckDBPyConnection, schema: str, name: str | None, sql: str = "",
               changes: tuple[str, int, str] | None = None, live_bytes: int = 0,
               interval: tuple[str, str, str, int] | None = None) -> None:
        """Create ``schema`` and view ``schema.name AS sql`` through ``cursor`` unless made before.

        ``changes`` (SELECT of what to keep: (key, newest t) of the table's changes or a small tail's
        newest rows; the bytes it may take; the view's SQL over it at ``CHANGES_TOKEN``): kept as
        table ``<schema>_changes.name`` for the view to read. ``live_bytes`` (a bound on the bytes
        the view's rows take, 0 for never): the next call for the same view keeps those rows as
        table ``<schema>_live.name`` and the view reads it from then on (the first query at T reads
        the files: one query at T would pay for keeping every column for nothing). This sandbox
        keeps at most ``KEPT_BYTES`` in all; past it, views read the files as before.
        ``interval`` (``LiveSql.interval`` with the view's select list at ``COLUMNS_TOKEN``): when a
        second T reads the same files, their rows are kept once as a table for this state, each with
        its key's next t, and the view of this and every later such T is a filter over it (a first
        query at T then reads memory, no join); the first T asked reads as above.
        """
        with self.lock:
            if name is None:
                self._in_schema(cursor, schema, "")
                return
            view = f"{_ident(schema)}.{_ident(name)}"
            if (schema, name) in self.created:
                bound = self.deferred.pop((schema, name), 0)
                if bound and not self._room(cursor, bound, schema):
                    if bound <= KEPT_BYTES:  # what other queries read now may give way later
                        self.deferred[(schema, name)] = bound
                elif bound:
                    live = self._keep(cursor, schema + "_live", name, f"SELECT * FROM {view}")
                    if live is not None:
                        self._count(schema, bound)
                        cursor.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM {live}")
                return
            rows = None if interval is None else self._interval(cursor, interval, schema)
            if rows is not None:
                assert interval is not None
                self.reads.setdefault(schema, set()).add(interval[0])
                self._in_schema(cursor, schema, f"CREATE OR REPLACE VIEW {view} AS "
                                                f"{interval[2].replace(CHANGES_TOKEN, rows)}")
                self.created.add((schema, name))
                if live_bytes:
                    self.deferred[(schema, name)] = live_bytes
                return
            if changes is not None and self._room(cursor, changes[1], schema):
                kept = self._keep(cursor, schema + "_changes", name, changes[0])
                if kept is not None:
                    self._count(schema, changes[1])
                    sql = changes[2].replace(CHANGES_TOKEN, kept)
            self._in_schema(cursor, schema, f"CREATE OR REPLACE VIEW {view} AS {sql}")
            self.created.add((schema, name))
            if live_bytes:
                self.deferred[(schema, name)] = live_bytes

    def ensure_shared(self, cursor: duckdb.DuckDBPyConnection, schema: str, name: str, sql: str,
                      interval: str) -> None:
        """Create view ``schema.name AS sql`` (a filter over the kept ``intervals`` table ``interval``
        taking T from ``AS_OF_VARIABLE``) unless made before: ``schema`` is shared by every T whose
        views these are, so a first query at such a T sets the variable instead of making a schema
        and views."""
        with self.lock:
            if (schema, name) in self.created:
                return
            self.reads.setdefault(schema, set()).add(interval)
            self._in_schema(cursor, schema, f"CREATE OR REPLACE VIEW {_ident(schema)}.{_ident(name)} AS {sql}")
            self.created.add((schema, name))

    def served_shared(self, schema: str) -> bool:
        """Record that a shared schema served the T of as-of schema ``schema``; was it so before?"""
        with self.lock:
            if schema in self.shared_at:
                return True
            if len(self.shared_at) >= KEPT_SHARED_AT:  # a service asked at ever new T
                self.shared_at.clear()
            self.shared_at.add(schema)
            return False

    def use(self, cursor: duckdb.DuckDBPyConnection, schema: str) -> None:
        """``USE`` ``schema`` on ``cursor``, made first (in the same call) when no view made it."""
        with self.lock:
            self._in_schema(cursor, schema, f"USE {_ident(schema)}")

    def _in_schema(self, cursor: duckdb.DuckDBPyConnection, schema: str, statement: str) -> None:
        """Run ``statement`` (may be empty) through ``cursor``, ``schema`` made first when new, in the
        same call: each call to DuckDB costs about half a millisecond beside its statement."""
        make = "" if schema in self.schemas else f"CREATE SCHEMA IF NOT EXISTS {_ident(schema)}; "
        if make or statement:
            cursor.execute(make + statement)
        self.schemas.add(schema)

    def _interval(self, cursor: duckdb.DuckDBPyConnection, interval: tuple[str, str, str, int],
                  schema: str) -> str | None:
        """The kept table of ``interval`` (made when a second T asks for it, for ``schema``), or None."""
        name, build, _, size = interval
        if name in self.intervals:
            return self.intervals[name][0]
        asked = self.interval_asks[name] = self.interval_asks.get(name, 0) + 1
        # one T alone would pay for keeping every row of the files for nothing
        if asked < KEEP_ROWS_FROM or not self._room(cursor, size, schema):
            return None
        kept = self._keep(cursor, INTERVALS_SCHEMA, name, build)
        if kept is not None:
            self.kept_bytes += size
            self.intervals[name] = (kept, size)
            self.recent[name] = None
        return kept

    def _room(self, cursor: duckdb.DuckDBPyConnection, size: int, schema: str) -> bool:
        """Can ``size`` more bytes be kept for a query reading ``schema``? Past ``KEPT_BYTES``, the
        tables kept for the least recently read schemas and rows are dropped first (as a cache does:
        a worker's T move on), never what ``schema`` or a query still running reads; when even that
        leaves no room, nothing is dropped."""
        if self.kept_bytes + size <= KEPT_BYTES:
            return True
        busy = {schema, *(s for s, n in self.using.items() if n)}
        used = busy.union(*(self.reads.get(s, ()) for s in busy))
        # every schema kept for is in ``recent``, and one reading a kept interval goes with it
        freeable = (sum(size_kept for name, (_, size_kept) in self.intervals.items() if name not in used)
                    + sum(size_kept for name, size_kept in self.schema_bytes.items() if name not in busy))
        if self.kept_bytes - freeable + size > KEPT_BYTES:
            return False
        for name in list(self.recent):
            if self.kept_bytes + size <= KEPT_BYTES:
                break
            if name not in used:
                self._release(cursor, name)
        return True

    def _release(self, cursor: duckdb.DuckDBPyConnection, name: str) -> None:
        """Drop what is kept under ``name`` (in ``recent``): a kept interval's table with every schema
        whose views read it, or an as-of schema with kept tables (``_forget``); nothing otherwise."""
        if name in self.intervals:
            for reader in [s for s, names in self.reads.items() if name in names]:
                self._forget(cursor, reader)
            table, size_kept = self.intervals.pop(name)
            cursor.execute(f"DROP TABLE IF EXISTS {table}")
            self.kept_bytes -= size_kept
            self.recent.pop(name, None)
        elif name in self.schema_bytes:
            self._forget(cursor, name)

    def _count(self, schema: str, size: int) -> None:
        self.kept_bytes += size
        self.schema_bytes[schema] = self.schema_bytes.get(schema, 0) + size

    def forget(self, database: duckdb.DuckDBPyConnection, schema: str) -> None:
        """Drop what this sandbox keeps for the queries of one as-of schema: its views, the tables
        kept for them (their bytes freed from ``KEPT_BYTES``), and what its idle cursors set up for
        it; the cursors themselves, and their macros (which depend on the state only), stay for
        the next query at any T, as a finished query's cursor serves another T's."""
        with self.lock:
            self._forget(database, schema)

    def _forget(self, database: duckdb.DuckDBPyConnection, schema: str) -> None:
        """``forget``, the lock held."""
        spare = self.idle.setdefault(_SPARE, [])
        for pooled in self.idle.pop(schema, []):
            if len(spare) < IDLE_CURSORS:
                pooled.con.execute("USE memory.main")  # out of the schema dropped below
                spare.append(pooled)
            else:
                pooled.con.close()
        if schema in self.schemas:
            for name in (schema, schema + "_changes", schema + "_live"):
                database.execute(f"DROP SCHEMA IF EXISTS {_ident(name)} CASCADE")
            self.schemas.discard(schema)
        self.created = {c for c in self.created if c[0] != schema}
        self.deferred = {c: b for c, b in self.deferred.items() if c[0] != schema}
        self.kept_bytes -= self.schema_bytes.pop(schema, 0)
        self.shared_at.discard(schema)
        self.reads.pop(schema, None)
        self.recent.pop(schema, None)
        self.drops[schema] = self.drops.get(schema, 0) + 1

    @staticmethod
    def _keep(cursor: duckdb.DuckDBPyConnection, schema: str, name: str, select: str) -> str | None:
        """Table ``schema.name AS select``, its qualified name; None when it cannot be made."""
        kept = f"{_ident(schema)}.{_ident(name)}"
        cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {_ident(schema)}")
        try:
            cursor.execute(f"CREATE OR REPLACE TABLE {kept} AS {select}")
        except duckdb.Error:
            # keeping reads columns this query may not need: one that cannot be read (a damaged
            # chunk) fails only the queries that name it, as with the files alone
            return None
        return kept


def _reset(pooled: PooledCursor) -> None:
    """Undo what a cursor set up for its schema (schema history, registrations, ``USE``): it serves
    another now, set up anew for it but for its macros."""
    for name in pooled.registered:
        pooled.con.unregister(name)
    pooled.registered.clear()
    pooled.done.clear()


#: the schema a query as of T resolves its table names in (``USE``); users may not name it
AS_OF_SCHEMA = "__hp_asof_{as_of}"
#: the schema of the tables a sandbox keeps for every T (``LiveSql.interval``)
INTERVALS_SCHEMA = AS_OF_SCHEMA.split("{")[0] + "rows"

_sandboxes: OrderedDict[tuple[str, ...], tuple[duckdb.DuckDBPyConnection, SandboxViews]] = OrderedDict()
_parser: list[duckdb.DuckDBPyConnection] = []
_reader: list[duckdb.DuckDBPyConnection] = []


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_list(items: Sequence[str]) -> str:
    return "[" + ", ".join("'" + item.replace("'", "''") + "'" for item in items) + "]"


def _new_sandbox(allowed_paths: Sequence[str] | None) -> duckdb.DuckDBPyConnection:
    database = duckdb.connect(":memory:")
    # PostgreSQL's semantics where DuckDB differs by default: integer / integer is integer,
    # and NULLs sort last ascending but first descending
    database.execute("SET GLOBAL integer_division = true")
    database.execute("SET GLOBAL default_null_order = 'nulls_last_on_asc_first_on_desc'")
    # the session time zone is UTC, as for every other API (casts print TIMESTAMPTZ in UTC): DuckDB
    # takes the machine's otherwise, and a literal compared with a TIMESTAMPTZ, extract(hour ...) or
    # date_trunc would answer differently on a machine set to another zone
    database.execute("SET GLOBAL TimeZone = 'UTC'")
    # every query's own schema-history rows are registered on its cursor under this name
    database.execute("CREATE SCHEMA _history_catalog")
    database.register("__schema_history", _SCHEMA_HISTORY_SCHEMA.empty_table())
    # a query at T through a shared schema registers every row and sets T as a variable; one
    # through its own schema registers the rows before T (the variable, when set, is the same T)
    database.execute("CREATE VIEW _history_catalog.schema_history AS SELECT * FROM __schema_history "
                     f"WHERE logical_timestamp < coalesce(getvariable('{AS_OF_VARIABLE}'), {2**63 - 1})")
    database.unregister("__schema_history")
    # catalog files are immutable: their footers are kept instead of re-read at every bind
    database.execute("SET GLOBAL parquet_metadata_cache = true")
    if allowed_paths:
        database.execute("SET allowed_paths = " + _sql_list(sorted(allowed_paths)))
    database.execute("SET enable_external_access = false")
    database.execute("SET lock_configuration = true")
    return database


def query_cursor(key: tuple[str, ...], allowed_paths: Sequence[str] | None) -> duckdb.DuckDBPyConnection:
    """A cursor of the sandbox of catalog state ``key`` (made on first use, reading only ``allowed_paths``)."""
    return sandbox_cursor(key, allowed_paths)[0]


def sandbox_cursor(
    key: tuple[str, ...], allowed_paths: Sequence[str] | Callable[[], Sequence[str] | None] | None
) -> tuple[duckdb.DuckDBPyConnection, SandboxViews]:
    """``query_cursor``, with the record of the views kept in that cursor's sandbox. ``allowed_paths``
    may be a function giving them, called only when the sandbox is made (listing a state's files
    costs more than taking a cursor)."""
    with _lock:
        entry = _sandboxes.get(key)
        if entry is None or len(entry[1].schemas) > KEPT_AS_OF:
            paths = allowed_paths() if callable(allowed_paths) else allowed_paths
            entry = (_new_sandbox(paths), SandboxViews())
            _sandboxes[key] = entry
            while len(_sandboxes) > KEPT:
                _sandboxes.popitem(last=False)  # its open cursors keep it alive until they close
        else:
            _sandboxes.move_to_end(key)
        return entry[0].cursor(), entry[1]


def forget(key: tuple[str, ...], schema: str | None) -> None:
    """Drop what the sandbox of catalog state ``key`` keeps for the queries of one as-of schema, or
    the whole sandbox with None (cursors still reading keep it alive until they close)."""
    with _lock:
        entry = _sandboxes.get(key)
        if entry is None:
            return
        if schema is None:
            del _sandboxes[key]
    database, views = entry
    if schema is not None:
        views.forget(database, schema)
        return
    with views.lock:
        for cursors in views.idle.values():
            for pooled in cursors:
                pooled.con.close()
        views.idle.clear()


def reader_cursor() -> duckdb.DuckDBPyConnection:
    """A cursor on one process-wide database for reads no user SQL takes part in (``load_table_reader``):
    Arrow types kept lossless (UUID, JSON), Parquet footers cached; each reader's views are TEMP."""
    with _lock:
        if not _reader:
            database = duckdb.connect(":memory:")
            database.execute("SET GLOBAL arrow_lossless_conversion = true")
            database.execute("SET GLOBAL TimeZone = 'UTC'")  # TIMESTAMPTZ results in UTC, as load_table's
            database.execute("SET GLOBAL parquet_metadata_cache = true")
            _reader.append(database)
        return _reader[0].cursor()


def parser_cursor() -> Any:
    """A cursor on one process-wide sandbox that reads no file: for parsing and naming tables only."""
    with _lock:
        if not _parser:
            _parser.append(_new_sandbox(None))
        return _parser[0].cursor()


def register_schema_history(cursor: duckdb.DuckDBPyConnection, rows: pa.Table) -> None:
    """Give ``_history_catalog.schema_history`` this query's rows (the schema changes before T)."""
    cursor.register("__schema_history", rows.cast(_SCHEMA_HISTORY_SCHEMA))
