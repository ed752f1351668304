"""Supertable files as written (encodings chosen per column) and one key read back across many files."""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from history_pipeline.io.store import LocalStore
from history_pipeline.supertable import (
    DELETED,
    KEY,
    LT,
    ROW_GROUP_ROWS,
    SUPERSEDED,
    FileKind,
    FileMetadata,
    write_file,
)
from history_pipeline.supertable.read import footer, read_key, reads_key_first
from history_pipeline.types import INTERVAL_ARROW


def _meta(i: int) -> FileMetadata:
    return FileMetadata("db", "t", FileKind.VERSIONS, i, 0, 10**9)


def _versions(rng: random.Random, keys: list[int], t0: int, with_note: bool) -> pa.Table:
    keys = sorted(keys)
    columns = {
        KEY: pa.array(keys, pa.int64()),
        DELETED: pa.array([rng.random() < 0.1 for _ in keys]),
        LT: pa.array([t0 + rng.randrange(10**6) for _ in keys], pa.int64()),
        "qty-1": pa.array([rng.randrange(10**9) for _ in keys], pa.int64()),  # nearly all distinct
        "mode-2": pa.array([rng.choice(["MAIL", "SHIP", None]) for _ in keys]),  # three values
    }
    if with_note:  # a supercolumn added later: older files do not have it
        columns["note-3"] = pa.array([rng.choice(["a", "bb", None]) for _ in keys])
    table = pa.table(columns)
    return table.sort_by([(KEY, "ascending"), (LT, "ascending")])


def test_written_files_read_back_equal_with_the_encodings_chosen_per_column(tmp_path):
    store = LocalStore(tmp_path)
    rng = random.Random(5)
    table = _versions(rng, [rng.randrange(50_000) for _ in range(3 * ROW_GROUP_ROWS)], 1, True)
    written = write_file(store, "db/tables/t/v.parquet", table, _meta(1))
    back = pq.read_table(store.full_path(written.path))
    assert back.select(table.column_names).equals(table)
    meta = pq.read_metadata(store.full_path(written.path))
    encodings = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i).encodings
                 for i in range(meta.num_columns)}
    assert "DELTA_BINARY_PACKED" in encodings[KEY] and "DELTA_BINARY_PACKED" in encodings[LT]
    assert "RLE_DICTIONARY" in encodings["mode-2"]  # few distinct values: a dictionary
    assert "RLE_DICTIONARY" not in encodings["qty-1"]  # nearly all distinct: no dictionary...
    assert "DELTA_BINARY_PACKED" in encodings["qty-1"]  # ...but deltas, as DuckDB writes integers
    assert meta.num_row_groups == 3


def test_integer_like_columns_are_delta_encoded_and_read_back_equal(tmp_path):
    """Dates, timestamps and decimals of up to 18 digits are Parquet integers: without a dictionary
    they are delta-encoded (a decimal stored as INT64); wider decimals and doubles are not."""
    rng = random.Random(3)
    n = 2 * ROW_GROUP_ROWS
    keys = sorted(rng.sample(range(10**7), n))
    table = pa.table({
        KEY: pa.array(keys, pa.int64()),
        DELETED: pa.array([False] * n),
        LT: pa.array(range(n), pa.int64()),
        "price-1": pa.array([Decimal(rng.randrange(10**9)) / 100 for _ in keys], pa.decimal128(15, 2)),
        "wide-2": pa.array([Decimal(rng.randrange(10**30)) / 100 for _ in keys], pa.decimal128(38, 2)),
        "day-3": pa.array([dt.date(1990, 1, 1) + dt.timedelta(days=rng.randrange(20_000)) for _ in keys]),
        "at-4": pa.array([rng.randrange(10**15) for _ in keys], pa.timestamp("us", tz="UTC")),
        "ratio-5": pa.array([rng.random() for _ in keys], pa.float64()),
        "kind-6": pa.array([Decimal(rng.randrange(3)) for _ in keys], pa.decimal128(10, 0)),  # 3 values
        "weight-7": pa.array([rng.random() * 1e3 if rng.random() < 0.9 else None for _ in keys], pa.float32()),
        "grade-8": pa.array([rng.choice([0.5, 1.5, 2.5]) for _ in keys], pa.float64()),  # 3 values
        # a value kept across a key's versions (updates that leave the column alone): plain values
        "kept-9": pa.array([float(k // 3) + 0.1 for k in range(n)], pa.float64()),
    })
    store = LocalStore(tmp_path)
    written = write_file(store, "db/tables/t/v.parquet", table, _meta(1))
    assert pq.read_table(store.full_path(written.path)).select(table.column_names).equals(table)
    column = pq.read_metadata(store.full_path(written.path)).row_group(0).column
    chunks = {column(i).path_in_schema: column(i) for i in range(table.num_columns)}
    for name in ("price-1", "day-3", "at-4"):
        assert "DELTA_BINARY_PACKED" in chunks[name].encodings, name
    assert chunks["price-1"].physical_type == "INT64"
    assert chunks["wide-2"].physical_type == "FIXED_LEN_BYTE_ARRAY"
    assert "DELTA_BINARY_PACKED" not in chunks["wide-2"].encodings + chunks["ratio-5"].encodings
    assert "RLE_DICTIONARY" in chunks["kind-6"].encodings  # few values: still a dictionary
    # floating-point values are split into byte streams, unless they are few (a dictionary)
    assert "BYTE_STREAM_SPLIT" in chunks["ratio-5"].encodings and "BYTE_STREAM_SPLIT" in chunks["weight-7"].encodings
    assert "RLE_DICTIONARY" in chunks["grade-8"].encodings and "BYTE_STREAM_SPLIT" not in chunks["grade-8"].encodings
    assert "RLE_DICTIONARY" not in chunks["kept-9"].encodings and "BYTE_STREAM_SPLIT" not in chunks["kept-9"].encodings
    # and DuckDB, which reads the files for SQL and histories, reads them back equal
    back = duckdb.sql(f"SELECT * FROM read_parquet('{store.full_path(written.path)}')").to_arrow_table()
    assert back.column("ratio-5").equals(table.column("ratio-5"))
    assert back.column("weight-7").equals(table.column("weight-7"))


@pytest.mark.parametrize("key_span", [3_000, 300_000])  # dense: read whole at once; sparse: key column first
def test_read_key_across_many_files_equals_filtering_every_row(tmp_path, monkeypatch, key_span):
    store = LocalStore(tmp_path)
    rng = random.Random(9)
    files, tables = [], []
    key_only_reads = []
    original = pq.ParquetFile.read_row_groups

    def spy(self, groups, columns=None, **kwargs):
        key_only_reads.append(columns == [KEY])
        return original(self, groups, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    for i in range(12):
        keys = [rng.randrange(key_span) for _ in range(4_000)] + [7] * rng.randrange(0, 40)
        table = _versions(rng, keys, i * 10**6, with_note=i >= 6)
        tables.append(table)
        files.append(write_file(store, f"db/tables/t/v{i}.parquet", table, _meta(i)))
    schema = tables[-1].schema
    wanted = [KEY, LT, DELETED, "qty-1", "note-3"]
    for key, lower, upper in ((7, None, 2**63 - 1), (7, 3 * 10**6, 9 * 10**6), (1234, None, 2**63 - 1),
                              (10**6, None, 2**63 - 1)):
        got = read_key(store, files, schema, wanted, key, lower, upper)
        expected = [
            {c: row.get(c) for c in wanted}
            for table in tables
            for row in table.to_pylist()
            if row[KEY] == key and (lower is None or row[LT] >= lower) and row[LT] < upper
        ]
        assert got.schema.names == wanted
        assert sorted(got.to_pylist(), key=lambda r: r[LT]) == sorted(expected, key=lambda r: r[LT])
    assert read_key(store, files, schema, wanted, 10**6, None, 2**63 - 1).num_rows == 0
    # the path taken follows the files' key density
    assert any(key_only_reads) is (key_span > 4_000)


def test_a_lookup_reads_the_key_column_first_where_row_groups_likely_lack_the_key():
    dense, rows = (0, ROW_GROUP_ROWS - 1), ROW_GROUP_ROWS
    assert not reads_key_first([(dense, rows)])  # a key-sorted piece holding its whole range
    assert not reads_key_first([(None, rows)])  # no statistics: assume it holds the key
    assert reads_key_first([((0, 3 * rows), rows)])  # a snapshot piece holding a third of its range
    assert reads_key_first([((0, 10**6), rows)] * 8)  # an interval's time buckets, each spanning it all
    assert not reads_key_first([((0, 10), 500)])  # many versions a key: every row group holds it


def test_a_footer_takes_each_reserved_column_s_statistics_from_its_own_chunks(tmp_path):
    """Nested supercolumns (an array, an interval) store several leaf column chunks each, so
    ``superseded_at``, written after them, is not the chunk at its Arrow field index: the footer
    (and ``verify``'s ranges) find chunks by their Parquet path. Regression: a closed read of a
    table with an array column compared another column's statistics with T (a TypeError where
    they were bytes, a silently wrong skip where they were integers)."""
    store = LocalStore(tmp_path)
    rng = random.Random(3)
    n = 2 * ROW_GROUP_ROWS
    keys = sorted(rng.randrange(10**6) for _ in range(n))
    table = pa.table({
        KEY: pa.array(keys, pa.int64()),
        DELETED: pa.array([False] * n),
        LT: pa.array([10 + i for i in range(n)], pa.int64()),
        "tags-1": pa.array([[rng.randrange(10**9), None] for _ in keys], pa.list_(pa.int64())),
        "span-1": pa.array([{"months": 1, "days": 2, "micros": 3 * i} for i in range(n)], INTERVAL_ARROW),
        "n-1": pa.array([rng.randrange(10**9) for _ in keys], pa.int64()),  # an integer where the index points
        "mode-1": pa.array([rng.choice(["MAIL", "SHIP"]) for _ in keys]),  # a string stored with a dictionary
        SUPERSEDED: pa.array([None if i % 3 else 10**6 + i for i in range(n)], pa.int64()),
    })
    written = write_file(store, "db/tables/t/v.parquet", table, _meta(1))
    cached = footer(store, written.path)
    assert pq.read_metadata(store.full_path(written.path)).num_columns > table.num_columns  # nested leaves
    assert cached.dictionary_strings == {"mode-1"}  # read as a dictionary though behind nested columns
    for rg, times in enumerate(cached.times):
        part = table.slice(rg * ROW_GROUP_ROWS, ROW_GROUP_ROWS)
        assert times.max_superseded == pc.max(part.column(SUPERSEDED)).as_py()
        assert times.superseded_nulls == part.column(SUPERSEDED).null_count
        assert (times.min_t, times.max_t) == (pc.min(part.column(LT)).as_py(), pc.max(part.column(LT)).as_py())
        assert cached.key_ranges[rg] == (part.column(KEY)[0].as_py(), part.column(KEY)[-1].as_py())
