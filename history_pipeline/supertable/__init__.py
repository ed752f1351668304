"""Supertable files: their Arrow schema, and writing them as self-describing Parquet.

Every supertable file holds row versions (``synthetic_key``, ``is_deleted``,
``logical_timestamp`` and supercolumns) sorted by (key, timestamp), in row
groups small enough that a key lookup reads little. Its footer metadata names
the database, table, kind, timestamp range and transaction, so the catalog can
be rebuilt from the files alone.

This layer reads and writes files and returns their statistics (:class:`WrittenFile`); it knows
nothing of the catalog, which turns statistics into entries (``catalog/files.py``). Reading
files back is ``supertable/read.py``.
"""

from __future__ import annotations

import enum
import functools
import io
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from history_pipeline.io.store import ObjectStore
from history_pipeline.schema import SchemaHistoryEntry, Supercolumn
from history_pipeline.types import arrow_native, arrow_type, to_arrow_value

KEY, DELETED, LT = "synthetic_key", "is_deleted", "logical_timestamp"
RESERVED = (KEY, DELETED, LT)
#: in files of a closed interval [S, S') (footer ``closed_until = S'``): the t of the next version
#: of the row's key below S' (NULL: none), so a read as of T in [S, S') is a filter, no join
SUPERSEDED = "superseded_at"
ROW_GROUP_ROWS = 16_384
#: the row order of a closed interval's files (``closed_layout``), named in their footer and catalog
#: entry; files marked before it (no layout named: key-sorted whole; 2: no run of hot keys; 3: no
#: cells by t, an interval cut into key-range pieces of 1M rows) are laid out again when their
#: interval is next closed
CLOSED_LAYOUT = 4
#: row groups of a closed file's time-ordered rows are cut into about this many buckets per class:
#: a read as of T wastes about half a bucket per class, a key lookup looks at one row group per bucket
CLOSED_BUCKETS = 8
#: a bucket of superseded rows is cut again into about this many cells by t, so that a read as of T
#: early in an interval skips the rows of later buckets written after T too. With snapshots twice the
#: live rows apart (the default) an interval's versions are twice its answer, and
#: in one file per interval the (bucket, cell) grid is fine enough: simulated on a real interval at
#: 10M versions, rows decoded per row current 2.58 / 2.38 / 1.74x at 5 % / 20 % / 50 % into it
#: without cells in 1M-row pieces, 1.45 / 1.38 / 1.25x with 8 cells in one file
#: (docs/decisions/0006-closed-interval-layout.md); layouts 2 and 3 had none
CLOSED_TIME_BUCKETS = 8
#: data page size of a closed-layout file: a key lookup by DuckDB (``row_history``) skips the pages of
#: a row group holding none of the key's rows, which pays for the page headers (+0.5-0.7% bytes)
CLOSED_PAGE_BYTES = 16 * 1024
#: false positives of the key column's Bloom filter in a time-cut file (``time_cut``): its row
#: groups span most of the key range, so a point lookup asks the filter which may hold the key.
#: pyarrow sizes the bitset to a power of two: 16 KiB for a row group's 16,384 keys (about 8% of
#: a row group's bytes), which gives about 3% in practice
KEY_BLOOM_FPP = 0.05
METADATA_KEY = b"history_pipeline"


class FileKind(enum.Enum):
    VERSIONS = "versions"  # row versions written by compaction (or merged from such files)
    SNAPSHOT = "snapshot"  # the newest version of each live key as of ``snapshot_as_of``
    SCHEMA_HISTORY = "schema_history"  # schema_history rows (and the commit's own record)


def supertable_schema(supercolumns: Sequence[Supercolumn]) -> pa.Schema:
    """Reserved columns first, then every supercolumn (always nullable)."""
    return _supertable_schema(tuple(supercolumns))


@functools.lru_cache(maxsize=1024)
def _supertable_schema(supercolumns: tuple[Supercolumn, ...]) -> pa.Schema:
    # every read and lookup asks for its table's schema: building it costs a lookup ~0.2 ms
    fields = [
        pa.field(KEY, pa.int64(), nullable=False),
        pa.field(DELETED, pa.bool_(), nullable=False),
        pa.field(LT, pa.int64(), nullable=False),
    ]
    fields += [pa.field(s.name, arrow_type(s.data_type), nullable=True) for s in supercolumns]
    return pa.schema(fields)


@dataclass(frozen=True)
class Version:
    """One supertable row: a full image (or a delete) of a key at a timestamp."""

    key: int
    t: int
    is_deleted: bool
    values: Mapping[str, Any]


def versions_to_arrow(versions: Iterable[Version], supercolumns: Sequence[Supercolumn]) -> pa.Table:
    """Arrow table of versions, sorted by (key, t)."""
    ordered = sorted(versions, key=lambda v: (v.key, v.t))
    columns: dict[str, list[Any]] = {
        KEY: [v.key for v in ordered],
        DELETED: [v.is_deleted for v in ordered],
        LT: [v.t for v in ordered],
    }
    for s in supercolumns:
        name = s.name
        if arrow_native(s.data_type):
            columns[name] = [v.values.get(name) for v in ordered]
        else:
            columns[name] = [to_arrow_value(s.data_type, v.values.get(name)) for v in ordered]
    schema = supertable_schema(supercolumns)
    return pa.table({name: pa.array(columns[name], type=schema.field(name).type) for name in schema.names}, schema)


@dataclass(frozen=True)
class FileMetadata:
    """What a file says about itself (enough to rebuild the catalog)."""

    database: str
    table_uuid: str | None
    kind: FileKind
    txn_id: int
    lower: int | None  # [lower, upper): the timestamp range the file covers
    upper: int | None
    segments: tuple[int, ...] = ()
    snapshot_as_of: int | None = None
    frontier: int | None = None
    replaces: tuple[str, ...] = ()
    earliest: int | None = None  # set by retention: answers exist only for as_of >= earliest
    attempt: str | None = None  # one compaction attempt's id: rebuild adopts the files of one attempt only
    #: S' when every row's ``superseded_at`` is its key's next version below S' (a closed interval)
    closed_until: int | None = None
    #: the row order of a closed file (``CLOSED_LAYOUT``; None: key-sorted, as marked before it)
    closed_layout: int | None = None
    #: a snapshot piece holding versions: the rows written in the interval before the snapshot and
    #: still current at it, stored nowhere else (see ``maintenance/snapshots.py``)
    holds_versions: bool = False

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "database": self.database,
                "table_uuid": self.table_uuid,
                "kind": self.kind.value,
                "txn_id": self.txn_id,
                "lower": self.lower,
                "upper": self.upper,
                "segments": list(self.segments),
                "snapshot_as_of": self.snapshot_as_of,
                "frontier": self.frontier,
                "replaces": list(self.replaces),
                "earliest": self.earliest,
                "attempt": self.attempt,
                **({"closed_until": self.closed_until} if self.closed_until is not None else {}),
                **({"closed_layout": self.closed_layout} if self.closed_layout is not None else {}),
                **({"holds_versions": True} if self.holds_versions else {}),
            }
        ).encode()

    @staticmethod
    def from_bytes(data: bytes) -> FileMetadata:
        obj = json.loads(data)
        return FileMetadata(
            database=obj["database"],
            table_uuid=obj["table_uuid"],
            kind=FileKind(obj["kind"]),
            txn_id=obj["txn_id"],
            lower=obj["lower"],
            upper=obj["upper"],
            segments=tuple(obj["segments"]),
            snapshot_as_of=obj["snapshot_as_of"],
            frontier=obj.get("frontier"),
            replaces=tuple(obj.get("replaces", ())),
            earliest=obj.get("earliest"),
            attempt=obj.get("attempt"),
            closed_until=obj.get("closed_until"),
            closed_layout=obj.get("closed_layout"),
            holds_versions=bool(obj.get("holds_versions", False)),
        )


def table_dir(database: str, table_uuid: str) -> str:
    return f"{database}/tables/{table_uuid}"


SCHEMA_HISTORY_SCHEMA = pa.schema(
    [
        pa.field("table_uuid", pa.string(), nullable=False),
        pa.field("table_name", pa.string(), nullable=False),
        pa.field("logical_timestamp", pa.int64(), nullable=False),
        pa.field("schema_descriptor", pa.json_(), nullable=True),
    ]
)


def schema_history_table(entries: Sequence[SchemaHistoryEntry]) -> pa.Table:
    """``_history_catalog.schema_history`` rows as Arrow."""
    return pa.table(
        {
            "table_uuid": [e.table_uuid for e in entries],
            "table_name": [e.table_name for e in entries],
            "logical_timestamp": [e.logical_timestamp for e in entries],
            "schema_descriptor": pa.array([e.descriptor_text() for e in entries], pa.json_()),
        },
        schema=SCHEMA_HISTORY_SCHEMA,
    )


@dataclass(frozen=True)
class WrittenFile:
    """A file just written and its statistics (the catalog makes its entry of them)."""

    path: str
    size_bytes: int
    row_count: int
    min_t: int | None
    max_t: int | None
    min_key: int | None
    max_key: int | None


#: columns written with DELTA_BINARY_PACKED instead of a dictionary: in a file sorted by (key, t)
#: the keys ascend (deltas of a few bits, where a dictionary stores every distinct key once more)
#: and a key's timestamps ascend; see docs/format.md (version files). ``superseded_at`` too: a
#: closed file's first row group (the sample deciding dictionaries) may hold only NULLs, and a
#: dictionary of the later row groups' nearly distinct times cost more than the column itself
DELTA_COLUMNS = (KEY, LT, SUPERSEDED)
#: a column gets a dictionary when its first row group holds at most this share of distinct values;
#: above it, indices plus a dictionary of nearly every value cost more than zstd over plain values
DICTIONARY_MAX_DISTINCT = 0.1


def writer_options(table: pa.Table) -> dict[str, Any]:
    """The Parquet writer settings of a supertable file (compaction on Arrow or Spark, snapshots,
    merge, retention, erasure all write through ``write_file``): zstd, small row groups with
    statistics, a dictionary for low-cardinality columns, the other integer columns (the reserved
    ones always) delta-encoded, the other floating-point columns split into byte streams."""
    schema = table.schema
    delta = [name for name in DELTA_COLUMNS
             if name in schema.names and schema.field(name).type in (pa.int64(), pa.int32())]
    sample = table.slice(0, ROW_GROUP_ROWS)
    dictionary = [
        path
        for field in schema
        if field.name not in delta and _few_distinct(sample.column(field.name))
        for path in _leaf_paths(field.name, field.type)
    ]
    # integers without a dictionary (dates, times, timestamps and decimals of up to 18 digits are
    # integers in Parquet too) are delta-encoded, as DuckDB writes them: smaller than plain values
    # under zstd, and DuckDB decodes them faster (a decimal column's scan: 4.9 -> 2.9 ms at 240k rows)
    delta += [field.name for field in schema
              if field.name not in delta and field.name not in dictionary and _integer_in_parquet(field.type)]
    # floating-point columns without a dictionary are split into byte streams: zstd then finds
    # the sign and exponent bytes alike and stores the mantissa bytes it cannot shrink raw, so
    # the column is smaller and decodes in half the time (1.4M random doubles: 7.53 -> 7.09 B a
    # value, 28 -> 13 ms to read, against plain values). Not where a value often repeats the
    # previous row's (a key's versions carrying a column an update did not change): whole
    # repeated values are what zstd finds in plain values, and split they cost more (+3 % at 10 %
    # of values repeated, +15 % at 20 %)
    split = [field.name for field in schema
             if field.name not in dictionary and (pa.types.is_float32(field.type) or pa.types.is_float64(field.type))
             and _seldom_repeated(sample.column(field.name))]
    encodings = {name: "DELTA_BINARY_PACKED" for name in delta} | {name: "BYTE_STREAM_SPLIT" for name in split}
    return {
        "compression": "zstd",
        "row_group_size": ROW_GROUP_ROWS,
        "write_statistics": True,
        "store_schema": True,
        "store_decimal_as_integer": True,
        "use_dictionary": dictionary,
        "column_encoding": encodings or None,
    }


#: a floating-point column is split into byte streams only when fewer of its values than this
#: share equal the previous row's (splitting costs bytes from about 7 % of values repeated)
SPLIT_MAX_REPEATS = 0.05


def _seldom_repeated(column: pa.ChunkedArray) -> bool:
    """Do fewer than ``SPLIT_MAX_REPEATS`` of the column's values equal the previous row's?"""
    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if len(values) < 2:
        return True
    repeats = pc.sum(pc.equal(values.slice(1), values.slice(0, len(values) - 1))).as_py() or 0
    return repeats < SPLIT_MAX_REPEATS * (len(values) - 1)


def _integer_in_parquet(kind: pa.DataType) -> bool:
    """Is an Arrow column of this type stored as Parquet INT32 or INT64 (``store_decimal_as_integer``)?"""
    if isinstance(kind, pa.BaseExtensionType):
        return False
    if pa.types.is_decimal(kind):
        return kind.precision <= 18
    return pa.types.is_integer(kind) or pa.types.is_date(kind) or pa.types.is_time(kind) \
        or pa.types.is_timestamp(kind) or pa.types.is_duration(kind)


def _few_distinct(column: pa.ChunkedArray) -> bool:
    """Worth a dictionary? (Extension columns are counted on their storage; nested and other
    columns keep one, as before.)"""
    if isinstance(column.type, pa.BaseExtensionType):
        column = pa.chunked_array([chunk.storage for chunk in column.chunks], column.type.storage_type)
    kind = column.type
    countable = (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
                 or pa.types.is_temporal(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)
                 or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                 or pa.types.is_fixed_size_binary(kind))
    if not countable or len(column) == 0:
        return True
    return pc.count_distinct(column, mode="all").as_py() <= DICTIONARY_MAX_DISTINCT * len(column)


def _leaf_paths(name: str, type_: pa.DataType) -> list[str]:
    """The Parquet column paths under an Arrow field (dictionary settings name leaves, not fields)."""
    if isinstance(type_, pa.BaseExtensionType):
        return _leaf_paths(name, type_.storage_type)
    if pa.types.is_struct(type_):
        return [p for i in range(type_.num_fields) for p in _leaf_paths(f"{name}.{type_.field(i).name}",
                                                                          type_.field(i).type)]
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        return _leaf_paths(f"{name}.list.element", type_.value_type)
    if pa.types.is_map(type_):
        return _leaf_paths(f"{name}.key_value.key", type_.key_type) + _leaf_paths(
            f"{name}.key_value.value", type_.item_type)
    return [name]


def parquet_bytes(table: pa.Table, row_groups: Sequence[int] | None = None, page_bytes: int | None = None,
                  key_bloom: bool = False) -> bytes:
    """``table`` as a supertable Parquet file (``writer_options``), schema metadata kept; with
    ``row_groups``, exactly row groups of those sizes (they sum to the table's rows); with
    ``page_bytes``, data pages of about that size (else the writer's 1 MiB); with ``key_bloom``,
    a Bloom filter on the key column per row group (``supertable.bloom``)."""
    buffer = io.BytesIO()
    options = writer_options(table)
    if page_bytes:
        options["data_page_size"] = page_bytes
    if key_bloom and KEY in table.column_names:
        # sized for the largest row group's keys, so every filter holds its rows at ``KEY_BLOOM_FPP``
        ndv = max(row_groups) if row_groups else min(ROW_GROUP_ROWS, table.num_rows)
        options["bloom_filter_options"] = {KEY: {"ndv": max(ndv, 1), "fpp": KEY_BLOOM_FPP}}
    if row_groups is None:
        pq.write_table(table, buffer, **options)
        return buffer.getvalue()
    if sum(row_groups) != table.num_rows:
        raise ValueError(f"row groups of {sum(row_groups)} rows for a table of {table.num_rows}")
    options.pop("row_group_size")
    with pq.ParquetWriter(buffer, table.schema, **options) as writer:
        offset = 0
        for rows in row_groups:
            writer.write_table(table.slice(offset, rows), row_group_size=max(rows, 1))
            offset += rows
    return buffer.getvalue()


#: cells by t of a snapshot piece holding versions: inside their own interval its rows are read by
#: t (most are superseded only in the next interval), in the next one by ``superseded_at``; as many
#: as the version files' (4 before layout 4)
HOLDING_TIME_BUCKETS = CLOSED_TIME_BUCKETS


def layout_of(table: pa.Table, snapshot_as_of: int | None, holds_versions: bool) -> tuple[pa.Table, tuple[int, ...]]:
    """``closed_layout`` for a marked file of this kind: a snapshot's rows are one key-sorted run
    of never-superseded rows, a piece holding versions is cut by t as well."""
    if holds_versions:
        return closed_layout(table, None, time_buckets=HOLDING_TIME_BUCKETS)
    return closed_layout(table, snapshot_as_of)


def closed_layout(table: pa.Table, lower: int | None, row_group_rows: int | None = None,
                  buckets: int | None = None, time_buckets: int | None = None) -> tuple[pa.Table, tuple[int, ...]]:
    """The rows of a closed interval's file (holding ``superseded_at``) ordered so that a read as
    of any T in the interval skips the row groups holding no row current at T, and their row
    group sizes.

    A row is current at T when ``t < T`` and (``superseded_at`` is NULL or ``>= T``). Two classes:
    rows never superseded in the interval, ordered by ``max(t, lower)`` (``lower``: the snapshot's
    t for a snapshot file, whose rows are then all one key-sorted run, current at every T), and
    superseded rows, ordered by ``superseded_at``. Each class is cut into about ``buckets`` buckets
    of whole row groups; a superseded row's bucket is cut again into about ``time_buckets`` cells
    by ``t`` (in a long interval most rows superseded after T were also written after it). Each
    bucket or cell is key-sorted, so a row group's statistics bound its rows' t, ``superseded_at``
    and keys: a read as of T skips row groups with ``min(t) >= T`` or ``max(superseded_at) < T``,
    a key lookup reads one row group per cell at most. The versions of hot keys
    (``hot_keys_mask``), which would be in every bucket, come last in a run per class in (key, t)
    order: their history is a row group or two, and a read as of T decodes at most half a bucket
    more."""
    row_group_rows = row_group_rows or ROW_GROUP_ROWS
    buckets = buckets or CLOSED_BUCKETS
    time_buckets = time_buckets or CLOSED_TIME_BUCKETS
    hot = hot_keys_mask(table.column(KEY).to_numpy(), buckets)
    if hot is None:
        return _time_cut(table, lower, row_group_rows, buckets, time_buckets)
    # the versions of the keys written most often in the interval: a key-sorted run per class after
    # the time-cut classes, so a key's history reads a row group or two of them, not one per bucket;
    # a row group still holds one class, so a read current at the marks of rows never superseded
    # need not read ``superseded_at`` (``catalog.files.superseded_settled``)
    rest, groups = _time_cut(table.filter(pa.array(~hot)), lower, row_group_rows, buckets, time_buckets)
    hot_rows = table.filter(pa.array(hot))
    superseded = hot_rows.column(SUPERSEDED).is_valid().to_numpy(zero_copy_only=False)
    hot_rows = hot_rows.take(pa.array(np.lexsort((hot_rows.column(LT).to_numpy(), hot_rows.column(KEY).to_numpy(),
                                                  superseded))))
    hot_groups = [*_even_parts(int((~superseded).sum()), row_group_rows),
                  *_even_parts(int(superseded.sum()), row_group_rows)]
    return pa.concat_tables([rest, hot_rows]), (*groups, *hot_groups)


def _time_cut(table: pa.Table, lower: int | None, row_group_rows: int, buckets: int,
              time_buckets: int) -> tuple[pa.Table, tuple[int, ...]]:
    """``closed_layout``'s two classes cut by time, bucket and cell (no hot run)."""
    n = table.num_rows
    if n == 0:
        return table, ()
    keys, times = table.column(KEY).to_numpy(), table.column(LT).to_numpy()
    superseded = table.column(SUPERSEDED)
    klass = superseded.is_valid().to_numpy(zero_copy_only=False).astype(np.int8)  # 1: superseded here
    start = times if lower is None else np.maximum(times, lower)
    order_by = np.where(klass == 1, pc.fill_null(superseded, 0).to_numpy(), start)
    by_time = np.lexsort((times, keys, order_by, klass))
    ordered_times = times[by_time]
    opened = n - int(klass.sum())
    # rank within the class (positions in ``by_time``), then its bucket: rows of equal value may
    # fall into two buckets, which costs nothing (a bucket's bounds come from its rows)
    width = _bucket_rows(opened, row_group_rows, buckets), _bucket_rows(n - opened, row_group_rows, buckets)
    bucket = np.concatenate([np.arange(opened) // width[0], np.arange(n - opened) // width[1]])
    cell = np.zeros(n, dtype=np.int64)
    if n > opened:
        # a superseded_at bucket of ``width[1]`` ranks starts at its number times that width once
        # its rows are ordered by (bucket, t)
        superseded_bucket = bucket[opened:]
        by_t = np.lexsort((ordered_times[opened:], superseded_bucket))
        in_bucket = np.arange(n - opened) - superseded_bucket[by_t] * width[1]
        cell[opened + by_t] = in_bucket // _bucket_rows(width[1], row_group_rows, time_buckets)
    ordered_class = klass[by_time]
    second = np.lexsort((ordered_times, keys[by_time], cell, bucket, ordered_class))
    rows = table.take(pa.array(by_time[second]))
    # every (class, bucket, cell) run is cut into whole row groups
    runs = (ordered_class[second], bucket[second], cell[second])
    changes = np.flatnonzero(np.any([r[1:] != r[:-1] for r in runs], axis=0)) + 1
    bounds = [0, *changes.tolist(), n]
    groups: list[int] = []
    for begin, end in zip(bounds[:-1], bounds[1:], strict=True):
        groups += _even_parts(end - begin, row_group_rows)
    return rows, tuple(groups)


def hot_keys_mask(keys: np.ndarray, buckets: int) -> np.ndarray | None:
    """Which rows belong to a hot key (None: none do): a key with at least ``buckets`` versions
    (spread over most buckets of a time-cut file), the most-written first, while their rows stay
    within half a bucket (what a read as of T decodes beyond the answer grows by at most that)."""
    n = len(keys)
    budget = n // (2 * buckets)
    if budget < buckets:
        return None
    distinct, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    many = np.flatnonzero(counts >= buckets)
    if len(many) == 0:
        return None
    many = many[np.argsort(-counts[many], kind="stable")]
    taken = many[np.cumsum(counts[many]) <= budget]
    if len(taken) == 0:
        return None
    chosen = np.zeros(len(distinct), dtype=bool)
    chosen[taken] = True
    return chosen[inverse]


def _bucket_rows(rows: int, row_group_rows: int, buckets: int) -> int:
    """Rows per bucket to cut ``rows`` into about ``buckets`` of whole row groups."""
    return row_group_rows * max(1, -(-rows // (row_group_rows * buckets)))


def _even_parts(rows: int, most: int) -> list[int]:
    """``rows`` cut into the fewest parts of at most ``most`` rows, of nearly equal sizes."""
    parts = -(-rows // most)
    return [rows // parts + (1 if i < rows % parts else 0) for i in range(parts)]


def time_cut(meta: FileMetadata, superseded_rows: bool = False) -> bool:
    """Are some of the file's row groups cut by time rather than by key (a closed interval's
    version file, a snapshot piece holding versions, a snapshot piece with ``superseded_rows``,
    which ``closed_layout`` buckets by ``superseded_at``)? Their key statistics then rule out few
    keys, so the file carries a Bloom filter on the key (a snapshot piece none of whose rows is
    superseded is one key-sorted run: its statistics do the work)."""
    return bool(meta.closed_layout) and (meta.kind is FileKind.VERSIONS or meta.holds_versions or superseded_rows)


def write_file(store: ObjectStore, path: str, table: pa.Table, meta: FileMetadata,
               row_groups: Sequence[int] | None = None) -> WrittenFile:
    """Write ``table`` to ``path`` with ``meta`` in its footer (with ``row_groups``: row groups of
    exactly those sizes); return its statistics."""
    schema = table.schema.with_metadata({**(table.schema.metadata or {}), METADATA_KEY: meta.to_bytes()})
    table = table.replace_schema_metadata(schema.metadata)
    data = parquet_bytes(table, row_groups, CLOSED_PAGE_BYTES if meta.closed_layout else None,
                         key_bloom=time_cut(meta, _any_superseded(table)))
    store.put(path, data)
    return WrittenFile(
        path=path,
        size_bytes=len(data),
        row_count=table.num_rows,
        min_t=_stat(table, LT, "min"),
        max_t=_stat(table, LT, "max"),
        min_key=_stat(table, KEY, "min"),
        max_key=_stat(table, KEY, "max"),
    )


def _any_superseded(table: pa.Table) -> bool:
    return SUPERSEDED in table.column_names and table.column(SUPERSEDED).null_count < table.num_rows


def _stat(table: pa.Table, column: str, which: str) -> int | None:
    if column not in table.column_names or table.num_rows == 0:
        return None
    value = pc.min_max(table.column(column))[which].as_py()
    return int(value) if value is not None else None


def new_file_path(database: str, table_uuid: str, kind: FileKind, txn_hint: int) -> str:
    """A fresh, never-reused object path for a table's file."""
    return f"{table_dir(database, table_uuid)}/{kind.value}-{txn_hint:010d}-{uuid.uuid4().hex[:12]}.parquet"


def column_chunks(meta: pq.FileMetaData) -> dict[str, int]:
    """Each leaf column's index among a row group's column chunks, by its Parquet path (a top-level
    primitive column's path is its name): a nested column (an array, an interval) has several
    leaf chunks, so a column's index among the Arrow fields may name another column's statistics."""
    schema = meta.schema
    return {schema.column(i).path: i for i in range(meta.num_columns)}


def read_file_metadata(store: ObjectStore, path: str) -> tuple[FileMetadata | None, pq.FileMetaData]:
    """The history_pipeline metadata and Parquet footer of a stored file."""
    fs, _ = store.arrow_filesystem()
    with fs.open_input_file(store.full_path(path)) as f:
        footer = pq.ParquetFile(f).metadata
    raw = (footer.metadata or {}).get(METADATA_KEY)
    return (FileMetadata.from_bytes(raw) if raw else None), footer


def write_file_parts(store: ObjectStore, path: str, parts: Iterable[pa.Table], schema: pa.Schema,
                     meta: FileMetadata) -> WrittenFile:
    """Write ``parts`` (tables of ``schema``, in order) to ``path`` as one supertable file with
    ``meta`` in its footer, one part at a time: only the compressed file and one part are held.
    The writer's settings come from the first non-empty part (as ``write_file``'s from its table)."""
    schema = schema.with_metadata({**(schema.metadata or {}), METADATA_KEY: meta.to_bytes()})
    buffer = io.BytesIO()
    writer: pq.ParquetWriter | None = None
    rows, low_t, high_t, low_key, high_key = 0, None, None, None, None
    for part in parts:
        if part.num_rows == 0:
            continue
        part = part.replace_schema_metadata(schema.metadata)
        if writer is None:
            options = writer_options(part)
            row_group_rows = options.pop("row_group_size")
            writer = pq.ParquetWriter(buffer, schema, **options)
        writer.write_table(part, row_group_size=row_group_rows)
        rows += part.num_rows
        low_t, high_t = _least(low_t, _stat(part, LT, "min")), _most(high_t, _stat(part, LT, "max"))
        low_key, high_key = _least(low_key, _stat(part, KEY, "min")), _most(high_key, _stat(part, KEY, "max"))
    if writer is None:
        data = parquet_bytes(schema.empty_table())
    else:
        writer.close()
        data = buffer.getvalue()
    store.put(path, data)
    return WrittenFile(path=path, size_bytes=len(data), row_count=rows, min_t=low_t, max_t=high_t,
                       min_key=low_key, max_key=high_key)


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)
