"""The DataFrame compaction against the per-event reference path, on values of every contract type
(they travel through Spark in carrier types and come back exact), across segment boundaries
(prior images read on executors) and through type changes and defaults (backfills, snapshots)."""

from __future__ import annotations

from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.catalog.model import FileKind
from history_pipeline_tests.spark_scenario import answers
from history_pipeline_tests.test_compaction import write
from history_pipeline_tests.test_postgres_oracle import TYPED

#: the DataFrame compaction engine, on the session given to compact()
FRAMES = StoreSettings(spark_master=None, compaction_engine="dataframes")


def _both(tmp_path, spark, *batches):
    """The same segments compacted on Spark (DataFrame path) and in-process (reference)."""
    stores = []
    for name, session in (("frames", spark), ("reference", False)):
        store = HistoryStore.open(tmp_path / name, database="db", settings=FRAMES)
        write(store, *batches)
        store.compact(spark=session)
        stores.append(store)
    return stores


def test_every_type_survives_the_dataframe_path(tmp_path, spark):
    create = {"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "typed",
              "columns": [{"column_uuid": c, "column_name": c, "data_type": ty} for c, ty, _ in TYPED]}
    first = [create] + [
        {"op": "insert", "t": 2, "table_uuid": "T", "key": key, "values": {c: v[key] for c, _, v in TYPED}}
        for key in (0, 1)
    ]
    second = [  # a later segment: the prior image of key 1 is read back from Parquet on executors
        {"op": "update", "t": 3, "table_uuid": "T", "key": 1, "values": {c: v[0] for c, _, v in TYPED[::2]}},
        {"op": "insert", "t": 4, "table_uuid": "T", "key": 2, "values": {}},
        {"op": "update", "t": 5, "table_uuid": "T", "key": 0, "values": {"i": None}},
    ]
    frames, reference = _both(tmp_path, spark, first, second)
    assert frames.segments() and all(s.state.value == "applied" for s in frames.segments())
    got = answers(frames)
    assert got == answers(reference)
    assert len(got["6"]["typed"]) == 3 and got["6"]["typed"][0]["i"] == "None"  # an explicit NULL is kept


def test_type_changes_and_defaults_backfill_on_executors(tmp_path, spark):
    cols = [{"column_uuid": "a", "column_name": "a", "data_type": "NUMERIC(8,2)"},
            {"column_uuid": "b", "column_name": "b", "data_type": "INTEGER"}]
    first = [{"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "t", "columns": cols}] + [
        {"op": "insert", "t": 2, "table_uuid": "T", "key": k, "values": {"a": f"{k}.25", "b": k}} for k in range(5)
    ]
    second = [
        {"op": "delete", "t": 3, "table_uuid": "T", "key": 4},
        {"op": "change_column_type", "t": 4, "table_uuid": "T", "column_uuid": "a", "data_type": "TEXT"},
        {"op": "update", "t": 5, "table_uuid": "T", "key": 0, "values": {"b": 50}},
        {"op": "add_column", "t": 6, "table_uuid": "T",
         "column": {"column_uuid": "c", "column_name": "c", "data_type": "UUID"},
         "default": "0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01"},
        {"op": "change_column_type", "t": 7, "table_uuid": "T", "column_uuid": "b", "data_type": "TEXT"},
        {"op": "change_column_type", "t": 8, "table_uuid": "T", "column_uuid": "b", "data_type": "BIGINT"},
        {"op": "insert", "t": 9, "table_uuid": "T", "key": 9, "values": {"a": "x"}},
        {"op": "update", "t": 9, "table_uuid": "T", "key": 1, "values": {"a": "y"}},
    ]
    frames, reference = _both(tmp_path, spark, first, second)
    assert answers(frames) == answers(reference)
    snapshots = frames.catalog_state().files_of("T", FileKind.SNAPSHOT)
    assert sorted(f.snapshot_as_of for f in snapshots) == [5, 7, 8, 9]  # one per backfill
    row = frames.fetch_row("t", 9, 10)
    assert row["a"] == "x" and str(row["c"]) == "0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01" and row["b"] is None


def test_seal_is_verified_streaming_before_spark_reads_the_segment(tmp_path, spark):
    import pytest

    from history_pipeline import SegmentQuarantinedError
    from history_pipeline.wal import SegmentState
    from history_pipeline_tests.test_compaction import rfc_events

    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    write(store, rfc_events()[:3], rfc_events()[3:])
    second = store.segments(SegmentState.SEALED)[1]
    data = bytearray(second.path.read_bytes())
    data[data.index(b"value2_prime")] ^= 0x01
    second.path.write_bytes(bytes(data))
    with pytest.raises(SegmentQuarantinedError, match="checksum"):
        store.compact(spark=spark)
    assert store.frontier == 3
    assert [s.segment_id for s in store.segments(SegmentState.QUARANTINED)] == [2]
