"""The shapes sql() reconstructs a table from as of T (query/scan.py ``live_sql``): a snapshot alone,
versions alone, a head of one-timestamp files plus a tail, multi-timestamp files, deletes then
re-inserts after a snapshot, T between versions. Each shape is checked at every T against the
reference model, with a filter the reconstruction must not apply too early, and the shape itself is
asserted so that the test fails if the fast path it means to cover is not taken."""

from __future__ import annotations

import duckdb
import pytest

from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.catalog.model import FileKind
from history_pipeline.errors import SandboxViolationError
from history_pipeline.query.scan import live_sql, select_files, version_layers
from history_pipeline_tests.model import BaseDatabase
from history_pipeline_tests.test_compaction import write
from history_pipeline_tests.test_read_path import check_sql_against_model

CREATE = {"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "items",
          "columns": [{"column_uuid": "a", "column_name": "a", "data_type": "BIGINT"},
                      {"column_uuid": "n", "column_name": "note", "data_type": "TEXT"}]}


def _insert(t, key, a):
    return {"op": "insert", "t": t, "table_uuid": "T", "key": key, "values": {"a": a, "n": f"k{key} t{t}"}}


def _update(t, key, a):
    return {"op": "update", "t": t, "table_uuid": "T", "key": key, "values": {"a": a}}


def _delete(t, key):
    return {"op": "delete", "t": t, "table_uuid": "T", "key": key}


def _valid(batches, alive=None):
    """The batches without the events a real stream could not hold (an update or delete of a key
    that is not alive, an insert of one that is); ``alive``: the keys alive before them (updated)."""
    alive = set() if alive is None else alive
    out = []
    for batch in batches:
        kept = []
        for e in batch:
            key = e.get("key")
            if e["op"] == "insert" and key not in alive:
                alive.add(key)
            elif e["op"] in ("update", "delete") and key in alive:
                if e["op"] == "delete":
                    alive.discard(key)
            elif e["op"] in ("insert", "update", "delete"):
                continue  # schema events pass
            kept.append(e)
        out.append(kept)
    return out


def _load(store, batches, alive=None):
    events = []
    for batch in _valid(batches, alive):
        write(store, batch)
        store.compact(spark=False)
        events += batch
    return events


def _check(store, events):
    """Every T against the model: whole rows, and a filtered aggregate (a newer version that fails
    the filter must hide the older one that passes it)."""
    check_sql_against_model(store, events, range(0, store.frontier + 2))
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    for as_of in range(2, store.frontier + 2):
        rows = model.table_as_of("items", as_of) or {}
        kept = [r["a"] for r in rows.values() if r["a"] is not None and r["a"] >= 50]
        got = store.sql("SELECT count(*) AS c, sum(a) AS s FROM items WHERE a >= 50", as_of).to_pylist()
        assert got == [{"c": len(kept), "s": sum(kept) if kept else None}], as_of


def _shape(store, as_of):
    selection = select_files(store.catalog_state(), "T", as_of)
    head, tail = version_layers(selection.versions)
    return bool(selection.snapshot), len(head), len(tail)


def test_versions_only_one_timestamp_head_and_a_tail_of_updates_deletes_and_reinserts(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    events = _load(store, [
        [CREATE] + [_insert(2, k, k) for k in range(100)],
        [_update(3, k, 100 + k) for k in range(0, 100, 3)] + [_delete(3, k) for k in range(1, 100, 5)],
        [_insert(4, k, 7) for k in range(1, 100, 10)] + [_update(4, k, 1) for k in range(0, 100, 9)],
        [_delete(5, k) for k in range(0, 30)] + [_insert(6, k, 60 + k) for k in range(0, 10)],
    ])
    assert _shape(store, 3) == (False, 1, 0)  # the head alone: no keep-latest at all
    assert _shape(store, store.frontier + 1)[:2] == (False, 1) and _shape(store, store.frontier + 1)[2] >= 2
    _check(store, events)


def test_multi_timestamp_files_take_the_keep_latest_path_at_every_t_between_versions(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    batch = [CREATE] + [_insert(2, k, k) for k in range(40)]
    for t in range(3, 9):  # one segment of many timestamps: a key has several versions in one file
        batch += [_update(t, k, 10 * t + k) for k in range(t % 3, 40, 4)]
        batch += [_delete(t, k) for k in range(t, 40, 11)] + [_insert(t, 40 + t, t)]
    events = _load(store, [batch])
    assert _shape(store, 5) == (False, 0, 1)  # no head: one file holds t = 2..8
    _check(store, events)


def test_snapshot_alone_then_deletes_and_reinserts_after_it(tmp_path):
    store = HistoryStore.open(tmp_path, database="db",
                              settings=StoreSettings(snapshot_min_versions=4, snapshot_ratio=0.5))
    first = [CREATE] + [_insert(2, k, k) for k in range(60)]
    after = [_delete(3, k) for k in range(0, 10)] + [_update(3, 20, 500)]
    after += [_insert(4, k, 90 + k) for k in range(0, 5)] + [_update(4, 20, 3), _delete(5, 30)]
    events = _load(store, [first, after])
    snapshots = [f for f in store.catalog_state().files_of("T", FileKind.SNAPSHOT)]
    assert snapshots
    snapshot_as_of = max(f.snapshot_as_of for f in snapshots)
    assert _shape(store, snapshot_as_of) == (True, 0, 0)  # no version after the snapshot: a plain scan
    assert _shape(store, store.frontier + 1) == (True, 0, 1)  # a multi-timestamp file after it
    _check(store, events)


def test_snapshot_then_a_head_and_a_tail(tmp_path):
    store = HistoryStore.open(tmp_path, database="db",
                              settings=StoreSettings(snapshot_min_versions=4, snapshot_ratio=0.5))
    events = _load(store, [
        [CREATE] + [_insert(2, k, k) for k in range(60)],
        [_delete(3, k) for k in range(0, 8)] + [_update(3, k, 70 + k) for k in range(40, 48)],
        [_insert(4, k, 55) for k in range(0, 4)] + [_update(4, 41, 2)],
        [_delete(5, 0), _insert(5, 99, 99)],
    ])
    assert _shape(store, store.frontier + 1) == (True, 1, 2)
    _check(store, events)


def _live(store, as_of):
    """The SQL sql() reads items with at ``as_of``."""
    context = store.query_context()
    descriptor = context.resolve("items", as_of)
    return live_sql(store.objects, context.state, "T", context.supercolumns("T"), as_of,
                    [c.supercolumn for c in descriptor.columns], "probe", duckdb.connect())


def _kept_tail(store, as_of):
    """Does sql() keep the tail's newest rows as a table at ``as_of`` (the small-tail path)?"""
    return _live(store, as_of).kept_tail


@pytest.mark.slow
@pytest.mark.parametrize("root", ["local", "s3"])
def test_a_small_tail_is_kept_as_a_table_over_a_head_or_a_snapshot(tmp_path, request, root):
    """A tail of small version files above a large head (or snapshot) is read from a table of its
    newest rows per key, the head's and snapshot's files scanned beneath it: every T equals the
    model, including deletes and re-inserts in the tail, a column added in the tail (files of two
    schemas), and T inside the tail."""
    settings = StoreSettings(snapshot_min_versions=10**6)
    if root == "local":
        store = HistoryStore.open(tmp_path / "root", database="db", settings=settings)
    else:
        store = HistoryStore.open(request.getfixturevalue("s3_bucket"), database="db", wal_dir=tmp_path / "wal",
                                  s3=request.getfixturevalue("s3_options"), settings=settings)
    added = {"op": "add_column", "t": 5, "table_uuid": "T",
             "column": {"column_uuid": "b", "column_name": "b", "data_type": "TEXT"}}
    alive: set[int] = set()
    events = _load(store, [
        [CREATE] + [_insert(2, k, k % 97) for k in range(400)],
        [_update(3, k, 100 + k) for k in range(0, 400, 37)] + [_delete(3, k) for k in range(5, 400, 53)],
        [_insert(4, k, 70) for k in range(5, 400, 106)] + [_update(4, 0, 51), _delete(4, 37)],
        [added, {"op": "update", "t": 6, "table_uuid": "T", "key": 74, "values": {"b": "x", "a": 99}},
         {"op": "insert", "t": 6, "table_uuid": "T", "key": 1000, "values": {"a": 60, "n": "new", "b": "y"}}],
    ], alive)
    assert _shape(store, 3) == (False, 1, 0) and not _kept_tail(store, 3)  # the head alone
    assert all(_kept_tail(store, t) for t in range(4, store.frontier + 2))
    _check(store, events)
    # a snapshot beneath, then a head of one timestamp and a tail of two: the snapshot is scanned
    # and anti-joined with the head's and the kept tail's keys
    store.refresh_snapshots(force=True, spark=False)
    events += _load(store, [[_update(8, k, 55) for k in range(1, 400, 41)] + [_delete(8, 2)],
                            [_insert(9, 2, 66), _update(9, 1, 77), _update(10, 1, 78), _delete(10, 42)]], alive)
    assert _shape(store, store.frontier + 1) == (True, 1, 1) and _kept_tail(store, store.frontier + 1)
    # every change together is small beside the snapshot: the head's rows are kept with the tail's,
    # and only the snapshot's files are scanned
    head, _ = version_layers(select_files(store.catalog_state(), "T", store.frontier + 1).versions)
    kept = _live(store, store.frontier + 1).materialized_sql
    assert head and "__head" not in kept and not any(f.path.rsplit("/", 1)[-1] in kept for f in head)
    _check(store, events)
    # a snapshot beneath and no head (the file after it holds two timestamps): tail kept alone
    store.refresh_snapshots(force=True, spark=False)
    events += _load(store, [[_update(12, 3, 1), _delete(12, 4), _update(13, 3, 2), _insert(13, 4, 88)]], alive)
    assert _shape(store, store.frontier + 1) == (True, 0, 1) and _kept_tail(store, store.frontier + 1)
    _check(store, events)


def test_the_per_t_schemas_of_the_sandbox_cannot_be_named(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    _load(store, [[CREATE] + [_insert(2, k, k) for k in range(5)], [_update(3, 1, 50)]])
    assert store.sql("SELECT a FROM items WHERE synthetic_key = 1", 4).to_pylist() == [{"a": 50}]
    for query in ('SELECT a FROM "__hp_asof_4".items', "select * from __HP_ASOF_4.items"):
        with pytest.raises(SandboxViolationError, match="internal"):
            store.sql(query, 3)
    # the view made for T=4 does not answer for T=3
    assert store.sql("SELECT a FROM items WHERE synthetic_key = 1", 3).to_pylist() == [{"a": 1}]


def test_streamed_load_table_keeps_uuid_and_json_types_on_the_shared_reader_database(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    create = {"op": "create_table", "t": 1, "table_uuid": "U", "table_name": "typed",
              "columns": [{"column_uuid": "u", "column_name": "u", "data_type": "UUID"},
                          {"column_uuid": "j", "column_name": "j", "data_type": "JSONB"}]}
    rows = [{"op": "insert", "t": 2, "table_uuid": "U", "key": k,
             "values": {"u": f"0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a{k:02d}", "j": {"k": [k, None]}}} for k in range(20)]
    change = [{"op": "update", "t": 3, "table_uuid": "U", "key": 4, "values": {"j": {"k": "new"}}},
              {"op": "delete", "t": 3, "table_uuid": "U", "key": 5}]
    _load(store, [[create] + rows, change])
    for as_of in (2, 3, 4):
        for _ in range(2):  # the second read reuses the database the first one opened
            streamed = store.load_table_reader("typed", as_of, batch_size=7, ordered=True).read_all()
            assert streamed.equals(store.load_table("typed", as_of, ordered=True)), as_of
            # by default too, a stream read whole is the table (no closed read here: key order both)
            assert store.load_table_reader("typed", as_of, batch_size=7).read_all().equals(
                store.load_table("typed", as_of)), as_of
