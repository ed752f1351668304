"""The change feed's row before each change, read from the version it supersedes: on a history whose
intervals are all marked (``superseded_at``), no key's row is rebuilt as of a window's start, across
snapshots, type changes, renames, a merge and an erasure; on an unmarked one, a long window read in
pieces looks each key up once (the pieces carry the newest row of each key to the next). Every
answer is the model's."""

from __future__ import annotations

import random

import pytest

from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.query import changes as feed
from history_pipeline_tests.model import BaseDatabase, erase_keys
from history_pipeline_tests.test_changes import SMALL_SNAPSHOTS, _compacted, delivered, expected_changes
from history_pipeline_tests.test_compaction import random_history, write


def _no_rebuild(monkeypatch):
    """Make rebuilding a key's row as of a window's start fail the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a row before a change was rebuilt as of the window's start")

    monkeypatch.setattr(feed, "live_rows", refuse)


def _every_interval_marked(store):
    """Snapshot and mark the open interval; the files holding rows left unmarked (none expected)."""
    store.refresh_snapshots(force=True, spark=False)
    state = store.catalog_state()
    uuids = {e.table_uuid for e in state.schema_history}
    return [f for u in uuids for f in state.files_of(u) if f.row_count and f.closed_until is None]


def _windows(store, seed, n):
    until = store.frontier + 1
    rng = random.Random(seed)
    out = [(0, until)]
    for _ in range(n):
        since = rng.randrange(0, until + 1)
        out.append((since, rng.randrange(since, until + 1)))
    return out


def test_a_marked_history_gives_every_row_before_from_the_version_it_supersedes(tmp_path, monkeypatch):
    events = random_history(3, n_events=90)
    store, model = _compacted(tmp_path, events, 3)
    assert _every_interval_marked(store) == []
    ops = {e["op"] for e in events}
    assert {"change_column_type", "rename_column", "add_column"} <= ops
    _no_rebuild(monkeypatch)
    for since, until in _windows(store, 3, 12):
        assert delivered(store.changes(since=since, until=until)) == expected_changes(model, events, since, until)
    # a long window in many pieces: each piece's rows before come from the pieces before it and the marks
    monkeypatch.setattr(feed, "CHUNK_ROWS", 4)
    assert delivered(store.changes(since=0)) == expected_changes(model, events, 0, store.frontier + 1)


@pytest.mark.slow
def test_marked_rows_before_hold_after_a_merge_and_an_erasure(tmp_path, monkeypatch):
    events = random_history(3, n_events=90)
    store, model = _compacted(tmp_path, events, 3)
    store.merge(spark=False, small_file_bytes=10**9)
    uuid, key = next((e["table_uuid"], e["key"]) for e in events if e["op"] == "update")
    store.erase(uuid, [key], requested_by="privacy desk", spark=False)
    erase_keys(model, uuid, {key})
    assert _every_interval_marked(store) == []
    _no_rebuild(monkeypatch)
    for since, until in _windows(store, 4, 8):
        got = delivered(store.changes(since=since, until=until))
        assert not any(r[2] == uuid and r[3] == key for r in got)
        assert got == expected_changes(model, events, since, until)


def _orders_history():
    """Segments: keys 1..3 written before a snapshot, then a type change (BIGINT to TEXT) in a
    segment of its own, a rename, and updates of keys last written before each."""
    create = {"op": "create_table", "t": 1, "table_uuid": "A", "table_name": "orders",
              "columns": [{"column_uuid": "q", "column_name": "qty", "data_type": "BIGINT"}]}
    return (
        [create, *({"op": "insert", "t": 2, "table_uuid": "A", "key": k, "values": {"q": 10 * k}} for k in (1, 2, 3)),
         {"op": "update", "t": 3, "table_uuid": "A", "key": 1, "values": {"q": 11}},
         {"op": "delete", "t": 4, "table_uuid": "A", "key": 3}],
        [{"op": "update", "t": 5, "table_uuid": "A", "key": 2, "values": {"q": 21}}],
        [{"op": "change_column_type", "t": 6, "table_uuid": "A", "column_uuid": "q", "data_type": "TEXT"}],
        [{"op": "update", "t": 7, "table_uuid": "A", "key": 1, "values": {"q": "x"}},
         {"op": "insert", "t": 8, "table_uuid": "A", "key": 3, "values": {"q": "back"}}],
        [{"op": "rename_table", "t": 9, "table_uuid": "A", "new_name": "sales"},
         {"op": "update", "t": 10, "table_uuid": "A", "key": 2, "values": {"q": "y"}},
         {"op": "delete", "t": 11, "table_uuid": "A", "key": 1}],
    )


def test_rows_before_across_a_snapshot_a_type_change_and_a_rename(tmp_path, monkeypatch):
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    batches = _orders_history()
    for batch in batches:
        write(store, batch)
        store.compact(spark=False)
        store.refresh_snapshots(force=True, spark=False)
    assert _every_interval_marked(store) == []
    _no_rebuild(monkeypatch)
    rows = {r["t"]: r for b in store.changes(tables=["orders"], since=5) for r in b.records.to_pylist()
            if r["key"] is not None}
    # written before the snapshot and before the type change: shown as the table shows it then
    assert (rows[7]["op"], rows[7]["before"], rows[7]["after"]) == ("update", {"qty": "11"}, {"qty": "x"})
    assert (rows[8]["op"], rows[8]["before"], rows[8]["after"]) == ("insert", None, {"qty": "back"})
    assert (rows[10]["table"], rows[10]["before"], rows[10]["after"]) == ("sales", {"qty": "21"}, {"qty": "y"})
    assert (rows[11]["op"], rows[11]["before"], rows[11]["after"]) == ("delete", {"qty": "x"}, None)
    assert rows[5]["before"] == {"qty": 20}
    events = [e for batch in batches for e in batch]
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    for since in range(0, store.frontier + 2):
        assert delivered(store.changes(since=since)) == expected_changes(model, events, since, store.frontier + 1)


def test_a_long_unmarked_window_looks_each_key_up_once(tmp_path, monkeypatch):
    """No snapshot, no mark: a piece's rows before come from the earlier pieces for the keys they
    wrote, and only the others are rebuilt as of the piece's start."""
    store = HistoryStore.open(tmp_path, database="db", settings=StoreSettings(
        snapshot_min_versions=10**9, mark_open_fraction=0.0, spark_master=None))
    rng = random.Random(5)
    create = {"op": "create_table", "t": 1, "table_uuid": "A", "table_name": "orders",
              "columns": [{"column_uuid": "q", "column_name": "qty", "data_type": "BIGINT"}]}
    events = [create, *({"op": "insert", "t": 2, "table_uuid": "A", "key": k, "values": {"q": k}} for k in range(8))]
    for t in range(3, 60):
        events.append({"op": "update", "t": t, "table_uuid": "A", "key": rng.randrange(8), "values": {"q": t}})
    for start in range(0, len(events), 10):
        write(store, events[start:start + 10])
        store.compact(spark=False)
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    asked: list[int] = []
    rebuild = feed.live_rows

    def counted(*args, keys=None, **kwargs):
        asked.extend(keys)
        return rebuild(*args, keys=keys, **kwargs)

    monkeypatch.setattr(feed, "live_rows", counted)
    monkeypatch.setattr(feed, "CHUNK_ROWS", 5)
    since = 3
    assert len(feed.chunks(store.catalog_state(), ["A"], since, store.frontier + 1)) > 5
    assert delivered(store.changes(since=since)) == expected_changes(model, events, since, store.frontier + 1)
    assert sorted(asked) == sorted(set(asked)) and set(asked) <= set(range(8))
    # carrying nothing past a piece gives the same answer, looking keys up again
    asked.clear()
    monkeypatch.setattr(feed, "CARRY_ROWS", 0)
    assert delivered(store.changes(since=since)) == expected_changes(model, events, since, store.frontier + 1)
    assert len(asked) > len(set(asked))


@pytest.mark.parametrize("keys,times,start,after,before", [
    ([5, 5, 7, 5], [1, 3, 2, 4], 2, [2, 1, 3], [-1, 0, 1]),
    ([2**62, -(2**62), 2**62], [9, 9, 10], 9, [1, 0, 2], [-1, -1, 0]),
])
def test_versions_are_paired_with_the_same_key_before_them(keys, times, start, after, before):
    import numpy as np

    got_after, got_before = feed.pair_versions(np.array(keys, dtype=np.int64), np.array(times, dtype=np.int64), start)
    assert got_after.tolist() == after and got_before.tolist() == before
