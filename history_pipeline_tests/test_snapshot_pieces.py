"""Snapshots written in pieces over key ranges: each piece is a task that reads only its
range's rows, the driver commits them all. A table whose snapshots are split into several pieces
answers exactly as the model at every T, and as the same history snapshotted in one piece; every
maintenance operation copes with a snapshot of several files; the same task functions run on Spark
(local root and the S3 endpoint) and in-process."""

from __future__ import annotations

import random
import shutil
from types import MappingProxyType

import pytest

from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.catalog.files import by_first_key, select_files
from history_pipeline.catalog.model import CatalogState, FileEntry, FileKind
from history_pipeline.maintenance.snapshot_pieces import key_cuts_by_rows, plan_pieces
from history_pipeline.maintenance.snapshots import closed_intervals
from history_pipeline.supertable import KEY
from history_pipeline.supertable.read import dataset_of
from history_pipeline_tests.test_closed_intervals import _check_items, _closed, _items_history, _snapshots
from history_pipeline_tests.test_compaction import _split, check_against_model, random_history, write
from history_pipeline_tests.test_query_layers import CREATE, _insert, _load, _update

#: snapshots often, and in pieces of at most 15 rows read: the items history's snapshots are 3-6 pieces
PIECES = StoreSettings(snapshot_min_versions=6, snapshot_ratio=0.2, snapshot_piece_rows=15, interval_piece_rows=15)
ONE_PIECE = StoreSettings(snapshot_min_versions=6, snapshot_ratio=0.2)
#: pieces as small, but snapshots only when asked (``refresh_snapshots(force=True)``)
#: (closing an interval rewrites its snapshot's files over its own key ranges: as small, so that
#: a snapshot stays in several pieces)
ON_REQUEST = StoreSettings(snapshot_min_versions=10**9, snapshot_piece_rows=15, interval_piece_rows=15)


def _points(store, table="T"):
    """{snapshot_as_of: its files, by smallest key} of a table."""
    points: dict[int, list[FileEntry]] = {}
    for f in store.catalog_state().files_of(table, FileKind.SNAPSHOT):
        points.setdefault(f.snapshot_as_of, []).append(f)
    return {t: sorted(files, key=by_first_key) for t, files in points.items()}


def _assert_disjoint_ranges(files):
    """The pieces of one kind (rows written before the interval, or versions held) hold disjoint
    key ranges; the two kinds interleave."""
    for holding in (False, True):
        ranges = sorted((f.min_key, f.max_key) for f in files if f.row_count and f.holds_versions == holding)
        assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False)), ranges


def _snapshot_rows(store, files, table="T"):
    """Every row of a snapshot's files (reserved columns and values), in key order."""
    state = store.catalog_state()
    from history_pipeline.schema import replay_schema_history
    from history_pipeline.supertable import supertable_schema

    schema = supertable_schema(replay_schema_history(state.schema_history).supercolumns[table])
    return dataset_of(store.objects, files, schema).to_table().sort_by([(KEY, "ascending")])


@pytest.fixture(scope="module")
def items_in_pieces(tmp_path_factory):
    """The items history compacted with ``PIECES`` once for the module: each test gets its own copy
    of the root (a store over it) and the history's events."""
    built = tmp_path_factory.mktemp("items") / "root"
    events = _items_history(HistoryStore.open(built, database="db", settings=PIECES))

    def copy(root):
        shutil.copytree(built, root)
        return HistoryStore.open(root, database="db", settings=PIECES), list(events)

    return copy


def _fake(min_key, max_key, rows):
    return FileEntry(f"f{min_key}-{max_key}", FileKind.VERSIONS, "T", 1, rows, 0, 1, min_key, max_key)


def test_key_cuts_follow_the_files_rows_and_are_increasing_integers_inside_the_range():
    assert key_cuts_by_rows([_fake(1, 1000, 1000)], 4) == (251, 501, 751)  # one file: equal widths
    # half the rows in keys 1..10: the first cuts fall there
    assert key_cuts_by_rows([_fake(1, 1000, 1000), _fake(1, 10, 1000)], 4) == (5, 10, 501)
    assert key_cuts_by_rows([_fake(1, 1000, 1000)], 1) == ()
    assert key_cuts_by_rows([FileEntry("x", FileKind.VERSIONS, "T", 1, 5, 0, 1)], 3) == ()  # no key stats
    assert key_cuts_by_rows([_fake(7, 7, 100)], 4) == ()  # one key cannot be cut
    rng = random.Random(3)
    for _ in range(200):
        files = [_fake(lo, lo + rng.randint(0, 10**rng.randint(0, 15)), rng.randint(1, 10**6))
                 for lo in (rng.randint(-2**62, 2**62) for _ in range(rng.randint(1, 30)))]
        parts = rng.randint(2, 40)
        cuts = key_cuts_by_rows(files, parts)
        assert list(cuts) == sorted(set(cuts)) and len(cuts) <= parts - 1
        low, high = min(f.min_key for f in files), max(f.max_key for f in files)
        assert all(low < c <= high for c in cuts)
    # extreme keys do not overflow
    assert len(key_cuts_by_rows([_fake(-2**63, 2**63 - 1, 10**6)], 4)) == 3


def test_a_snapshots_pieces_are_selected_by_key_range_whatever_their_paths():
    """Pieces read in key order give rows in key order, so the read need not sort them; the catalog
    lists files by path, and a piece's path says nothing of its keys."""
    pieces = [FileEntry(f"snapshot-{name}", FileKind.SNAPSHOT, "T", 1, 10, 1, 5, low, low + 9, snapshot_as_of=6)
              for name, low in (("a", 20), ("b", 0), ("c", 30), ("d", 10))]
    older = FileEntry("snapshot-0", FileKind.SNAPSHOT, "T", 1, 10, 1, 2, 0, 40, snapshot_as_of=3)
    state = CatalogState(files=MappingProxyType({f.path: f for f in [*pieces, older]}))
    selection = select_files(state, "T", 9)
    assert [f.min_key for f in selection.snapshot] == [0, 10, 20, 30]
    assert select_files(state, "T", 5).snapshot == (older,)


def test_a_states_selections_are_kept_and_each_keys_is_its_own():
    """``select_files`` keeps a state's selection per T: asked again it is the same, a key's
    selection keeps only the pieces that may hold it, and a state keeps a bounded number of T."""
    from history_pipeline.catalog import files as files_module

    pieces = [FileEntry(f"snapshot-{name}", FileKind.SNAPSHOT, "T", 1, 10, 1, 5, low, low + 9, snapshot_as_of=6)
              for name, low in (("a", 20), ("b", 0), ("c", 30), ("d", 10))]
    versions = FileEntry("versions-x", FileKind.VERSIONS, "T", 1, 10, 7, 12, 5, 24)
    state = CatalogState(files=MappingProxyType({f.path: f for f in [*pieces, versions]}))
    whole = select_files(state, "T", 9)
    assert select_files(state, "T", 9) is whole and [f.min_key for f in whole.snapshot] == [0, 10, 20, 30]
    assert whole.versions == (versions,)
    one = select_files(state, "T", 9, [25])
    assert [f.min_key for f in one.snapshot] == [20] and one.versions == ()
    assert select_files(state, "T", 9, [12]).versions == (versions,)
    assert select_files(state, "T", 7).versions == () and select_files(state, "T", 9) is whole
    # another state (a later commit) selects afresh
    later = CatalogState(files=MappingProxyType({f.path: f for f in pieces}))
    assert select_files(later, "T", 9).versions == ()
    for as_of in range(100, 100 + 2 * files_module._SELECTIONS_KEPT):
        select_files(state, "T", as_of)
    assert len(state.derived[("select_files", "T")]) == files_module._SELECTIONS_KEPT


@pytest.mark.slow
def test_a_snapshot_in_pieces_answers_as_the_model_and_as_one_piece_at_every_t(tmp_path, items_in_pieces):
    store, events = items_in_pieces(tmp_path / "pieces")
    whole = HistoryStore.open(tmp_path / "whole", database="db", settings=ONE_PIECE)
    assert _items_history(whole) == events
    points, single = _points(store), _points(whole)
    assert sorted(points) == sorted(single) and len(points) >= 3
    # one file of each kind: the rows written before the interval, the versions held
    assert all(sum(f.holds_versions == holding for f in files) <= 1 for files in single.values()
               for holding in (False, True))
    assert max(len(files) for files in points.values()) >= 3
    for t, files in points.items():
        _assert_disjoint_ranges(files)
        # the pieces together hold exactly the one-piece snapshot's rows (closed marks aside)
        assert _snapshot_rows(store, files).equals(_snapshot_rows(whole, single[t])), t
    _check_items(store, events, range(2, store.frontier + 2))
    # the closed-interval read takes a snapshot of several files as well
    assert all(_closed(store, t) for t in range(3, _snapshots(store)[-1]))
    assert store.verify() == []


@pytest.mark.slow
def test_every_piece_reads_only_its_key_range(tmp_path, items_in_pieces):
    store, _ = items_in_pieces(tmp_path / "root")
    state = store.catalog_state()
    from history_pipeline.schema import replay_schema_history

    supers = replay_schema_history(state.schema_history).supercolumns["T"]
    tasks = plan_pieces(state, {}, "db", "T", supers, state.frontier + 1, piece_rows=8)
    assert len(tasks) >= 3
    assert tasks[0].low is None and tasks[-1].high is None and tasks[0].always
    assert all(a.high == b.low for a, b in zip(tasks, tasks[1:], strict=False))
    for task in tasks:  # a piece is given only the files that may hold its keys
        for f in task.snapshot + task.versions:
            assert (task.high is None or f.min_key < task.high) and (task.low is None or f.max_key >= task.low)
    # together the pieces read no file more than the whole table would, and each fewer rows
    to_read = [sum(f.row_count for f in t.snapshot + t.versions) for t in tasks]
    assert min(to_read) < sum(f.row_count for f in {f for t in tasks for f in t.snapshot + t.versions})


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "n_events", "changes"), [
    (11, 90, {"add_column", "rename_column", "reorder_column"}),
    (23, 60, {"add_column", "change_column_type", "drop_column"}),  # 60 events reach all of its changes
], ids=["11", "23"])
def test_random_histories_with_schema_changes_in_pieces_equal_the_model(tmp_path, seed, n_events, changes):
    events = random_history(seed, n_events=n_events)
    assert {e["op"] for e in events} - {"create_table", "insert", "update", "delete"} == changes
    store = HistoryStore.open(tmp_path, database="db", settings=StoreSettings(
        snapshot_min_versions=3, snapshot_ratio=0.2, snapshot_piece_rows=3))
    for part in _split(events, random.Random(seed)):
        write(store, part)
        store.compact(spark=False)
    split = [files for table in {f.table_uuid for f in store.catalog_state().files.values() if f.table_uuid}
             for files in _points(store, table).values() if len(files) > 1]
    assert split  # some table's snapshot came in several pieces
    check_against_model(store, events)
    assert store.verify() == []


@pytest.mark.slow
def test_maintenance_over_snapshots_in_pieces(tmp_path, items_in_pieces):
    store, events = items_in_pieces(tmp_path / "root")
    snapshots = _snapshots(store)
    assert max(len(f) for f in _points(store).values()) >= 3
    every = range(2, store.frontier + 2)

    store.merge(spark=False, small_file_bytes=1 << 30)
    _check_items(store, events, every)

    erased = (3, 17, 44)
    store.erase("items", erased, requested_by="test", spark=False)
    events = [e for e in events if e.get("key") not in erased]
    _check_items(store, events, every)
    assert store.verify() == []

    before = {t: [f.path for f in files] for t, files in _points(store).items()}
    store.rebuild_catalog()
    assert {t: [f.path for f in files] for t, files in _points(store).items()} == before
    _check_items(store, events, every)

    from history_pipeline.io.store import open_store
    from history_pipeline.maintenance.export import load_export

    as_of = _snapshots(store)[-1]  # exactly at a snapshot in pieces
    store.export(as_of=as_of, to=str(tmp_path / "export"))
    exported = load_export(open_store(tmp_path / "export"), "db", as_of)
    assert exported["items"].sort_by("synthetic_key").to_pylist() == \
        store.load_table("items", as_of, ordered=True).to_pylist()

    cold = str(tmp_path / "cold")
    purge = (snapshots[1] + snapshots[2]) // 2
    store.retain(purge, cold_tier=cold, spark=False)
    assert min(_points(store)) >= purge  # every piece of a snapshot below the purge point went
    _check_items(store, events, range(purge, store.frontier + 2))
    assert store.verify() == []
    store.load_cold_tier(cold)
    _check_items(store, events, every)
    assert store.verify() == []

    # a later refresh snapshots in pieces again from the pieces of the newest snapshot
    live = store.load_table("items", store.frontier + 1).column("synthetic_key").to_pylist()
    batch = [_update(store.frontier + 1, k, k + 1) for k in live if k % 2]
    write(store, batch)
    store.compact(spark=False)
    store.refresh_snapshots(force=True, spark=False)
    events += batch
    newest = _points(store)[max(_points(store))]
    assert len(newest) >= 2
    _assert_disjoint_ranges(newest)
    _check_items(store, events, range(2, store.frontier + 2))


def test_pieces_written_by_spark_tasks_on_a_local_root_equal_in_process(tmp_path, spark):
    batches = [[CREATE] + [_insert(2, k, k) for k in range(60)],
               [_update(3 + i, k, k * i) for i in range(3) for k in range(0, 60, 2)]]
    inprocess = HistoryStore.open(tmp_path / "local", database="db", settings=ON_REQUEST)
    events = _load(inprocess, batches)
    shutil.copytree(tmp_path / "local", tmp_path / "spark")  # the same compacted history, snapshotted on Spark
    on_spark = HistoryStore.open(tmp_path / "spark", database="db", settings=ON_REQUEST)
    summary = on_spark.refresh_snapshots(force=True, spark=spark)
    inprocess.refresh_snapshots(force=True, spark=False)
    assert summary.tables == ["T"] and summary.rows == 60
    a, b = _points(on_spark), _points(inprocess)
    assert sorted(a) == sorted(b) and len(a[max(a)]) >= 4
    assert [(f.min_key, f.max_key, f.row_count) for f in a[max(a)]] == \
        [(f.min_key, f.max_key, f.row_count) for f in b[max(b)]]
    _check_items(on_spark, events, range(2, on_spark.frontier + 2))
    assert on_spark.verify() == []


def test_pieces_on_the_s3_endpoint_through_spark_and_in_process(tmp_path, s3_bucket, s3_options, spark):
    batches = [[CREATE] + [_insert(2, k, k) for k in range(50)],
               [_update(3, k, -k) for k in range(0, 50, 3)]]
    events = [e for b in batches for e in b]
    for name, session in (("spark", spark), ("local", False)):
        store = HistoryStore.open(f"{s3_bucket}/{name}", database="db", settings=ON_REQUEST, s3=s3_options,
                                  wal_dir=tmp_path / name / "wal")
        for batch in batches:
            write(store, batch)
            store.compact(spark=False)
        assert store.refresh_snapshots(force=True, spark=session).tables == ["T"]
        newest = _points(store)[max(_points(store))]
        assert len(newest) >= 3
        _assert_disjoint_ranges(newest)
        assert store.objects.uri.startswith("s3://")
        _check_items(store, events, range(2, store.frontier + 2))
        assert store.verify() == []


def test_compact_hands_its_session_to_the_snapshot_refresh(tmp_path, spark, monkeypatch):
    import history_pipeline.maintenance.snapshot_pieces as pieces

    seen = []
    real = pieces.map_tasks

    def spy(session, fn, tasks):
        seen.append(session)
        return real(session, fn, tasks)

    monkeypatch.setattr(pieces, "map_tasks", spy)
    store = HistoryStore.open(tmp_path, database="db", settings=PIECES)
    write(store, [CREATE] + [_insert(2, k, k) for k in range(30)])
    store.compact(spark=spark)
    write(store, [_update(3, k, 0) for k in range(30)])
    store.compact(spark=False)
    assert seen == [spark, None]
    assert store.load_table("items", 4, ordered=True).to_pylist() == [{"synthetic_key": k, "a": 0, "note": f"k{k} t2"}
                                                                        for k in range(30)]


def test_a_refresh_commits_no_piece_read_from_a_file_that_went_meanwhile_nor_a_second_set(tmp_path, monkeypatch):
    from history_pipeline.maintenance import snapshots

    # the pieces written whole (a table whose open interval cannot be closed, e.g. after a merge
    # across its snapshot); the snapshot written by closing is checked below
    monkeypatch.setattr(snapshots, "open_interval", lambda state, table_uuid: None)
    store = HistoryStore.open(tmp_path, database="db", settings=ON_REQUEST)
    events = _load(store, [[CREATE] + [_insert(2, k, k) for k in range(40)],
                           [_update(3, k, -k) for k in range(0, 40, 2)], [_update(4, k, 7) for k in range(0, 40, 5)]])
    real = snapshots.write_snapshots

    def then_merge(*args, **kwargs):
        written = real(*args, **kwargs)
        store.merge(spark=False, small_file_bytes=1 << 30)  # replaces the version files the pieces read
        return written

    monkeypatch.setattr(snapshots, "write_snapshots", then_merge)
    assert store.refresh_snapshots(force=True, spark=False).tables == []
    assert _points(store) == {}
    monkeypatch.setattr(snapshots, "write_snapshots", real)

    def then_refresh_again(*args, **kwargs):
        written = real(*args, **kwargs)
        monkeypatch.setattr(snapshots, "write_snapshots", real)
        assert store.refresh_snapshots(force=True, spark=False).tables == ["T"]  # takes the point first
        return written

    monkeypatch.setattr(snapshots, "write_snapshots", then_refresh_again)
    assert store.refresh_snapshots(force=True, spark=False).tables == []
    (files,) = _points(store).values()
    assert sum(f.row_count for f in files) == 40 and len(files) >= 3  # one set of pieces, not two
    _check_items(store, events, range(2, store.frontier + 2))


def test_a_snapshot_written_by_closing_commits_nothing_read_from_a_file_that_went_meanwhile_nor_twice(
        tmp_path, monkeypatch):
    from history_pipeline.maintenance import snapshots

    store = HistoryStore.open(tmp_path, database="db", settings=ON_REQUEST)
    events = _load(store, [[CREATE] + [_insert(2, k, k) for k in range(40)],
                           [_update(3, k, -k) for k in range(0, 40, 2)], [_update(4, k, 7) for k in range(0, 40, 5)]])
    real = snapshots.map_tasks

    def then_merge(*args, **kwargs):
        monkeypatch.setattr(snapshots, "map_tasks", real)
        written = real(*args, **kwargs)
        store.merge(spark=False, small_file_bytes=1 << 30)  # replaces the version files closing read
        return written

    monkeypatch.setattr(snapshots, "map_tasks", then_merge)
    assert store.refresh_snapshots(force=True, spark=False).tables == []
    assert _points(store) == {}

    def then_refresh_again(*args, **kwargs):
        monkeypatch.setattr(snapshots, "map_tasks", real)
        written = real(*args, **kwargs)
        assert store.refresh_snapshots(force=True, spark=False).tables == ["T"]  # takes the point first
        return written

    monkeypatch.setattr(snapshots, "map_tasks", then_refresh_again)
    assert store.refresh_snapshots(force=True, spark=False).tables == []
    (files,) = _points(store).values()
    assert sum(f.row_count for f in files) == 40  # one set of pieces, not two
    assert store.verify() == []
    _check_items(store, events, range(2, store.frontier + 2))


def test_verify_checks_a_snapshot_point_as_the_union_of_its_pieces(tmp_path):
    from history_pipeline.catalog.model import RemoveFile
    from history_pipeline.io.store import now

    store = HistoryStore.open(tmp_path, database="db", settings=ON_REQUEST)
    _load(store, [[CREATE] + [_insert(2, k, k) for k in range(60)], [_update(3, k, 1) for k in range(60)]])
    store.refresh_snapshots(force=True, spark=False)
    assert store.verify() == []  # pieces together equal the versions: no mismatch
    (files,) = _points(store).values()
    lost = files[1]
    store.catalog.commit("lose a piece", lambda current: [RemoveFile(lost.path, now())])
    problems = [p for p in store.verify() if p.kind == "snapshot_mismatch"]
    assert problems
    for p in problems:  # the keys of the lost piece, named with the snapshot point
        assert lost.min_key <= int(p.message.split()[1]) <= lost.max_key, p
        assert p.path in {f.path for f in files}


def test_the_dataframe_engine_folds_onto_a_snapshot_in_pieces(tmp_path, spark):
    """Compaction on Spark reads the prior image from a snapshot of several files (its parts are
    ranges of their keys) and snapshots again in pieces, on the same session."""
    rng = random.Random(5)
    batches = [[CREATE] + [_insert(2, k, k) for k in range(80)]]
    for t in range(3, 5):  # two folds: onto the first compaction's pieces, then onto pieces written by a fold
        batches.append([_update(t, k, rng.randint(0, 99)) for k in sorted(rng.sample(range(80), 30))])
    store = HistoryStore.open(tmp_path, database="db", settings=PIECES)
    events = []
    for batch in batches:
        write(store, batch)
        store.compact(spark=spark)
        events += batch
    points = _points(store)
    # each compaction snapshotted in pieces, so each later one folded onto such a snapshot
    assert len(points) == len(batches) and all(len(files) >= 2 for files in points.values())
    _check_items(store, events, range(2, store.frontier + 2))
    assert store.verify() == []


@pytest.mark.slow
def test_a_piece_walks_its_range_in_steps_and_rolls_over_to_new_files(tmp_path, monkeypatch):
    """A long history snapshotted by few tasks: each task reads its range in steps of about
    ``snapshot_piece_rows`` rows and starts a new file once one holds that many live rows, so the
    files stay small and the tasks' memory follows a step, not the history; the answers are the
    model's and those of the same history snapshotted in one piece."""
    from history_pipeline.maintenance import snapshot_pieces, snapshots

    # the pieces written whole (a table whose open interval cannot be closed in the same pass)
    monkeypatch.setattr(snapshots, "open_interval", lambda state, table_uuid: None)
    rng = random.Random(9)
    batches = [[CREATE] + [_insert(2, k, k) for k in range(60)]]
    for t in range(3, 12):
        batches.append([_update(t, k, rng.randint(0, 99)) for k in sorted(rng.sample(range(60), 25))])
    stepped = HistoryStore.open(tmp_path / "stepped", database="db", settings=ON_REQUEST)
    events = _load(stepped, batches)
    # the same compacted history (neither setting snapshots while compacting), snapshotted in one piece
    shutil.copytree(tmp_path / "stepped", tmp_path / "whole")
    whole = HistoryStore.open(tmp_path / "whole", database="db", settings=StoreSettings(snapshot_min_versions=10**9))
    reads: list[int] = []
    real_live_in = snapshot_pieces._live_in

    def counted(task, objects, schema, low, high):
        rows = real_live_in(task, objects, schema, low, high)
        reads.append(rows.num_rows)
        return rows

    monkeypatch.setattr(snapshot_pieces, "MAX_PIECE_TASKS", 2)
    monkeypatch.setattr(snapshot_pieces, "_live_in", counted)
    tasks = plan_pieces(stepped.catalog_state(), {}, "db", "T", (), stepped.frontier + 1, piece_rows=15)
    assert len(tasks) == 2  # 60 + 225 rows to read would be 19 pieces of 15
    assert stepped.refresh_snapshots(force=True, spark=False).tables == ["T"]
    whole.refresh_snapshots(force=True, spark=False)
    assert len(reads) > 2 * 2  # several steps per task
    (point, files), = _points(stepped).items()
    assert len(files) > 2  # rolled over within a task
    assert all(f.row_count < 2 * 15 + 15 for f in files)  # at most one step past the limit
    _assert_disjoint_ranges(files)
    assert _snapshot_rows(stepped, files).equals(_snapshot_rows(whole, _points(whole)[point]))
    _check_items(stepped, events, range(2, stepped.frontier + 2))


def test_closing_a_wide_interval_cuts_it_by_its_bytes_as_well_as_its_rows():
    """An interval's rows bound a close task (``interval_piece_rows``), and so do its stored bytes
    (``INTERVAL_PIECE_BYTES``): a wide table's interval of few rows is cut into key ranges too."""
    from history_pipeline.maintenance.snapshots import INTERVAL_PIECE_BYTES, Interval, plan_close

    def entry(path, kind, size, **more):
        return FileEntry(path=path, kind=kind, table_uuid="T", size_bytes=size, row_count=100_000, min_t=1,
                         max_t=9, min_key=0, max_key=999_999, **more)

    def tasks(size):
        files = (entry("s", FileKind.SNAPSHOT, size, snapshot_as_of=1), entry("v", FileKind.VERSIONS, size))
        interval = Interval("T", 1, 10, files)
        planned = plan_close(CatalogState(), {}, "db", interval, (), piece_rows=4_000_000)
        # key ranges that tile the keys
        assert all(a.high == b.low for a, b in zip(planned, planned[1:], strict=False)), planned
        return len(planned)

    assert tasks(10 * 1024 * 1024) == 1  # 200,000 narrow rows: one task
    assert tasks(INTERVAL_PIECE_BYTES) == 2  # the same rows, twice the bytes a task reads
    assert tasks(3 * INTERVAL_PIECE_BYTES) == 6


@pytest.mark.parametrize("snapshots_before", [0, 1])
def test_a_due_snapshot_is_written_by_closing_its_interval_not_whole_then_split(tmp_path, monkeypatch,
                                                                                snapshots_before):
    """The snapshot that ends the open interval comes out of the one pass that closes the interval,
    already split (the base snapshot's rows still current, and a piece holding the versions current
    at it): no piece is written whole and read back. Its rows, the marks, and every answer are those
    of a snapshot written whole and split by closing."""
    from history_pipeline.maintenance import snapshot_pieces, snapshots

    rng = random.Random(4)
    batches = [[CREATE] + [_insert(2, k, k) for k in range(50)]]
    for t in range(3, 9):
        batches.append([_update(t, k, rng.randint(0, 99)) for k in sorted(rng.sample(range(50), 20))])
    batches.append([{"op": "delete", "t": 9, "table_uuid": "T", "key": k} for k in (3, 4, 5)])
    fused = HistoryStore.open(tmp_path / "fused", database="db", settings=ON_REQUEST)
    cut = 2 + snapshots_before * 3  # a first snapshot (and its closed interval) before the measured one
    alive: set[int] = set()
    events = _load(fused, batches[:cut], alive)
    if snapshots_before:
        fused.refresh_snapshots(force=True, spark=False)
    events += _load(fused, batches[cut:], alive)
    # the same store up to the measured snapshot, which it writes whole and then splits
    shutil.copytree(tmp_path / "fused", tmp_path / "split")
    split = HistoryStore.open(tmp_path / "split", database="db", settings=ON_REQUEST)
    written_whole: list[object] = []
    real_piece = snapshot_pieces.write_piece

    def spied(task):
        written_whole.append(task)
        return real_piece(task)

    monkeypatch.setattr(snapshot_pieces, "write_piece", spied)
    assert fused.refresh_snapshots(force=True, spark=False).tables == ["T"]
    assert written_whole == []  # the snapshot came out of closing
    with monkeypatch.context() as m:
        m.setattr(snapshots, "open_interval", lambda state, table_uuid: None)
        assert split.refresh_snapshots(force=True, spark=False).tables == ["T"]
    assert written_whole  # the other way round: written whole, then split by closing
    point = fused.frontier + 1
    got, want = _points(fused)[point], _points(split)[point]
    assert _snapshot_rows(fused, got).equals(_snapshot_rows(split, want))
    def shape(files):
        return sorted((f.holds_versions, f.row_count, f.min_key, f.max_key, f.min_t, f.max_t) for f in files)

    assert shape(got) == shape(want) and any(f.holds_versions for f in got)  # the same pieces, split alike
    assert all(f.closed_until == point for f in got)
    assert closed_intervals(fused.catalog_state(), "T") == []
    assert fused.verify() == []
    _check_items(fused, events, range(2, fused.frontier + 2))
