"""Reading supertables as of a timestamp: which files, and the newest version per key.

For ``as_of = T`` a table is read from its newest snapshot with
``snapshot_as_of <= T`` plus the version files holding timestamps in
``[snapshot_as_of, T)`` (or all versions below ``T`` when no snapshot is that
old). Cost grows with the live rows and the changes since that snapshot, not
with the whole history. Only files the catalog lists are read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from history_pipeline.catalog.model import CatalogState, FileEntry, FileKind
from history_pipeline.io.store import ObjectStore
from history_pipeline.schema import Supercolumn
from history_pipeline.supertable import DELETED, KEY, LT, supertable_schema


@dataclass(frozen=True)
class FileSelection:
    snapshot: tuple[FileEntry, ...]
    snapshot_as_of: int | None
    versions: tuple[FileEntry, ...]


def select_files(
    state: CatalogState, table_uuid: str, as_of: int, keys: Sequence[int] | None = None
) -> FileSelection:
    """The files needed to read ``table_uuid`` as of ``as_of`` (optionally only some keys)."""
    snapshots = [
        f
        for f in state.files_of(table_uuid, FileKind.SNAPSHOT)
        if f.snapshot_as_of is not None and f.snapshot_as_of <= as_of
    ]
    snapshot_as_of = max((f.snapshot_as_of for f in snapshots), default=None)  # type: ignore[type-var]
    chosen = tuple(f for f in snapshots if f.snapshot_as_of == snapshot_as_of)
    lower = snapshot_as_of if snapshot_as_of is not None else None
    versions = tuple(
        f
        for f in state.files_of(table_uuid, FileKind.VERSIONS)
        if f.row_count
        and f.min_t is not None
        and f.min_t < as_of
        and (lower is None or (f.max_t is not None and f.max_t >= lower))
    )
    if keys is not None:
        low, high = min(keys, default=0), max(keys, default=-1)
        chosen = tuple(f for f in chosen if _overlaps(f, low, high))
        versions = tuple(f for f in versions if _overlaps(f, low, high))
    return FileSelection(chosen, snapshot_as_of, versions)


def _overlaps(f: FileEntry, low: int, high: int) -> bool:
    if f.min_key is None or f.max_key is None:
        return f.row_count > 0
    return f.min_key <= high and low <= f.max_key


def dataset_of(store: ObjectStore, files: Iterable[FileEntry], schema: pa.Schema) -> ds.Dataset:
    """One Arrow dataset over files, with columns missing from older files read as nulls."""
    fs, _ = store.arrow_filesystem()
    paths = [store.full_path(f.path) for f in files]
    return ds.dataset(paths, schema=schema, format="parquet", filesystem=fs)


def read_parts(
    store: ObjectStore,
    selection: FileSelection,
    supercolumns: Sequence[Supercolumn],
    as_of: int,
    keys: Sequence[int] | None = None,
    columns: Sequence[str] | None = None,
) -> tuple[pa.Table, pa.Table]:
    """(the snapshot's rows, the versions after it and below ``as_of``), both possibly empty."""
    schema = supertable_schema(supercolumns)
    wanted = list(columns) if columns is not None else schema.names
    for reserved in (LT, DELETED, KEY):
        if reserved not in wanted:
            wanted.insert(0, reserved)
    empty = schema.empty_table().select(wanted)
    base, changes = empty, empty
    if keys is not None and len(set(keys)) == 1:  # a point lookup: cached footers, bisected row groups
        (key,) = set(keys)
        base = read_key(store, selection.snapshot, schema, wanted, key, None, as_of)
        changes = read_key(store, selection.versions, schema, wanted, key, selection.snapshot_as_of, as_of)
        return base, changes
    key_filter = ds.field(KEY).isin(pa.array(sorted(set(keys)), pa.int64())) if keys is not None else None
    if selection.snapshot:
        expr = ds.field(LT) < as_of
        if key_filter is not None:
            expr = expr & key_filter
        base = dataset_of(store, selection.snapshot, schema).to_table(columns=wanted, filter=expr)
    if selection.versions:
        expr = ds.field(LT) < as_of
        if selection.snapshot_as_of is not None:
            expr = expr & (ds.field(LT) >= selection.snapshot_as_of)
        if key_filter is not None:
            expr = expr & key_filter
        changes = dataset_of(store, selection.versions, schema).to_table(columns=wanted, filter=expr)
    return base, changes


@dataclass(frozen=True)
class Footer:
    """What a point lookup needs from a file: its footer, its columns, each row group's key range."""

    meta: pq.FileMetaData
    columns: frozenset[str]
    key_ranges: tuple[tuple[int, int] | None, ...]

    def row_groups_holding(self, key: int) -> list[int]:
        return [rg for rg, bounds in enumerate(self.key_ranges) if bounds is None or bounds[0] <= key <= bounds[1]]


_FOOTERS: OrderedDict[tuple[str, str], Footer] = OrderedDict()
_FOOTER_CACHE_SIZE = 4096


def footer(store: ObjectStore, path: str) -> Footer:
    """A file's footer, cached: files are immutable, so a path's footer never changes."""
    cache_key = (store.uri, path)
    cached = _FOOTERS.get(cache_key)
    if cached is None:
        fs, _ = store.arrow_filesystem()
        with fs.open_input_file(store.full_path(path)) as handle:
            meta = pq.read_metadata(handle)
        arrow_schema = meta.schema.to_arrow_schema()
        index = arrow_schema.get_field_index(KEY)
        ranges: list[tuple[int, int] | None] = []
        for rg in range(meta.num_row_groups):
            stats = meta.row_group(rg).column(index).statistics
            ranges.append((stats.min, stats.max) if stats is not None and stats.has_min_max else None)
        cached = Footer(meta, frozenset(arrow_schema.names), tuple(ranges))
        _FOOTERS[cache_key] = cached
        if len(_FOOTERS) > _FOOTER_CACHE_SIZE:
            _FOOTERS.popitem(last=False)
    return cached


def read_key(
    store: ObjectStore,
    files: Sequence[FileEntry],
    schema: pa.Schema,
    wanted: Sequence[str],
    key: int,
    lower: int | None,
    upper: int,
) -> pa.Table:
    """Every version of one key with ``lower <= t < upper`` in ``files``, reading only its row groups."""
    parts = []
    fs, _ = store.arrow_filesystem()
    for f in files:
        if f.min_key is not None and f.max_key is not None and not f.min_key <= key <= f.max_key:
            continue
        cached = footer(store, f.path)
        groups = cached.row_groups_holding(key)
        if not groups:
            continue
        with fs.open_input_file(store.full_path(f.path)) as handle:
            table = pq.ParquetFile(handle, metadata=cached.meta).read_row_groups(
                groups, columns=[c for c in wanted if c in cached.columns]
            )
        mask = pc.equal(table.column(KEY), key)
        mask = pc.and_(mask, pc.less(table.column(LT), upper))
        if lower is not None:
            mask = pc.and_(mask, pc.greater_equal(table.column(LT), lower))
        table = table.filter(mask)
        columns = [
            table.column(c).cast(schema.field(c).type) if c in table.column_names
            else pa.nulls(table.num_rows, schema.field(c).type)
            for c in wanted
        ]
        parts.append(pa.table(columns, schema=pa.schema([schema.field(c) for c in wanted])))
    if not parts:
        return schema.empty_table().select(list(wanted))
    return pa.concat_tables(parts)


def keep_latest(candidates: pa.Table, *, include_deleted: bool = False) -> pa.Table:
    """The newest version of each key, without deleted keys (the Reconstruction Invariant).

    One sort by (key, timestamp) and one pass keeping each key's last row; Arrow
    types (UUID, JSON extensions) survive untouched.
    """
    if candidates.num_rows == 0:
        return candidates
    ordered = candidates if _sorted_by_key_and_t(candidates) else candidates.sort_by(
        [(KEY, "ascending"), (LT, "ascending")]
    )
    keys = ordered.column(KEY).combine_chunks()
    if len(keys) > 1:
        last = pc.not_equal(keys.slice(0, len(keys) - 1), keys.slice(1))
        last = pa.concat_arrays([last, pa.array([True])])
    else:
        last = pa.array([True])
    latest = ordered.filter(last)
    if not include_deleted:
        latest = latest.filter(pc.invert(latest.column(DELETED)))
    return latest


def _sorted_by_key_and_t(table: pa.Table) -> bool:
    """Already in (key, timestamp) order? (one file's rows are; checking costs less than sorting)."""
    if table.num_rows < 2:
        return True
    keys = table.column(KEY).combine_chunks()
    lts = table.column(LT).combine_chunks()
    head_k, tail_k = keys.slice(0, len(keys) - 1), keys.slice(1)
    head_t, tail_t = lts.slice(0, len(lts) - 1), lts.slice(1)
    in_order = pc.or_(pc.less(head_k, tail_k), pc.and_(pc.equal(head_k, tail_k), pc.less(head_t, tail_t)))
    return bool(pc.all(in_order).as_py())


def live_rows(
    store: ObjectStore,
    state: CatalogState,
    table_uuid: str,
    supercolumns: Sequence[Supercolumn],
    as_of: int,
    keys: Sequence[int] | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """The live rows of a supertable as of ``as_of``: synthetic_key, logical_timestamp and supercolumns."""
    selection = select_files(state, table_uuid, as_of, keys)
    base, changes = read_parts(store, selection, supercolumns, as_of, keys, columns)
    return overlay(base, changes)


def overlay(base: pa.Table, changes: pa.Table) -> pa.Table:
    """Snapshot rows overridden by the newest later version of their key (deletes drop the key).

    Works on indices: the changes' keys and timestamps are sorted (not their rows), the snapshot
    (already one live row per key) is filtered by a set lookup, and the rows are gathered once,
    in key order. The cost is the live rows plus the changes, not the history.
    """
    if changes.num_rows == 0:
        return base.filter(pc.invert(base.column(DELETED))) if base.num_rows else base
    order = pc.sort_indices(
        pa.table({"k": changes.column(KEY), "t": changes.column(LT)}),
        sort_keys=[("k", "ascending"), ("t", "ascending")],
    )
    keys = pc.take(changes.column(KEY), order).combine_chunks()
    if len(keys) > 1:
        last = pa.concat_arrays([pc.not_equal(keys.slice(0, len(keys) - 1), keys.slice(1)), pa.array([True])])
    else:
        last = pa.array([True])
    newest = order.filter(last)
    alive = pc.invert(_contiguous(pc.take(changes.column(DELETED), newest)))
    newest_alive = _contiguous(newest.filter(alive)).cast(pa.int64())
    if not base.num_rows:
        return changes.take(newest_alive)
    keep = pc.and_(
        pc.invert(pc.is_in(base.column(KEY), value_set=keys.filter(last))), pc.invert(base.column(DELETED))
    ).combine_chunks()
    rows = pa.concat_arrays([
        _contiguous(pc.indices_nonzero(keep)).cast(pa.int64()),
        _contiguous(pc.add(newest_alive, pa.scalar(base.num_rows, pa.int64()))),
    ])
    combined = pa.concat_tables([base, changes.cast(base.schema)])
    in_key_order = pc.take(rows, pc.sort_indices(pc.take(combined.column(KEY), rows)))
    return combined.take(in_key_order)


def _contiguous(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


# --- DuckDB views: the same reconstruction, planned and run by DuckDB ---------------------------


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
    #: (key, newest t) of the changes since the snapshot, to keep as a table; its row bound; and
    #: ``sql`` reading that table at ``CHANGES_TOKEN``
    changes_sql: str | None = None
    changes_rows: int = 0
    materialized_sql: str | None = None


#: up to this many version rows since the snapshot, all of them are the changes (else the tail)
MATERIALIZE_ROWS = 1_000_000
#: where ``LiveSql.materialized_sql`` names the kept table
CHANGES_TOKEN = "__HP_CHANGES_TABLE__"


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
    once (two integer columns), so a query scans each change file once. The
    ``t`` range is a filter on each scan, so row groups outside it are skipped by their min/max.
    Local files are read by DuckDB's Parquet reader (only the columns and row groups a query
    needs); object-store files through Arrow datasets registered as ``{name}__{part}``.
    Columns: synthetic_key, is_deleted, logical_timestamp, then ``columns`` (supercolumn names).
    ``con`` only names DuckDB's types (of columns no file has yet); nothing is created on it.
    """
    from history_pipeline.io.store import LocalStore

    selection = select_files(state, table_uuid, as_of)
    schema = supertable_schema(supercolumns)
    wanted = [KEY, DELETED, LT] + [c for c in columns if c not in (KEY, DELETED, LT)]
    types = _duckdb_types(con, schema)
    local = isinstance(store, LocalStore)
    paths: list[str] = []
    datasets: list[tuple[str, ds.Dataset]] = []
    k, d, lt = _quote(KEY), _quote(DELETED), _quote(LT)
    lower = "" if selection.snapshot_as_of is None else f" AND {lt} >= {selection.snapshot_as_of}"
    in_range = f" WHERE {lt} < {as_of}{lower}"

    def source(files: Sequence[FileEntry], part: str, where: str) -> str:
        if not local:
            registered = f"{name}__{part}"
            datasets.append((registered, dataset_of(store, files, schema)))
            return f"(SELECT {', '.join(_quote(c) for c in wanted)} FROM {_quote(registered)}{where})"
        full = [store.full_path(f.path) for f in files]
        paths.extend(full)
        present = set().union(*(footer(store, f.path).columns for f in files))
        projected = [
            _quote(c) if c in present else f"CAST(NULL AS {types[c]}) AS {_quote(c)}" for c in wanted
        ]
        files_sql = "[" + ", ".join(_literal(p) for p in full) + "]"
        return f"(SELECT {', '.join(projected)} FROM read_parquet({files_sql}, union_by_name = true){where})"

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
            base = f"SELECT * FROM {source(selection.snapshot, 'snapshot', '')} s WHERE NOT s.{d}"
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

    head, tail = version_layers(selection.versions)
    head_sql = source(head, "head", in_range) if head else None
    tail_sql = source(tail, "tail", in_range) if tail else None
    sql = assemble(head_sql, newest(tail_sql) if tail_sql else None,
                   f"SELECT {k} FROM {tail_sql}" if tail_sql else None)
    # (key, newest t) of the changes is worth keeping as a table: the rows are still read from
    # the files (only the columns a query uses), joined to it once instead of keyed by a grouping
    changes_sql, changes_rows, materialized_sql = None, 0, None
    keys = f"SELECT {k} FROM {CHANGES_TOKEN}"
    if tail:
        rows = sum(f.row_count for f in selection.versions)
        part, first = (source(selection.versions, "versions", in_range), None) if rows <= MATERIALIZE_ROWS \
            else (tail_sql, head_sql)
        changes_sql = f"SELECT {k}, max({lt}) AS {lt} FROM {part} GROUP BY {k}"
        changes_rows = rows if first is None else sum(f.row_count for f in tail)
        newest_rows = f"(SELECT r.* FROM {part} r SEMI JOIN {CHANGES_TOKEN} m USING ({k}, {lt}))"
        materialized_sql = assemble(first, newest_rows, keys)
    return LiveSql(sql, tuple(datasets), tuple(paths), changes_sql, changes_rows, materialized_sql)


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
