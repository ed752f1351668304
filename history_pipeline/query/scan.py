"""DuckDB views of supertables as of a timestamp: the same reconstruction as
``catalog/files.py`` (which files) and ``supertable/read.py`` (the newest version per key),
planned and run by DuckDB.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from history_pipeline.catalog.files import FileSelection, is_closed_read, is_marked_read, select_files
from history_pipeline.catalog.model import CatalogState, FileEntry
from history_pipeline.io.store import LocalStore, ObjectStore
from history_pipeline.schema import Supercolumn
from history_pipeline.supertable import DELETED, KEY, LT, SUPERSEDED, supertable_schema
from history_pipeline.supertable.read import dataset_of, footer


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


_DUCKDB_TYPES: dict[pa.Schema, dict[str, str]] = {}


def _duckdb_types(con: object, schema: pa.Schema) -> dict[str, str]:
    """DuckDB's type name of each column of a supertable schema (cached: asking costs ~10 ms)."""
    cached = _DUCKDB_TYPES.get(schema)
    if cached is None:
        names = [str(t) for t in con.from_arrow(schema.empty_table()).types]  # type: ignore[attr-defined]
        cached = dict(zip(schema.names, names, strict=True))
        if len(_DUCKDB_TYPES) > 1024:
            _DUCKDB_TYPES.clear()
        _DUCKDB_TYPES[schema] = cached
    return cached


@dataclass(frozen=True)
class LiveView:
    """A DuckDB view of a table's live rows as of T, and the local files it reads."""

    name: str
    paths: tuple[str, ...]


@dataclass(frozen=True)
class LiveSql:
    """The SELECT of a table's live rows as of T, the Arrow datasets it names (object-store files,
    registered per cursor) and the local files it reads. Plain text: cacheable per (state, T, table)."""

    sql: str
    datasets: tuple[tuple[str, ds.Dataset], ...]
    paths: tuple[str, ...]
    #: a table worth keeping per (state, T): (key, newest t) of the changes since the snapshot, or
    #: the newest rows of a small tail itself (``kept_tail``); the bytes it may take; and ``sql``
    #: reading that table at ``CHANGES_TOKEN`` (with ``kept_tail``, each layer selects
    #: ``COLUMNS_TOKEN``, the view's select list over the wanted columns, itself)
    changes_sql: str | None = None
    changes_bytes: int = 0
    materialized_sql: str | None = None
    kept_tail: bool = False
    #: the live rows are worth keeping whole as a table once a second query at T names the table
    #: (keeping reads every column of them, which a single query at T would pay for nothing): a
    #: bound on the bytes that table takes (``kept_table_bytes``); 0 when too large to keep
    live_bytes: int = 0
    #: an open read's rows, every one with the t of its key's next version (``NEXT_T``), worth
    #: keeping once for every T that reads the same files (``SandboxViews.ensure``): its name there
    #: (by the files, base and columns), its SELECT, the filter giving the live rows as of T, and the
    #: bytes it may take; None for a closed read (a filter over the files already), no version since
    #: the base, or rows too large to keep
    interval: tuple[str, str, str, int] | None = None


#: up to this many version rows since the snapshot, all of them are the changes (else the tail)
MATERIALIZE_ROWS = 1_000_000
#: bytes a kept (key, newest t) row is counted for
KEY_T_BYTES = 16
#: a tail of version files is kept whole (its newest rows per key, every column) when it holds at
#: most this many rows and at most ``1 / TAIL_SHARE`` of the rows read from the files beneath it:
#: the bulk is always scanned from Parquet, the kept part is the small delta above it
KEPT_TAIL_ROWS = 200_000
TAIL_SHARE = 4
#: a table's live rows as of T are kept as a table when it takes at most these bytes by
#: ``kept_table_bytes`` (the sandbox's own budget bounds every kept table together)
KEPT_LIVE_BYTES = 64_000_000
#: the column of a key's next version's t in ``LiveSql.interval``'s table (``NO_NEXT_T``: none in its files)
NEXT_T = "__hp_next_t"
NO_NEXT_T = 2**63 - 1
#: the DuckDB variable (one per connection) holding T for the views shared by every T reading the
#: same files (``interval_filter``): DuckDB folds it to a constant when it binds the query, so the
#: filter still reaches the scan
AS_OF_VARIABLE = "__hp_as_of"
#: where ``LiveSql.materialized_sql`` names the kept table
CHANGES_TOKEN = "__HP_CHANGES_TABLE__"
#: where a flat ``materialized_sql`` (``LiveSql.kept_tail``) takes the view's select list
COLUMNS_TOKEN = "__HP_COLUMNS__"


def version_layers(versions: Sequence[FileEntry]) -> tuple[tuple[FileEntry, ...], tuple[FileEntry, ...]]:
    """(head, tail) of the version files read at T: the head is every file holding the one oldest
    timestamp alone, when every other file is newer; (key, t) is unique, so the head's keys are
    unique and it needs no keep-latest, only the keys the tail rewrites taken out. No head: ((), all)."""
    if not versions or any(f.min_t is None or f.max_t is None for f in versions):
        return (), tuple(versions)
    oldest = min(f.min_t for f in versions)  # type: ignore[type-var]
    head = tuple(f for f in versions if f.min_t == f.max_t == oldest)
    tail = tuple(f for f in versions if not f.min_t == f.max_t == oldest)
    if not head or any(f.min_t <= oldest for f in tail):  # type: ignore[operator]
        return (), tuple(versions)
    return head, tail


def uncompressed_bytes(store: ObjectStore, files: Sequence[FileEntry]) -> int:
    """The files' uncompressed bytes, from their cached footers (a bound on what keeping them costs)."""
    total = 0
    for f in files:
        meta = footer(store, f.path).meta
        total += sum(meta.row_group(rg).total_byte_size for rg in range(meta.num_row_groups))
    return total


def _memory_width(kind: pa.DataType) -> int:
    """Bytes a value of ``kind`` takes in a DuckDB in-memory table beside any text it holds: its
    fixed width, 16 for text (DuckDB's string header), 32 a field for anything nested."""
    if isinstance(kind, pa.BaseExtensionType):
        kind = kind.storage_type
    if pa.types.is_boolean(kind):
        return 1
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
            or pa.types.is_large_binary(kind):
        return 16
    try:
        return max(1, kind.bit_width // 8)
    except ValueError:  # not fixed width: nested
        return 32 * max(1, kind.num_fields)


def kept_table_bytes(store: ObjectStore, files: Sequence[FileEntry], schema: pa.Schema,
                     columns: Sequence[str]) -> int:
    """A bound on the memory a DuckDB table of ``columns`` of at most the files' rows takes: every
    row at the columns' fixed widths, plus the files' uncompressed bytes for the text beyond them
    (the Parquet bytes alone undercount it several times: encoded and dictionary pages are small)."""
    width = sum(_memory_width(schema.field(c).type) for c in columns)
    return sum(f.row_count for f in files) * width + uncompressed_bytes(store, files)


def keeps_tail(head: Sequence[FileEntry], tail: Sequence[FileEntry], snapshot: Sequence[FileEntry]) -> bool:
    """Is the tail small beside what is read under it (snapshot and head), so that its newest rows
    are worth keeping as a table rather than scanning its files and joining on (key, newest t)?"""
    below = sum(f.row_count for f in (*snapshot, *head))
    rows = sum(f.row_count for f in tail)
    return bool(tail) and 0 < rows <= KEPT_TAIL_ROWS and rows * TAIL_SHARE <= below


def live_sql(
    store: ObjectStore,
    state: CatalogState,
    table_uuid: str,
    supercolumns: Sequence[Supercolumn],
    as_of: int,
    columns: Sequence[str],
    name: str,
    con: object,
) -> LiveSql:
    """The live rows of a supertable as of ``as_of`` as one SELECT (the Reconstruction Invariant).

    Read from the catalog's files for ``as_of``, in up to three layers whose keys are each unique:
    the snapshot's rows whose key has no version in [snapshot, as_of); the head of those versions
    (files of one single oldest t) whose key the tail does not rewrite; the newest tail version
    per key (a semi join on (key, max t), which unlike a window lets the query's filters reach
    the scan). A layer that is empty at ``as_of`` costs nothing; deletes are dropped last.
    ``materialized_sql`` is the same with (key, newest t) of the changes read from a table made
    once (two integer columns), so a query scans each change file once; or, when the tail is small
    beside the snapshot and head beneath it (``keeps_tail``), with the tail's newest rows per key
    themselves kept as that table, so a query scans only the bulk's files (over a snapshot, the
    head too is kept when every change together is small beside it). The
    ``t`` range is a filter on each scan, so row groups outside it are skipped by their min/max.
    Local files are read by DuckDB's Parquet reader (only the columns and row groups a query
    needs); object-store files through Arrow datasets registered as ``{name}__{part}``.
    In a closed interval (``FileSelection.closed``: every file marked for [snapshot, next
    snapshot) and holding ``superseded_at``) the read is two filtered scans instead, no join:
    the rows not deleted whose ``superseded_at`` is NULL or at/above ``as_of``. Above an open
    interval's marks U (``FileSelection.marked_and_since``) the marked files' rows current at U
    (``superseded_at`` NULL) stand for the snapshot, and the version files since U are the changes.
    Whatever the read, when the live rows would take at most ``KEPT_LIVE_BYTES`` as a table,
    ``live_bytes`` says so: the sandbox then keeps them whole from the second query at ``as_of``
    (``SandboxViews.ensure``), so later queries scan memory instead of every version beneath them.
    Columns: synthetic_key, is_deleted, logical_timestamp, then ``columns`` (supercolumn names).
    ``con`` only names DuckDB's types (of columns no file has yet); nothing is created on it.
    """
    selection = select_files(state, table_uuid, as_of)
    marks = selection.marked_and_since if is_marked_read(store, selection) else None
    if marks is not None:
        # above an open interval's marks U: the rows current at U (superseded_at NULL) are the
        # base layer, and the version files since U the changes over it
        mark, marked_files, since = marks
        selection = FileSelection(marked_files, mark, since, None, as_of)
    schema = supertable_schema(supercolumns)
    wanted = [KEY, DELETED, LT] + [c for c in columns if c not in (KEY, DELETED, LT)]
    types = _duckdb_types(con, schema)
    local = isinstance(store, LocalStore)
    paths: list[str] = []
    datasets: list[tuple[str, ds.Dataset]] = []
    k, d, lt = _quote(KEY), _quote(DELETED), _quote(LT)
    lower = "" if selection.snapshot_as_of is None else f" AND {lt} >= {selection.snapshot_as_of}"
    in_range = f" WHERE {lt} < {as_of}{lower}"
    closed = is_closed_read(store, selection)
    rows_read = sum(f.row_count for f in (*selection.snapshot, *selection.versions))
    # the live rows themselves are worth keeping as a table when small: every later query at T then
    # scans memory, not the versions beneath them (a closed read's filter columns of several times
    # the live rows; an open read's snapshot or marked rows joined with the changes since)
    bound = kept_table_bytes(store, (*selection.snapshot, *selection.versions), schema, wanted)
    live_bytes = bound if 0 < bound <= KEPT_LIVE_BYTES else 0
    marked = schema.append(pa.field(SUPERSEDED, pa.int64()))
    sup = _quote(SUPERSEDED)
    # the base layer above the marks: the rows no version below them superseded
    at_marks = f" WHERE {sup} IS NULL" if marks is not None else ""

    def scan(files: Sequence[FileEntry], part: str) -> tuple[str, list[str]]:
        """The files as one relation (a table function or a registered dataset) and the wanted
        columns projected from it (NULL where no file has the column)."""
        if not local:
            registered = f"{name}__{part}"
            if all(r != registered for r, _ in datasets):
                read_marks = closed or (marks is not None and part == "snapshot")
                datasets.append((registered, dataset_of(store, files, marked if read_marks else schema)))
            return _quote(registered), [_quote(c) for c in wanted]
        full = [store.full_path(f.path) for f in files]
        paths.extend(p for p in full if p not in paths)
        footers = [footer(store, f.path) for f in files]
        present = set().union(*(c.columns for c in footers))
        files_sql = "[" + ", ".join(_literal(p) for p in full) + "]"
        # files of one schema need no union by name (binding it reads every file's schema, at
        # every query)
        same = all(c.schema is not None and c.schema.equals(footers[0].schema) for c in footers)
        projected = [_quote(c) if c in present else f"CAST(NULL AS {types[c]}) AS {_quote(c)}" for c in wanted]
        return f"read_parquet({files_sql}{'' if same else ', union_by_name = true'})", projected

    def source(files: Sequence[FileEntry], part: str, where: str) -> str:
        """The wanted columns of the files' rows passing ``where`` (which may name any stored column)."""
        relation, projected = scan(files, part)
        return f"(SELECT {', '.join(projected)} FROM {relation}{where})"

    def relation(files: Sequence[FileEntry], part: str) -> str:
        """The files as one relation holding every wanted column, unprojected where it can be."""
        relation, projected = scan(files, part)
        if projected == [_quote(c) for c in wanted]:
            return relation
        return f"(SELECT {', '.join(projected)} FROM {relation})"

    def newest(part: str) -> str:
        """Each key's newest row of ``part`` (deletes included): a semi join on (key, max t)."""
        latest = f"SELECT {k}, max({lt}) AS {lt} FROM {part} GROUP BY {k}"
        return f"(SELECT r.* FROM {part} r SEMI JOIN ({latest}) m USING ({k}, {lt}))"

    def assemble(head_sql: str | None, changes: str | None, changes_keys: str | None) -> str:
        """The layers: snapshot rows whose key has no change, head rows whose key the changes
        do not rewrite, the changes' (unique) rows; deletes dropped last."""
        parts = []
        if selection.snapshot:
            # a snapshot holds the state as of its snapshot_as_of <= as_of: every row is below as_of
            base = f"SELECT * FROM {source(selection.snapshot, 'snapshot', at_marks)} s WHERE NOT s.{d}"
            rewritten = " UNION ALL ".join(
                [f"SELECT {k} FROM {head_sql}"] * bool(head_sql) + [changes_keys] * bool(changes_keys))
            if rewritten:
                base = f"SELECT s.* FROM ({base}) s ANTI JOIN ({rewritten}) n USING ({k})"
            parts.append(base)
        if head_sql:
            first = f"SELECT * FROM {head_sql} h WHERE NOT h.{d}"
            if changes_keys:
                first = f"SELECT h.* FROM ({first}) h ANTI JOIN ({changes_keys}) n USING ({k})"
            parts.append(first)
        if changes:
            parts.append(f"SELECT * FROM {changes} c WHERE NOT c.{d}")
        if not parts:
            nulls = ", ".join(f"CAST(NULL AS {types[c]}) AS {_quote(c)}" for c in wanted)
            parts.append(f"SELECT {nulls} WHERE false")
        return " UNION ALL ".join(f"({part})" for part in parts)

    if closed:
        # a closed interval: each layer's current rows are those not superseded below as_of, and
        # their keys are unique across layers, so the read is filtered scans, no join
        current = f" AND NOT {d} AND ({sup} IS NULL OR {sup} >= {as_of})"
        parts = []
        if selection.snapshot:
            parts.append(source(selection.snapshot, "snapshot", f" WHERE true{current}"))
        if selection.versions:
            parts.append(source(selection.versions, "versions", f"{in_range}{current}"))
        sql = " UNION ALL ".join(f"(SELECT * FROM {part})" for part in parts)
        interval = None
        if live_bytes:
            # every row with its superseded_at as its next t: the same filter answers at every T
            marked_rows = []
            for files, part, where in ((selection.snapshot, "snapshot", ""),
                                       (selection.versions, "versions", lower.replace(" AND", " WHERE", 1))):
                if files:
                    relation_, projected = scan(files, part)
                    marked_rows.append(f"SELECT {', '.join(projected)}, {sup} AS {_quote(NEXT_T)} "
                                       f"FROM {relation_}{where}")
            interval = _interval(selection, "closed", wanted, table_uuid, as_of,
                                 " UNION ALL ".join(marked_rows), False, live_bytes + 8 * rows_read)
        return LiveSql(sql, tuple(datasets), tuple(paths), live_bytes=live_bytes, interval=interval)
    interval = None
    if selection.versions and live_bytes:
        base = source(selection.snapshot, "snapshot", at_marks) if selection.snapshot else None
        since = source(selection.versions, "versions", lower.replace(" AND", " WHERE", 1))
        interval = _interval(selection, "marked" if marks is not None else "open", wanted, table_uuid, as_of,
                             " UNION ALL ".join(f"SELECT * FROM {part}" for part in (base, since) if part),
                             True, live_bytes + 8 * rows_read)
    head, tail = version_layers(selection.versions)
    if head and selection.snapshot and keeps_tail((), selection.versions, selection.snapshot):
        # changes small beside the snapshot are kept whole, head included: a query then scans only
        # the snapshot's files, anti-joined with one small table's keys (the head's files would be
        # scanned twice more, and a union of keys on the build side can turn the join around)
        head, tail = (), tuple(selection.versions)
    head_sql = source(head, "head", in_range) if head else None
    tail_sql = source(tail, "tail", in_range) if tail else None
    sql = assemble(head_sql, newest(tail_sql) if tail_sql else None,
                   f"SELECT {k} FROM {tail_sql}" if tail_sql else None)
    # (key, newest t) of the changes is worth keeping as a table: the rows are still read from
    # the files (only the columns a query uses), joined to it once instead of keyed by a grouping
    changes_sql, changes_bytes, materialized_sql = None, 0, None
    keys = f"SELECT {k} FROM {CHANGES_TOKEN}"
    kept_tail = tail_sql is not None and keeps_tail(head, tail, selection.snapshot)
    if tail_sql is not None and kept_tail:
        # the tail's newest rows (deletes too: they hide older rows beneath) as the table itself;
        # the view is flat, each layer projected at its scan (``COLUMNS_TOKEN``): binding nested
        # selects of every column costs a small query as much as its scan
        changes_sql = f"SELECT * FROM {newest(tail_sql)} r"
        changes_bytes = uncompressed_bytes(store, tail)
        layers = []
        if selection.snapshot:
            rewritten = [f"SELECT {k} FROM {relation(head, 'head')}{in_range}"] * bool(head) + [keys]
            bulk = relation(selection.snapshot, "snapshot") if marks is None else \
                source(selection.snapshot, "snapshot", at_marks)
            layers.append(f"SELECT {COLUMNS_TOKEN} FROM {bulk} s ANTI JOIN "
                          f"({' UNION ALL '.join(rewritten)}) n USING ({k}) WHERE NOT s.{d}")
        if head:
            layers.append(f"SELECT {COLUMNS_TOKEN} FROM {relation(head, 'head')} h ANTI JOIN ({keys}) n "
                          f"USING ({k}){in_range} AND NOT h.{d}")
        layers.append(f"SELECT {COLUMNS_TOKEN} FROM {CHANGES_TOKEN} c WHERE NOT c.{d}")
        materialized_sql = " UNION ALL ".join(layers)
    elif tail:
        rows = sum(f.row_count for f in selection.versions)
        part, first = (source(selection.versions, "versions", in_range), None) if rows <= MATERIALIZE_ROWS \
            else (tail_sql, head_sql)
        changes_sql = f"SELECT {k}, max({lt}) AS {lt} FROM {part} GROUP BY {k}"
        changes_bytes = KEY_T_BYTES * (rows if first is None else sum(f.row_count for f in tail))
        newest_rows = f"(SELECT r.* FROM {part} r SEMI JOIN {CHANGES_TOKEN} m USING ({k}, {lt}))"
        materialized_sql = assemble(first, newest_rows, keys)
    return LiveSql(sql, tuple(datasets), tuple(paths), changes_sql, changes_bytes, materialized_sql, kept_tail,
                   live_bytes, interval)


def _interval(selection: FileSelection, read: str, wanted: Sequence[str], table_uuid: str, as_of: int,
              rows: str, lead: bool, size: int) -> tuple[str, str, str, int]:
    """``LiveSql.interval``: every row read (``rows``: the base's, a snapshot's or the marked rows
    current at the marks, then every version since), each with its key's next t: computed among
    them with ``lead``, else ``rows`` give it (a closed interval's superseded_at). (key, t) is
    unique and the base's rows are older than every version since, so the row of a key live as of
    any T these files are read for is the one with t < T <= its next t, unless it is a delete (not
    kept); a later version in a file not read for T is at or above T, so it changes no row's answer."""
    k, lt, nxt = _quote(KEY), _quote(LT), _quote(NEXT_T)
    with_next = (f"SELECT *, lead({lt}) OVER (PARTITION BY {k} ORDER BY {lt}) AS {nxt} FROM ({rows})" if lead
                 else f"SELECT * FROM ({rows})")
    # deletes are live at no T once they end the row before them; no next version is the largest
    # next t, and the rows are kept in order of it: the filter is two ranges, and a T near the newest
    # skips by their zone maps the row groups of rows superseded before it (a worker's T mostly is)
    build = (f"SELECT * REPLACE (coalesce({nxt}, {NO_NEXT_T}) AS {nxt}) FROM ({with_next}) "
             f"WHERE NOT {_quote(DELETED)} ORDER BY {nxt}")
    files = (table_uuid, read, selection.snapshot_as_of, tuple(f.path for f in selection.snapshot),
             tuple(f.path for f in selection.versions), tuple(wanted))
    name = "rows_" + hashlib.sha1(repr(files).encode()).hexdigest()[:20]
    return name, build, interval_filter(str(int(as_of))), size


def interval_filter(as_of: str) -> str:
    """The filter giving the live rows as of ``as_of`` (SQL: a literal, or the variable a view shared
    by every T reads, ``AS_OF_VARIABLE``) over a ``LiveSql.interval`` table."""
    lt, nxt = _quote(LT), _quote(NEXT_T)
    return f"{lt} < {as_of} AND {nxt} >= {as_of}"


def live_view(
    con: object,
    store: ObjectStore,
    state: CatalogState,
    table_uuid: str,
    supercolumns: Sequence[Supercolumn],
    as_of: int,
    columns: Sequence[str],
    name: str,
) -> LiveView:
    """Create TEMP view ``name`` on ``con``: the live rows of a supertable as of ``as_of`` (see ``live_sql``)."""
    live = live_sql(store, state, table_uuid, supercolumns, as_of, columns, name, con)
    for registered, dataset in live.datasets:
        con.register(registered, dataset)  # type: ignore[attr-defined]
    con.execute(f"CREATE TEMP VIEW {_quote(name)} AS {live.sql}")  # type: ignore[attr-defined]
    return LiveView(name, live.paths)


#: per supertable schema: does DuckDB hand its columns back in exactly these Arrow types?
_EXACT_TYPES: dict[pa.Schema, bool] = {}


def key_versions(con: object, store: ObjectStore, files: Sequence[FileEntry], schema: pa.Schema,
                 key: int) -> pa.Table | None:
    """Every version of one key in local ``files`` (``schema``'s columns, any order), read by
    DuckDB: the key filter runs inside the scan, so row groups whose statistics exclude the key are
    skipped and, in the others, only the key's rows of each column are materialized (pyarrow decodes
    whole row groups). None when the store is not local or DuckDB's Arrow types differ from
    ``schema``'s: the caller then reads through ``supertable.read.read_key``."""
    if not isinstance(store, LocalStore) or _EXACT_TYPES.get(schema) is False:
        return None
    chosen = [f for f in files if f.row_count and (f.min_key is None or f.max_key is None
                                                   or f.min_key <= key <= f.max_key)]
    footers = [footer(store, f.path) for f in chosen]
    held = [(f, c) for f, c in zip(chosen, footers, strict=True) if c.row_groups_holding(key)]
    if not held:
        return schema.empty_table()
    types = _duckdb_types(con, schema)
    present = set().union(*(c.columns for _, c in held))
    projected = [_quote(c) if c in present else f"CAST(NULL AS {types[c]}) AS {_quote(c)}" for c in schema.names]
    same = all(c.schema is not None and c.schema.equals(held[0][1].schema) for _, c in held)
    files_sql = "[" + ", ".join(_literal(store.full_path(f.path)) for f, _ in held) + "]"
    try:
        table = con.sql(  # type: ignore[attr-defined]
            f"SELECT {', '.join(projected)} FROM read_parquet({files_sql}{'' if same else ', union_by_name = true'}) "
            f"WHERE {_quote(KEY)} = {int(key)}").to_arrow_table()
        columns = [_as_type(column, field.type) for column, field in zip(table.columns, schema, strict=True)]
    except duckdb.ConversionException:  # a stored type DuckDB cannot hand to Arrow as such
        columns = [None]
    exact = all(column is not None for column in columns)
    _EXACT_TYPES[schema] = exact
    if len(_EXACT_TYPES) > 1024:
        _EXACT_TYPES.clear()
    # the reserved columns are never NULL: the schema's non-nullable fields hold them as read
    return pa.Table.from_arrays(columns, schema=schema) if exact else None


def _as_type(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray | None:
    """``column`` as ``kind`` when DuckDB gave exactly that type, or a boolean as its lossless
    ``arrow.bool8`` (one byte a value); None for any other difference."""
    if column.type == kind:
        return column
    if pa.types.is_boolean(kind) and isinstance(column.type, pa.BaseExtensionType) \
            and column.type.extension_name == "arrow.bool8":
        # one kernel call over every chunk (DuckDB hands back a chunk per file read)
        storage = pa.chunked_array([chunk.storage for chunk in column.chunks], column.type.storage_type)
        return pc.not_equal(storage, 0)
    return None
