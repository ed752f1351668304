"""Rebuild, load-back and verify after merge and retention: no silently wrong answer.

Each case here gave a wrong answer without any error before commit records: a rebuild
that resurrected a deleted key, lost the purge point or adopted an uncommitted
retention, a load-back that duplicated versions after a merge, and a verify() that
found none of it.
"""

from __future__ import annotations

import time

import pytest

from history_pipeline import HistoryStore, PurgedTimestampError
from history_pipeline.catalog import AddFile, FileKind, SetEarliest
from history_pipeline.catalog.upkeep import data_paths
from history_pipeline.io.store import open_store as open_objects
from history_pipeline.maintenance import merge as merge_module
from history_pipeline.maintenance import retention as retention_module
from history_pipeline.orchestration.checks import reconstruction_invariant_check
from history_pipeline_tests.test_compaction import write

T = "tbl"
COL = {"column_uuid": "c", "column_name": "v", "data_type": "INTEGER"}


class Crash(Exception):
    pass


def crash_at(step_name):
    def hook(step):
        if step == step_name:
            raise Crash(step)
    return hook


def open_store(path):
    return HistoryStore.open(path / "root", database="db")


def history(store):
    """Two segments: key 1 lives in a snapshot (written for an added column) and dies after it."""
    write(
        store,
        [
            {"op": "create_table", "t": 1, "table_uuid": T, "table_name": "t", "columns": [COL]},
            {"op": "insert", "t": 2, "table_uuid": T, "key": 1, "values": {"c": 10}},
            {"op": "insert", "t": 2, "table_uuid": T, "key": 2, "values": {"c": 20}},
            {"op": "add_column", "t": 3, "table_uuid": T, "default": 7,
             "column": {"column_uuid": "d", "column_name": "w", "data_type": "INTEGER"}},
        ],
        [
            {"op": "delete", "t": 5, "table_uuid": T, "key": 1},
            {"op": "update", "t": 6, "table_uuid": T, "key": 2, "values": {"c": 21}},
            {"op": "insert", "t": 6, "table_uuid": T, "key": 3, "values": {"c": 30, "d": 1}},
        ],
    )
    store.compact(spark=False)


def more_history(store):
    write(store, [
        {"op": "update", "t": 8, "table_uuid": T, "key": 3, "values": {"c": 31}},
        {"op": "insert", "t": 9, "table_uuid": T, "key": 4, "values": {"c": 40}},
    ])
    store.compact(spark=False)


def answers(store, lowest=None):
    low = store.earliest if lowest is None else lowest
    out = {}
    for as_of in range(max(low, 2), store.frontier + 2):  # the table exists from 2 on
        out[as_of] = {
            "table": store.load_table("t", as_of).to_pylist(),
            "rows": [store.fetch_row("t", k, as_of) for k in range(1, 5)],
            "sql": store.sql("SELECT * FROM t ORDER BY 1", as_of).to_pylist(),
        }
    return out


def versions(store):
    return {k: [(v["logical_timestamp"], v["is_deleted"]) for v in store.row_history("t", k)] for k in range(1, 5)}


def test_rebuild_after_retention_does_not_resurrect_a_deleted_key(tmp_path):
    store = open_store(tmp_path)
    history(store)
    assert store.catalog_state().files_of(T, FileKind.SNAPSHOT)  # key 1 is in a snapshot below the purge
    store.retain(purge_before=6, spark=False)
    before = answers(store)
    assert [r["synthetic_key"] for r in before[7]["table"]] == [2, 3]
    store.rebuild_catalog()  # the removed files are still in storage (inside the grace period)
    assert store.earliest == 6
    assert answers(store) == before
    assert store.verify() == []


@pytest.mark.slow
def test_rebuild_after_retain_compact_merge_load_back_keeps_the_restored_history(tmp_path):
    store = open_store(tmp_path)
    history(store)
    full = answers(store)
    cold = str(tmp_path / "cold")
    store.retain(purge_before=6, cold_tier=cold, spark=False)
    more_history(store)
    full.update({k: v for k, v in answers(store).items() if k > max(full)})
    store.merge(spark=False, small_file_bytes=10**9)
    assert store.load_cold_tier(cold) == 0
    assert answers(store, 0) == full
    store.rebuild_catalog()
    assert store.earliest == 0
    assert answers(store, 0) == full
    assert store.verify() == []


@pytest.mark.parametrize("step", ["files_written", "cold_tier_written"])
def test_rebuild_does_not_adopt_an_uncommitted_retention(tmp_path, step):
    store = open_store(tmp_path)
    history(store)
    before, files = answers(store), set(store.catalog_state().files)
    with pytest.raises(Crash):
        retention_module.retain(store, 6, open_objects(str(tmp_path / "cold")), on_step=crash_at(step))
    orphans = {p for p, _, _ in data_paths(store.objects, "db")} - files
    assert orphans  # the crashed retention wrote its files
    state = store.rebuild_catalog()
    assert state.earliest == 0 and set(state.files) == files and not orphans & set(state.files)
    assert answers(store) == before
    if step == "cold_tier_written":
        assert store.load_cold_tier(str(tmp_path / "cold")) == 0  # its manifest restores nothing
    assert answers(store) == before and store.verify() == []


def test_rebuild_does_not_adopt_an_uncommitted_merge(tmp_path):
    store = open_store(tmp_path)
    history(store)
    more_history(store)
    before, files = answers(store), set(store.catalog_state().files)
    with pytest.raises(Crash):
        merge_module.merge(store, None, small_file_bytes=10**9, on_step=crash_at("files_written"))
    assert set(store.rebuild_catalog().files) == files
    assert answers(store) == before and store.verify() == []


def test_rebuild_without_the_log_gives_the_committed_state(tmp_path):
    store = open_store(tmp_path)
    history(store)
    cold = str(tmp_path / "cold")
    store.retain(purge_before=6, cold_tier=cold, spark=False)
    more_history(store)
    store.merge(spark=False, small_file_bytes=10**9)
    before, state = answers(store), store.catalog_state()
    for obj in store.objects.list("db/_catalog/"):
        store.objects.delete(obj.path)  # the whole transaction log is lost
    store.catalog.forget_cached_state()
    rebuilt = store.rebuild_catalog()
    assert set(rebuilt.files) == set(state.files) and rebuilt.earliest == 6
    assert rebuilt.txn_id > state.txn_id  # the numbering continues
    assert answers(store) == before
    store.rebuild_catalog()  # again, from the base the first rebuild recorded
    assert answers(store) == before and store.verify() == []


def test_load_back_after_a_merge_restores_each_version_once(tmp_path):
    store = open_store(tmp_path)
    history(store)
    more_history(store)
    full, full_versions = answers(store), versions(store)
    cold = str(tmp_path / "cold")
    store.retain(purge_before=7, cold_tier=cold, spark=False)
    with pytest.raises(PurgedTimestampError):
        store.load_table("t", 6)
    store.merge(spark=False, small_file_bytes=10**9)  # the rows retention kept move to a merged file
    assert store.load_cold_tier(cold) == 0
    assert versions(store) == full_versions
    assert answers(store) == full
    assert store.verify() == []
    assert store.load_cold_tier(cold) == 0 and versions(store) == full_versions  # loading twice is harmless


def _forge(store, entry, **changes):
    forged = type(entry)(**{**entry.__dict__, "path": entry.path.replace(".parquet", "-copy.parquet"), **changes})
    store.objects.put(forged.path, store.objects.get(entry.path))
    store.catalog.commit("forge", lambda s: [AddFile(forged)])
    return forged


def test_verify_finds_duplicate_versions(tmp_path):
    store = open_store(tmp_path)
    history(store)
    _forge(store, store.catalog_state().files_of(T, FileKind.VERSIONS)[0])
    assert "duplicate_version" in {p.kind for p in store.verify()}


def test_verify_finds_a_snapshot_that_disagrees_with_the_versions(tmp_path):
    store = open_store(tmp_path)
    history(store)
    versions_file = store.catalog_state().files_of(T, FileKind.VERSIONS)[-1]  # holds the delete of key 1
    _forge(store, versions_file, kind=FileKind.SNAPSHOT, snapshot_as_of=store.frontier + 1)
    assert "snapshot_mismatch" in {p.kind for p in store.verify()}  # the newest snapshot is always sampled


def test_verify_finds_a_purge_point_that_does_not_match_the_files(tmp_path):
    store = open_store(tmp_path)
    history(store)
    store.catalog.commit("no retention ran", lambda s: [SetEarliest(6)])
    assert "purge_point_mismatch" in {p.kind for p in store.verify()}
    other = open_store(tmp_path / "other")
    history(other)
    other.retain(purge_before=6, spark=False)
    other.catalog.commit("purge point forgotten", lambda s: [SetEarliest(0)])
    assert "purge_point_mismatch" in {p.kind for p in other.verify()}


def test_reconstruction_check_does_not_pass_when_it_checked_nothing(tmp_path):
    import dagster as dg

    from history_pipeline.orchestration.resources import HistoryRootResource, S3Settings

    root = tmp_path / "root"
    store = open_store(tmp_path)
    history(store)
    for ref in store.segments():
        ref.path.unlink()  # the applied WAL segments are gone: nothing to re-derive
    result = reconstruction_invariant_check(dg.build_op_context(),
                                            HistoryRootResource(root=str(root), s3=S3Settings()))
    assert not result.passed and result.metadata["states_checked"].value == 0
    assert "checked nothing" in result.description


def test_cleanup_prunes_commit_records_behind_a_base_and_rebuild_still_agrees(tmp_path):
    from history_pipeline.catalog.records import list_record_ids
    from history_pipeline.catalog.upkeep import collect_garbage

    store = open_store(tmp_path)
    history(store)
    store.retain(purge_before=6, spark=False)
    more_history(store)
    before, state = answers(store), store.catalog_state()
    prefix = store.catalog.records_prefix
    assert list_record_ids(store.objects, prefix).records == tuple(range(state.txn_id + 1))
    report = collect_garbage(store.catalog, store.objects, "db", 3600.0, at=time.time() + 7200.0)
    ids = list_record_ids(store.objects, prefix)
    assert report.records_pruned == state.txn_id + 1 and ids.bases == (state.txn_id,)
    assert max(ids.records) > state.txn_id  # the cleanup's own commit is recorded after the base
    for obj in store.objects.list("db/_catalog/"):
        store.objects.delete(obj.path)
    store.catalog.forget_cached_state()
    rebuilt = store.rebuild_catalog()
    assert set(rebuilt.files) == set(store.catalog_state().files) and rebuilt.earliest == 6
    assert answers(store) == before and store.verify() == []


def test_rebuild_without_the_log_adopts_one_attempt_of_a_retried_compaction(tmp_path):
    """Two crashed attempts of one segment under the same transaction id, then the log is lost:
    the rebuilt catalog holds the segment's versions once (the attempt its schema-history file names)."""
    reference = HistoryStore.open(tmp_path / "reference", database="db")
    history(reference)
    more_history(reference)
    expected, expected_versions = answers(reference), versions(reference)

    store = open_store(tmp_path)
    history(store)
    write(store, [
        {"op": "update", "t": 8, "table_uuid": T, "key": 3, "values": {"c": 31}},
        {"op": "insert", "t": 9, "table_uuid": T, "key": 4, "values": {"c": 40}},
    ])
    for _ in range(2):  # both attempts write their files and schema-history file, neither commits
        with pytest.raises(Crash):
            store.compact(spark=False, on_step=crash_at("schema_history_written"))
    written = [p for p, _, _ in data_paths(store.objects, "db") if "/tables/" in p]
    state = store.catalog_state()
    # one version file per attempt beside the live files and the tombstones (an interval close's originals)
    assert len(written) - len(state.files_of(T)) - len([p for p in state.tombstones if "/tables/" in p]) == 2
    for obj in store.objects.list("db/_catalog/"):
        store.objects.delete(obj.path)  # the whole transaction log is lost
    for obj in store.objects.list("db/_history_catalog/commits/"):
        store.objects.delete(obj.path)  # and the commit records with it
    store.catalog.forget_cached_state()
    store.rebuild_catalog()
    assert versions(store) == expected_versions  # each (key, t) once
    assert answers(store) == expected
    assert store.verify() == []
