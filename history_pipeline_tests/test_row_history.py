"""row_history on a local root reads a key's versions through DuckDB (``query/scan.key_versions``: the
key filter inside the scan), on an object store and for types DuckDB hands back otherwise through
pyarrow (``supertable/read.read_key``). Both reads are compared with each other and with the model
for every key: files of two schemas (a column added), deletes and re-inserts, closed intervals in the
time-bucket layout, random histories of every type and schema change."""

from __future__ import annotations

import random

import pytest

from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.catalog.model import FileKind
from history_pipeline.query.sandbox import reader_cursor
from history_pipeline.query.scan import key_versions
from history_pipeline.supertable import LT, supertable_schema
from history_pipeline.supertable.read import read_key
from history_pipeline_tests.model import BaseDatabase
from history_pipeline_tests.test_compaction import _split, random_history, write
from history_pipeline_tests.test_reconstruction import expected_history

SMALL_SNAPSHOTS = StoreSettings(snapshot_min_versions=6, snapshot_ratio=0.5)


def _both_reads(store, uuid, key):
    """(DuckDB's read or None, pyarrow's read) of one key's versions, in timestamp order."""
    context = store.query_context()
    files = context.state.versions_of(uuid)  # with the snapshot pieces holding versions
    schema = supertable_schema(context.supercolumns(uuid))
    con = reader_cursor()
    try:
        duck = key_versions(con, store.objects, files, schema, key)
    finally:
        con.close()
    arrow = read_key(store.objects, files, schema, schema.names, key, None, 2**63 - 1)
    return (None if duck is None else duck.sort_by([(LT, "ascending")])), arrow.sort_by([(LT, "ascending")])


def _items_history(store):
    """Three columns, then a fourth added; updates, deletes and re-inserts over several segments,
    with snapshots (so intervals close in the time-bucket layout)."""
    rng = random.Random(5)
    create = {"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "items",
              "columns": [{"column_uuid": "q", "column_name": "qty", "data_type": "BIGINT"},
                          {"column_uuid": "p", "column_name": "price", "data_type": "DOUBLE PRECISION"},
                          {"column_uuid": "n", "column_name": "name", "data_type": "TEXT"}]}
    events, alive, t = [create], set(), 1
    for segment in range(8):
        batch = []
        if segment == 4:
            t += 1
            batch.append({"op": "add_column", "t": t, "table_uuid": "T",
                          "column": {"column_uuid": "f", "column_name": "flag", "data_type": "BOOLEAN"}})
        for _ in range(30):
            t += 1
            key = rng.randrange(25)
            values = {"q": rng.randrange(100), "p": rng.random(), "n": f"n{rng.randrange(5)}"}
            if segment >= 4:
                values["f"] = rng.random() < 0.5
            if key not in alive:
                batch.append({"op": "insert", "t": t, "table_uuid": "T", "key": key, "values": values})
                alive.add(key)
            elif rng.random() < 0.15:
                batch.append({"op": "delete", "t": t, "table_uuid": "T", "key": key})
                alive.discard(key)
            else:
                batch.append({"op": "update", "t": t, "table_uuid": "T", "key": key, "values": values})
        events += batch
        write(store, ([create] if segment == 0 else []) + batch)
        store.compact(spark=False)
    return events


@pytest.mark.slow
@pytest.mark.parametrize("root", ["local", "s3"])
def test_row_history_by_duckdb_equals_the_arrow_read_and_the_model_for_every_key(tmp_path, request, root):
    if root == "local":
        store = HistoryStore.open(tmp_path / "root", database="db", settings=SMALL_SNAPSHOTS)
    else:
        store = HistoryStore.open(request.getfixturevalue("s3_bucket"), database="db", wal_dir=tmp_path / "wal",
                                  s3=request.getfixturevalue("s3_options"), settings=SMALL_SNAPSHOTS)
    events = _items_history(store)
    state = store.catalog_state()
    versions = state.files_of("T", FileKind.VERSIONS)
    assert any(f.closed_until is not None for f in versions)  # closed files in the bucket layout are read
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    context = store.query_context()
    for key in range(26):  # 25 never written: no version at all
        expected = expected_history(model, events, "T", key, store.frontier)
        assert context.row_history("items", key) == expected, key
        duck, arrow = _both_reads(store, "T", key)
        assert arrow.num_rows == len(expected)
        if root == "local":
            assert duck is not None and duck.equals(arrow), key  # the DuckDB path is taken, and agrees
        else:
            assert duck is None  # no DuckDB reader for object stores: pyarrow reads them


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 8])
def test_row_history_of_every_type_and_schema_change_equals_the_model(tmp_path, seed):
    """Types DuckDB hands back as other Arrow types fall back to pyarrow; either way the answer is
    the model's, and where DuckDB answers it equals pyarrow's read."""
    events = random_history(seed, n_events=120)
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    for batch in _split(events, random.Random(seed)):
        write(store, batch)
        store.compact(spark=False)
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    context = store.query_context()
    touched = sorted({(e["table_uuid"], e["key"]) for e in events if "key" in e})
    assert touched
    for uuid, key in touched:
        assert context.row_history(uuid, key) == expected_history(model, events, uuid, key, store.frontier)
        duck, arrow = _both_reads(store, uuid, key)
        assert duck is None or duck.equals(arrow), (uuid, key)
