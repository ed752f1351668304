"""Merge, retention, cleanup, exports and the cold tier: answers at every T >= t_purge never change."""

from __future__ import annotations

import random
import time

import pytest

from history_pipeline import HistoryStore, PurgedTimestampError
from history_pipeline.catalog.upkeep import collect_garbage
from history_pipeline.io.store import open_store
from history_pipeline.maintenance.export import list_exports, load_export
from history_pipeline_tests.test_compaction import _split, random_history, write

T1 = "tbl"


def all_answers(store, lowest=0):
    """Every table as of every answerable T, keyed by (T, table name)."""
    out = {}
    for as_of in range(max(lowest, store.earliest), store.frontier + 2):
        for descriptor in store.get_catalog(as_of):
            table = store.load_table(descriptor.table_name, as_of, ordered=True)
            out[(as_of, descriptor.table_name)] = table.to_pylist()
    return out


def compacted_random_store(path, seed, spark=None):
    """A random history compacted on ``spark`` (None: the store's default session, False: in-process)."""
    events = random_history(seed, n_events=70)
    store = HistoryStore.open(path, database="db")
    write(store, *_split(events, random.Random(seed)))
    store.compact(spark=spark)
    return store


# Merge, retention and cleanup over random histories run in-process: the same tasks run on Spark
# in test_merge_and_retention_on_spark, which checks every answer after each of them.
@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 17, 29, 101])
def test_merge_and_retention_keep_every_answer_at_or_after_the_purge_point(tmp_path, seed):
    store = compacted_random_store(tmp_path / "db", seed, spark=False)
    before = all_answers(store)
    merged = store.merge(spark=False, small_file_bytes=10**9)
    assert merged.files_removed >= merged.files_added
    assert all_answers(store) == before
    t_purge = store.frontier // 2
    store.retain(purge_before=t_purge, spark=False)
    assert store.earliest == t_purge
    after = all_answers(store)
    assert after == {k: v for k, v in before.items() if k[0] >= t_purge}
    if t_purge > 0:
        with pytest.raises(PurgedTimestampError, match=f"earliest answerable as_of is {t_purge}"):
            store.load_table(next(iter(after))[1], t_purge - 1)
    assert [e.logical_timestamp for e in store.catalog_state().schema_history][:1] == [1]  # kept
    assert store.verify() == []


@pytest.mark.slow
def test_row_inserted_at_the_beginning_of_time_survives_retention(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    col = {"column_uuid": "c", "column_name": "v", "data_type": "INTEGER"}
    events = [
        {"op": "create_table", "t": 1, "table_uuid": T1, "table_name": "t", "columns": [col]},
        {"op": "insert", "t": 2, "table_uuid": T1, "key": 1, "values": {"c": 0}},  # never touched again
        {"op": "insert", "t": 3, "table_uuid": T1, "key": 2, "values": {"c": 0}},
        {"op": "insert", "t": 3, "table_uuid": T1, "key": 3, "values": {"c": 0}},
    ]
    for day in range(4, 40):
        events.append({"op": "update", "t": day, "table_uuid": T1, "key": 2, "values": {"c": day}})
    events.append({"op": "delete", "t": 40, "table_uuid": T1, "key": 3})
    write(store, events)
    store.compact(spark=False)
    summary = store.retain(purge_before=41, spark=False)
    assert summary.versions_removed == 36 + 2  # 36 older versions of key 2, key 3 insert and delete
    assert store.load_table("t", 41).to_pylist() == [
        {"synthetic_key": 1, "v": 0},
        {"synthetic_key": 2, "v": 39},
    ]
    assert [v["logical_timestamp"] for v in store.row_history("t", 1)] == [2]
    assert store.row_history("t", 3) == []


class Crash(Exception):
    pass


def _crash_at(step_name):
    def hook(step):
        if step == step_name:
            raise Crash(step)

    return hook


@pytest.mark.slow
def test_crash_during_merge_or_retention_changes_nothing(tmp_path):
    store = compacted_random_store(tmp_path / "db", 5, spark=False)
    before = all_answers(store)
    with pytest.raises(Crash):
        store.merge(spark=False, small_file_bytes=10**9, on_step=_crash_at("files_written"))
    assert all_answers(store) == before
    from history_pipeline.maintenance.retention import retain

    for step in ("files_written", "cold_tier_written"):
        with pytest.raises(Crash):
            retain(store, store.frontier // 2, open_store(tmp_path / "cold"), on_step=_crash_at(step))
        assert store.earliest == 0 and all_answers(store) == before
    report = collect_garbage(store.catalog, store.objects, "db", 60, at=time.time() + 120)
    assert report.orphans_deleted  # what the crashes wrote is garbage, and only that
    assert all_answers(store) == before and store.verify() == []
    store.merge(spark=False, small_file_bytes=10**9)  # re-running after the crash works
    assert all_answers(store) == before


@pytest.mark.slow
def test_cleanup_respects_grace_and_never_deletes_live_files(tmp_path):
    store = compacted_random_store(tmp_path / "db", 8, spark=False)
    before = all_answers(store)
    store.merge(spark=False, small_file_bytes=10**9)
    tombstones = set(store.catalog_state().tombstones)
    assert tombstones
    from datetime import timedelta

    assert store.cleanup(grace=timedelta(hours=1)).tombstones_deleted == []
    assert all(store.objects.exists(p) for p in tombstones)
    report = collect_garbage(store.catalog, store.objects, "db", 3600, at=time.time() + 7200)
    assert set(report.tombstones_deleted) == tombstones
    assert all(store.objects.exists(p) for p in store.catalog_state().files)
    assert all_answers(store) == before


def test_export_and_cold_tier_round_trip_through_s3(tmp_path, s3_bucket, s3_options):
    store = HistoryStore.open(tmp_path / "root", database="db", s3=s3_options)
    events = random_history(11, n_events=70)
    write(store, *_split(events, random.Random(2)))
    store.compact(spark=False)  # about the exports and the cold tier on S3: in-process
    before = all_answers(store)
    as_of = store.frontier + 1
    manifest = store.export(as_of=as_of, to=s3_bucket)
    cold = open_store(s3_bucket, s3_options)
    assert list_exports(cold, "db") == [as_of]
    loaded = load_export(cold, "db", as_of)
    assert {name: t.to_pylist() for name, t in loaded.items()} == {
        name: rows for (t, name), rows in before.items() if t == as_of
    }
    assert len(manifest["tables"]) == len(loaded)
    t_purge = store.frontier // 2
    store.retain(purge_before=t_purge, cold_tier=s3_bucket, spark=False)
    with pytest.raises(PurgedTimestampError):
        store.load_table(before and next(iter(before))[1], 0)
    assert store.load_cold_tier(s3_bucket) == 0
    assert all_answers(store) == before  # the purged history answers again


class FlakyStore:
    """A real S3 store whose uploads fail after a number of puts (an interrupted upload)."""

    def __init__(self, inner, fail_after):
        self.inner, self.left = inner, fail_after
        self.uri = inner.uri

    def put(self, path, data):
        if self.left == 0:
            raise ConnectionError("upload interrupted")
        self.left -= 1
        self.inner.put(path, data)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_interrupted_export_leaves_nothing_visible(tmp_path, s3_bucket, s3_options):
    from history_pipeline.maintenance.export import export_database

    store = compacted_random_store(tmp_path / "db", 13, spark=False)
    cold = open_store(s3_bucket, s3_options)
    with pytest.raises(ConnectionError):
        export_database(store, store.frontier + 1, FlakyStore(cold, fail_after=1))
    assert list_exports(cold, "db") == []
    with pytest.raises(Exception, match="no complete export"):
        load_export(cold, "db", store.frontier + 1)


def test_merge_and_retention_on_spark(tmp_path, spark):
    store = compacted_random_store(tmp_path / "db", 21)
    before = all_answers(store)
    assert store.merge(spark=spark, small_file_bytes=10**9).files_removed > 0
    assert all_answers(store) == before
    t_purge = store.frontier // 3
    summary = store.retain(purge_before=t_purge, spark=spark)
    assert summary.versions_removed > 0 and summary.tables
    assert all_answers(store) == {k: v for k, v in before.items() if k[0] >= t_purge}
