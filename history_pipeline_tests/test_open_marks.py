"""Marks of the open interval: once enough versions above the newest snapshot are
unmarked, the snapshot's and those versions' files are rewritten with ``superseded_at`` as of the
frontier. A read up to the marks is then a filter (a closed read); a later one takes the rows
current at the marks and overlays the versions since. Each test asserts which read is taken (on
the selection, not on timing) and that every answer equals the model at every T."""

from __future__ import annotations

import random
import shutil
from dataclasses import replace

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from history_pipeline import HistoryStore, StoreSettings, supertable
from history_pipeline.catalog.files import is_closed_read, is_marked_read, select_files
from history_pipeline.catalog.model import FileKind
from history_pipeline.maintenance.snapshots import marking_due, marking_share, open_interval
from history_pipeline.query.scan import live_sql
from history_pipeline.schema import replay_schema_history
from history_pipeline.supertable import SUPERSEDED
from history_pipeline.supertable.read import overlay
from history_pipeline_tests.test_closed_intervals import _check_items, _check_lookups, tiny_row_groups  # noqa: F401
from history_pipeline_tests.test_compaction import _split, check_against_model, random_history, write
from history_pipeline_tests.test_query_layers import CREATE, _delete, _insert, _load, _update
from history_pipeline_tests.test_read_path import check_sql_against_model

#: a snapshot after 60 versions (0.2 of the live rows when more), the open interval marked once 15
#: of them are unmarked: a few batches between snapshots, each interval marked about twice
MARKED = StoreSettings(snapshot_min_versions=60, snapshot_ratio=0.2, mark_open_fraction=0.25)


def _load_and_mark(store, batches, alive):
    """Each batch compacted, then the maintenance after it (which marks the open interval when due).

    In-process: the marking's tasks are those of closing an interval, run on Spark by
    test_intervals_are_closed_by_spark_tasks_over_key_ranges_on_s3, and the open interval is marked
    on Spark by test_the_refresh_reports_the_files_it_marked."""
    events = []
    for batch in batches:
        events += _load(store, [batch], alive)
        store.refresh_snapshots(spark=False)
    return events


def _history(store, tail=5, alive=None, rounds=14):
    """Inserts, then ``rounds`` batches of updates, deletes and re-inserts; then a snapshot, 20
    updates (a marking's share: the open interval is marked as of the frontier) and ``tail``
    updates too few for the next marking, so the latest T reads above the marks."""
    alive = set() if alive is None else alive
    events, rng, t = _marked_history(store, alive, rounds)
    return events + _updates(store, rng, t, tail, alive)


def _marked_history(store, alive, rounds=14):
    """``_history`` up to its marking; with the random draws and the next t, to go on from there."""
    rng = random.Random(11)
    batches = [[CREATE] + [_insert(2, k, k) for k in range(40)]]
    t = 3
    for _ in range(rounds):
        batch = []
        for _ in range(rng.randint(1, 2)):
            keys = rng.sample(range(50), 12)
            batch += [_update(t, k, rng.randint(0, 100)) for k in keys[:6]]
            batch += [_delete(t, k) for k in keys[6:9]] + [_insert(t, k, rng.randint(0, 100)) for k in keys[9:]]
            t += 1
        batches.append(batch)
    events = _load_and_mark(store, batches, alive)
    store.refresh_snapshots(force=True, spark=False)
    events += _updates(store, rng, t, 20, alive)
    return events, rng, t + 20


def _updates(store, rng, t, n, alive):
    """``n`` updates of live keys, a timestamp each from ``t`` on (every T between them is read)."""
    if not n:
        return []
    keys = rng.sample(sorted(alive), n)
    return _load_and_mark(store, [[_update(t + i, k, rng.randint(0, 100)) for i, k in enumerate(keys)]], alive)


@pytest.fixture(scope="module")
def marked_root(tmp_path_factory):
    """``_history`` without its tail, built once: a root to copy, its events, live keys, draws and next t."""
    root = tmp_path_factory.mktemp("marked") / "root"
    alive: set[int] = set()
    events, rng, t = _marked_history(HistoryStore.open(root, database="db", settings=MARKED), alive)
    return root, events, alive, rng.getstate(), t


def _copy_of(marked_root, tmp_path):
    """A store of its own on a copy of ``marked_root``, with the history's events, live keys,
    draws and next t."""
    root, events, alive, state, t = marked_root
    shutil.copytree(root, tmp_path / "root")
    rng = random.Random()
    rng.setstate(state)
    return HistoryStore.open(tmp_path / "root", database="db", settings=MARKED), list(events), set(alive), rng, t


def _reads(store, table="T"):
    """Each T's read: "closed" (a filter), "marked" (above the marks) or "layered"."""
    state = store.catalog_state()
    kinds = {}
    for as_of in range(2, store.frontier + 2):
        selection = select_files(state, table, as_of)
        kinds[as_of] = ("closed" if is_closed_read(store.objects, selection)
                        else "marked" if is_marked_read(store.objects, selection) else "layered")
    return kinds


def _open_marks(store, table="T"):
    """The marks U of the open interval's files (None: not marked)."""
    interval = open_interval(store.catalog_state(), table)
    marks = {f.closed_until for f in interval.files} if interval else set()
    return max(marks - {None}, default=None)


@pytest.mark.slow
def test_every_t_up_to_the_open_marks_is_a_filter_and_above_them_an_overlay_equal_to_the_model(tmp_path,
                                                                                               marked_root):
    store, events, alive, rng, t = _copy_of(marked_root, tmp_path)
    events += _updates(store, rng, t, 5, alive)  # _history's tail
    snapshots = sorted({f.snapshot_as_of for f in store.catalog_state().files_of("T", FileKind.SNAPSHOT)})
    marks = _open_marks(store)
    assert snapshots and marks is not None and snapshots[-1] < marks <= store.frontier
    reads = _reads(store)
    for as_of, read in reads.items():
        expected = "closed" if as_of < snapshots[-1] or as_of <= marks else "marked"
        assert read == expected or (as_of == 2 and read == "layered"), (as_of, read)  # at 2 nothing is read
    assert list(reads.values()).count("marked") >= 2
    # not due again: the versions since the marks are fewer than a marking's share
    assert marking_due(store.catalog_state(), 60, 0.2, 0.25) == []
    # the SQL above the marks takes the rows current at them as its base layer, not the snapshot
    state = store.catalog_state()
    supers = replay_schema_history(state.schema_history).supercolumns["T"]
    with duckdb.connect() as db:
        sql = live_sql(store.objects, state, "T", supers, store.frontier + 1, [s.name for s in supers], "v", db).sql
    assert f'"{SUPERSEDED}" IS NULL' in sql
    _check_items(store, events, range(2, store.frontier + 2))
    _check_lookups(store, events, [snapshots[-1], marks - 1, marks, store.frontier + 1])
    assert store.verify() == []  # every mark agrees with the versions


@pytest.mark.slow
def test_the_open_interval_is_marked_again_as_it_grows_and_closed_by_the_next_snapshot(tmp_path, marked_root):
    store, events, alive, _, _ = _copy_of(marked_root, tmp_path)  # _history without a tail
    seen = {_open_marks(store)}
    rng = random.Random(3)
    t = store.frontier + 1
    for _ in range(12):
        events += _load_and_mark(store, [[_update(t, k, rng.randint(0, 100)) for k in rng.sample(sorted(alive), 8)]],
                                 alive)
        seen.add(_open_marks(store))
        t += 1
    # every other batch reaches a marking's share (15 versions): marked as of later frontiers,
    # and a snapshot (60 versions) closes the interval, whose files are then marked for it
    assert len(seen - {None}) >= 3
    snapshots = sorted({f.snapshot_as_of for f in store.catalog_state().files_of("T", FileKind.SNAPSHOT)})
    assert all(f.closed_until in (None, *snapshots, *seen) for f in store.catalog_state().files_of("T"))
    _check_items(store, events, range(2, store.frontier + 2))
    assert store.verify() == []


def test_the_marking_share_is_of_the_snapshot_threshold_or_of_the_live_rows_when_snapshots_are_sparser():
    assert marking_share(60, 0.2, 400, 0.25) == 0.25 * 80  # snapshots every 0.2x the live rows
    assert marking_share(1_000_000, 1.0, 1_000_000, 0.25) == 250_000
    assert marking_share(1_000_000, 3.0, 1_000_000, 0.25) == 250_000  # not 0.25 x 3M
    assert marking_share(200_000, 3.0, 10, 0.25) == 50_000  # a small table: of the minimum
    assert marking_share(10, 3.0, 0, 0.0) == 1.0


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_row_groups")  # many row groups: buckets and cells in small files
def test_sparse_snapshots_long_intervals_in_cells_by_t_and_marks_equal_the_model(tmp_path, monkeypatch):
    """Snapshots three times the live rows apart: the closed intervals are long (their superseded
    rows laid out in cells by t as well), and the open interval is marked every quarter of the
    live rows, not of the next snapshot's threshold. Every T equals the model."""
    monkeypatch.setattr(supertable, "CLOSED_TIME_BUCKETS", 3)
    settings = StoreSettings(snapshot_min_versions=20, snapshot_ratio=3.0, mark_open_fraction=0.25)
    store = HistoryStore.open(tmp_path, database="db", settings=settings)
    rng = random.Random(4)
    alive: set[int] = set()
    events = _load_and_mark(store, [[CREATE] + [_insert(2, k, k) for k in range(40)]], alive)
    t, marks_seen = 3, set()
    for _ in range(32):
        batch = [_update(t, k, rng.randint(0, 100)) for k in rng.sample(sorted(alive), 9)]
        if t % 4 == 0:
            gone = rng.choice(sorted(alive))
            batch += [_delete(t + 1, gone), _insert(t + 2, gone, rng.randint(0, 100))]
            t += 2
        events += _load_and_mark(store, [batch], alive)
        marks_seen.add(_open_marks(store))
        t += 1
    # fewer versions than a marking's share: the latest T reads above the marks
    events += _load_and_mark(store, [[_update(t, k, 7) for k in sorted(alive)[:3]]], alive)
    state = store.catalog_state()
    snapshots = sorted({f.snapshot_as_of for f in state.files_of("T", FileKind.SNAPSHOT)})
    assert len(snapshots) >= 3
    # a closed interval of over 3x the 40 live rows
    assert sum(1 for e in events if e.get("key") is not None and snapshots[1] <= e["t"] < snapshots[2]) >= 120
    assert len(marks_seen - {None}) >= 4  # a marking each ~10 versions, not each ~30
    assert any(f.closed_layout == supertable.CLOSED_LAYOUT for f in state.files_of("T") if f.closed_until)
    reads = _reads(store)
    assert "closed" in reads.values() and "marked" in reads.values()
    _check_items(store, events, range(2, store.frontier + 2))
    _check_lookups(store, events, range(2, store.frontier + 2, 5))
    assert store.verify() == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", [5, 21])
def test_random_histories_with_schema_changes_and_marks_equal_the_model(tmp_path, seed):
    events = random_history(seed, n_events=160)
    store = HistoryStore.open(tmp_path, database="db",
                              settings=StoreSettings(snapshot_min_versions=30, snapshot_ratio=0.2,
                                                     mark_open_fraction=0.2))
    batches = _split(events, random.Random(seed))
    for batch in batches[:-1]:
        write(store, batch)
        store.compact(spark=False)
        store.refresh_snapshots(spark=False)  # the maintenance after compaction marks
    # the last batch neither marks nor snapshots (as between two markings): T above the marks
    unmarking = HistoryStore.open(tmp_path, database="db", settings=replace(
        store.settings, mark_open_fraction=0, snapshot_min_versions=10**9))
    write(unmarking, batches[-1])
    unmarking.compact(spark=False)
    state = store.catalog_state()
    tables = sorted({f.table_uuid for f in state.files.values() if f.table_uuid})
    kinds = [_reads(store, table) for table in tables]
    assert any("marked" in k.values() for k in kinds), kinds
    check_against_model(store, events)
    check_sql_against_model(store, events, range(0, store.frontier + 2))
    assert store.verify() == []


def test_marks_on_an_s3_root(tmp_path, s3_bucket, s3_options):
    store = HistoryStore.open(s3_bucket, database="db", wal_dir=tmp_path / "wal", s3=s3_options, settings=MARKED)
    # a short history: the marking on S3 is the point (closing on S3: test_the_closed_layout_on_an_s3_root)
    events = _history(store, rounds=3)
    reads = _reads(store)
    marked = [t for t, read in reads.items() if read == "marked"]
    assert marked and reads[marked[0] - 1] == "closed"  # up to the marks a filter, above them an overlay
    _check_items(store, events, [marked[0] - 1, marked[0], store.frontier + 1])


@pytest.mark.slow
def test_merge_and_rebuild_keep_the_open_marks_right(tmp_path):
    store = HistoryStore.open(tmp_path, database="db", settings=replace(MARKED, interval_piece_rows=20))
    events = _history(store)
    store.merge(spark=False)
    merged = _reads(store)
    assert "marked" in merged.values() and "closed" in merged.values()
    store.rebuild_catalog()
    assert _reads(store) == merged  # the marks are read back from the files' footers
    _check_items(store, events, range(2, store.frontier + 2))
    assert store.verify() == []


@pytest.mark.parametrize("seed", range(20))
def test_an_overlay_of_rows_current_in_any_order_equals_a_dict_model(seed):
    """``overlay`` with ``current``: the base's live rows given as unsorted row numbers (as a
    filter over marked files finds them), the changes' newest version per key over them."""
    rng = np.random.default_rng(seed)
    universe = int(rng.choice([60, 10_000, 2**62]))
    keys = rng.choice(universe, size=int(rng.integers(0, 50)), replace=False).astype(np.int64) \
        if universe < 2**62 else np.unique(rng.integers(0, universe, 50, dtype=np.int64))
    rng.shuffle(keys)
    dead = rng.random(len(keys)) < 0.2  # rows the filter does not keep (superseded, deleted)
    base = pa.table({"synthetic_key": keys, "is_deleted": pa.array([False] * len(keys)),
                     "logical_timestamp": pa.array(np.full(len(keys), 1, np.int64)),
                     "v": pa.array(rng.integers(0, 100, len(keys)))})
    current = np.flatnonzero(~dead)
    rng.shuffle(current)
    n = int(rng.integers(0, 40))
    pool = keys if len(keys) and rng.random() < 0.7 else np.arange(5, dtype=np.int64)
    changed = rng.choice(pool, size=n) if len(pool) else np.zeros(0, np.int64)
    changes = pa.table({"synthetic_key": pa.array(changed, pa.int64()),
                        "is_deleted": pa.array(rng.random(n) < 0.3),
                        "logical_timestamp": pa.array(np.arange(2, n + 2), pa.int64()),
                        "v": pa.array(rng.integers(0, 100, n))})
    model = {int(k): int(v) for k, v in zip(keys[current], base.column("v").to_numpy()[current], strict=True)}
    for k, d, v in zip(changed, changes.column("is_deleted").to_pylist(), changes.column("v").to_pylist(),
                       strict=True):
        if d:
            model.pop(int(k), None)
        else:
            model[int(k)] = v
    got = overlay(base, changes, ["synthetic_key", "v"], current=current)
    assert got.column("synthetic_key").to_pylist() == sorted(model)
    assert dict(zip(got.column("synthetic_key").to_pylist(), got.column("v").to_pylist(), strict=True)) == model


@pytest.mark.spark
def test_the_refresh_reports_the_files_it_marked(tmp_path, marked_root):
    """Versions compacted by a store that does not mark are marked by the next refresh (on Spark),
    which says how many files it replaced; a refresh with nothing due marks nothing."""
    store, events, alive, _, _ = _copy_of(marked_root, tmp_path)  # _history without a tail
    before = _open_marks(store)
    unmarking = HistoryStore.open(tmp_path / "root", database="db", settings=replace(MARKED, mark_open_fraction=0))
    t = store.frontier + 1
    events += _load(unmarking, [[_update(t + i, k, 1) for i, k in enumerate(sorted(alive)[:16])]], alive)
    assert _open_marks(store) == before
    summary = store.refresh_snapshots()
    assert summary.marked_files >= 2 and summary.tables == []  # the snapshot's files and the versions'
    assert _open_marks(store) == store.frontier + 1 > before
    assert store.refresh_snapshots().marked_files == 0
    _check_items(store, events, range(before - 1, store.frontier + 2))
