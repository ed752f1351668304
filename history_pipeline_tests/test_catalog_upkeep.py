"""Garbage collection, verification and rebuild, on local disk and on a real S3 endpoint."""

import time

import pytest

from history_pipeline import HistoryStore
from history_pipeline.catalog import AddFile, RemoveFile
from history_pipeline.catalog.model import FileKind
from history_pipeline.catalog.upkeep import collect_garbage, data_paths
from history_pipeline_tests.test_compaction import example_events, write

GRACE = 3600.0


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return HistoryStore.open(tmp_path / "root", database="db")
    return HistoryStore.open(
        request.getfixturevalue("s3_bucket"),
        database="db",
        wal_dir=tmp_path / "wal",
        s3=request.getfixturevalue("s3_options"),
    )


class Crash(Exception):
    pass


def _crash_after_files(step):
    if step == "schema_history_written":
        raise Crash(step)


def answers(store):
    return [store.load_table("my_table", t).to_pylist() for t in range(2, store.frontier + 2)]


@pytest.mark.spark
def test_orphan_of_a_crash_is_removed_only_after_the_grace_period(store):
    write(store, example_events()[:3])
    store.compact()
    write(store, example_events()[3:])
    with pytest.raises(Crash):
        store.compact(on_step=_crash_after_files)
    live = set(store.catalog_state().files)
    orphans = {p for p, _, _ in data_paths(store.objects, "db")} - live
    assert orphans  # the crashed attempt left files nobody references
    assert all(path in live or path in orphans for path, _, _ in data_paths(store.objects, "db"))
    report = collect_garbage(store.catalog, store.objects, "db", GRACE)
    assert report.orphans_deleted == []  # still inside the grace period
    report = collect_garbage(store.catalog, store.objects, "db", GRACE, at=time.time() + 2 * GRACE)
    assert set(report.orphans_deleted) == orphans
    assert {p for p, _, _ in data_paths(store.objects, "db")} == live
    assert store.verify() == []
    store.compact()  # the segment is still pending and applies now
    assert store.load_table("my_table", 6).to_pylist() == [{"synthetic_key": 2, "column1": "value2_prime"}]


def _rewrite_one_file(store):
    """A merge in miniature: the same rows under a new path, the old file tombstoned."""
    state = store.catalog_state()
    old = state.files_of("tbl-example", FileKind.VERSIONS)[0]
    new_path = old.path.replace(".parquet", "-merged.parquet")
    store.objects.put(new_path, store.objects.get(old.path))
    new = type(old)(**{**old.__dict__, "path": new_path})
    store.catalog.commit("merge", lambda s: [RemoveFile(old.path, time.time()), AddFile(new)])
    return old.path


@pytest.mark.spark
def test_tombstones_wait_for_grace_and_for_retained_transactions(store):
    write(store, example_events())
    store.compact()
    before = answers(store)
    removed = _rewrite_one_file(store)
    assert answers(store) == before
    assert collect_garbage(store.catalog, store.objects, "db", GRACE).tombstones_deleted == []
    assert store.objects.exists(removed)
    report = collect_garbage(store.catalog, store.objects, "db", GRACE, at=time.time() + 2 * GRACE)
    assert report.tombstones_deleted == [removed] and report.transactions_pruned > 0
    assert not store.objects.exists(removed)
    assert removed not in store.catalog_state().tombstones
    assert answers(store) == before
    assert store.verify() == []


@pytest.mark.spark
def test_verify_reports_problems_as_data(store):
    write(store, example_events())
    store.compact()
    assert store.verify() == []
    victim = store.catalog_state().files_of("tbl-example", FileKind.VERSIONS)[0].path
    store.objects.delete(victim)
    problems = store.verify()
    assert [p.kind for p in problems] == ["missing_file"] and problems[0].path == victim


@pytest.mark.spark
def test_verify_finds_statistics_that_do_not_match(store):
    write(store, example_events())
    store.compact()
    entry = store.catalog_state().files_of("tbl-example", FileKind.VERSIONS)[0]
    forged = type(entry)(**{**entry.__dict__, "path": entry.path + ".forged.parquet", "row_count": 99})
    store.objects.put(forged.path, store.objects.get(entry.path))
    store.catalog.commit("forge", lambda s: [RemoveFile(entry.path, time.time()), AddFile(forged)])
    assert {p.kind for p in store.verify()} == {"row_count_mismatch"}


@pytest.mark.spark
def test_rebuild_reproduces_the_catalog_from_parquet_alone(store):
    write(store, example_events()[:3], example_events()[3:] + [
        {"op": "rename_table", "t": 6, "table_uuid": "tbl-example", "new_name": "renamed"}])
    store.compact()
    write(store, [{"op": "insert", "t": 7, "table_uuid": "tbl-example", "key": 9, "values": {"col1": "x"}}])
    with pytest.raises(Crash):
        store.compact(on_step=lambda step: (_ for _ in ()).throw(Crash()) if step == "files_written" else None)
    original = store.catalog_state()
    rebuilt = store.rebuild_catalog()
    assert set(rebuilt.files) == set(original.files)  # the crashed attempt's orphans stay out
    assert rebuilt.frontier == original.frontier
    assert rebuilt.applied_segments == original.applied_segments
    assert rebuilt.schema_history == original.schema_history
    for name, as_of in [("my_table", 4), ("my_table", 6), ("renamed", 7)]:
        assert store.load_table(name, as_of).to_pylist()
    assert store.verify() == []
    store.compact()
    assert store.fetch_row("renamed", 9, 8) == {"column1": "x"}
