"""Supertable files as written (encodings chosen per column) and one key read back across many files."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq

from history_pipeline.io.store import LocalStore
from history_pipeline.supertable import DELETED, KEY, LT, ROW_GROUP_ROWS, FileKind, FileMetadata, write_file
from history_pipeline.supertable.read import read_key


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
    assert "RLE_DICTIONARY" not in encodings["qty-1"]  # nearly all distinct: plain, zstd
    assert meta.num_row_groups == 3


def test_read_key_across_many_files_equals_filtering_every_row(tmp_path):
    store = LocalStore(tmp_path)
    rng = random.Random(9)
    files, tables = [], []
    for i in range(12):
        keys = [rng.randrange(3_000) for _ in range(4_000)] + [7] * rng.randrange(0, 40)
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
