"""The change feed against the independent model: random histories with every kind of schema change,
renames and drops, compacted in-process segment by segment (so snapshots, backfills and closed
intervals are read), give for every window [since, until) exactly the changes the model derives, in
(t, table, key) order, each row version's before and after equal to the state as of t and t + 1;
resuming from a batch's cursor gives exactly the rest; erased keys never appear; retention refuses
a window that starts before the earliest point and names it."""

from __future__ import annotations

import random

import pytest

from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.errors import FutureTimestampError, PurgedTimestampError, QueryError, TableNotFoundError
from history_pipeline_tests.model import BaseDatabase, erase_keys, names_of
from history_pipeline_tests.test_compaction import _split, random_history, write

SMALL_SNAPSHOTS = StoreSettings(snapshot_min_versions=6, snapshot_ratio=0.5, spark_master=None)
SCHEMA_OPS = {"create_table", "drop_table", "rename_table", "add_column", "drop_column", "rename_column",
              "change_column_type", "change_column_nullable", "reorder_column"}


def _name(model, uuid, as_of):
    table = model.state_as_of(as_of).get(uuid)
    return None if table is None else table["name"]


def _row(model, uuid, key, as_of):
    table = model.state_as_of(as_of).get(uuid)
    if table is None or key not in table["rows"]:
        return None
    return {name: table["rows"][key].get(cu) for cu, name, _ in names_of(model, uuid, as_of)}


def expected_changes(model, events, since, until, uuids=None):
    """(t, table, uuid, key, op, before, after) of every change in [since, until), as the model derives."""
    out = []
    for t in sorted({e["t"] for e in events if since <= e["t"] < until and e["op"] != "close"}):
        at_t = [e for e in events if e["t"] == t and (uuids is None or e.get("table_uuid") in uuids)]
        for e in at_t:
            if e["op"] in SCHEMA_OPS:
                name = _name(model, e["table_uuid"], t + 1) or _name(model, e["table_uuid"], t)
                out.append((t, name, e["table_uuid"], None, e["op"]))
        for uuid, key in sorted({(e["table_uuid"], e["key"]) for e in at_t if "key" in e}):
            before, after = _row(model, uuid, key, t), _row(model, uuid, key, t + 1)
            if before is None and after is None:
                continue  # born and gone within one transaction: no version
            op = "delete" if after is None else "insert" if before is None else "update"
            out.append((t, _name(model, uuid, t + 1) or _name(model, uuid, t), uuid, key, op, before, after))
    return sorted(out, key=lambda r: (r[0], r[1], r[3] if r[3] is not None else -(2**63)))


def delivered(batches):
    """The feed's records as tuples comparable with ``expected_changes`` (schema records without images)."""
    out = []
    for batch in batches:
        for r in batch.records.to_pylist():
            if r["key"] is None:
                out.append((r["t"], r["table"], r["table_uuid"], None, r["op"]))
            else:
                out.append((r["t"], r["table"], r["table_uuid"], r["key"], r["op"], r["before"], r["after"]))
    return out


def _compacted(tmp_path, events, seed):
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    for batch in _split(events, random.Random(seed)):
        write(store, batch)
        store.compact(spark=False)
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    return store, model


@pytest.mark.parametrize("seed", [3, 8, pytest.param(21, marks=pytest.mark.slow)])
def test_changes_equal_the_model_for_every_window(tmp_path, seed):
    events = random_history(seed, n_events=90)
    store, model = _compacted(tmp_path, events, seed)
    until = store.frontier + 1
    ops = {e["op"] for e in events}
    assert {"rename_table", "change_column_type", "add_column"} & ops  # schema changes are in the stream
    expected = expected_changes(model, events, 0, until)
    assert delivered(store.changes(since=0)) == expected
    rng = random.Random(seed)
    for _ in range(3):
        since = rng.randrange(0, until + 1)
        end = rng.randrange(since, until + 1)
        assert delivered(store.changes(since=since, until=end)) == expected_changes(model, events, since, end)


def test_a_long_window_read_in_pieces_of_t_gives_the_same_changes(tmp_path, monkeypatch):
    from history_pipeline.query import changes as feed

    events = random_history(3, n_events=90)
    store, model = _compacted(tmp_path, events, 3)
    whole = delivered(store.changes(since=0))
    state = store.catalog_state()
    monkeypatch.setattr(feed, "CHUNK_ROWS", 6)
    assert len(feed.chunks(state, feed.matching_tables(state.schema_history, None), 0, store.frontier + 1)) > 5
    assert delivered(store.changes(since=0)) == whole == expected_changes(model, events, 0, store.frontier + 1)


def test_before_and_after_are_fetch_row_as_of_t_and_t_plus_one(tmp_path):
    events = random_history(5, n_events=70)
    store, _ = _compacted(tmp_path, events, 5)
    rows = [r for b in store.changes(since=0) for r in b.records.to_pylist() if r["key"] is not None]
    assert rows
    for r in rows[::3]:
        assert store.fetch_row(r["table_uuid"], r["key"], as_of=r["t"] + 1) == r["after"]
        before_name = r["table"]
        # the row before is fetched under the same table, whatever it was named then
        assert store.fetch_row(r["table_uuid"], r["key"], as_of=r["t"]) == r["before"], (before_name, r["t"])


@pytest.mark.parametrize("seed", [3, pytest.param(8, marks=pytest.mark.slow)])
def test_resuming_from_each_cursor_gives_exactly_the_rest(tmp_path, seed):
    events = random_history(seed, n_events=90)
    store, _ = _compacted(tmp_path, events, seed)
    batches = list(store.changes(since=0))
    everything = delivered(batches)
    assert len(batches) > 3
    for i in sorted(random.Random(seed).sample(range(len(batches)), 4)):
        batch = batches[i]
        rest = delivered(store.changes(since=batch.cursor))
        seen = delivered(batches[: i + 1])
        # at-least-once: the rows of an unfinished transaction come again, nothing is skipped
        redelivered = [r for r in seen if r[0] >= batch.cursor]
        assert redelivered + everything[len(seen):] == rest
        assert all(r[0] == batch.cursor for r in redelivered)


def test_a_table_is_followed_across_its_rename_and_only_it(tmp_path):
    create = {"op": "create_table", "t": 1, "table_uuid": "A", "table_name": "orders",
              "columns": [{"column_uuid": "q", "column_name": "qty", "data_type": "BIGINT"}]}
    other = {"op": "create_table", "t": 2, "table_uuid": "B", "table_name": "other",
             "columns": [{"column_uuid": "x", "column_name": "x", "data_type": "TEXT"}]}
    events = [create, other,
              {"op": "insert", "t": 3, "table_uuid": "A", "key": 1, "values": {"q": 5}},
              {"op": "insert", "t": 3, "table_uuid": "B", "key": 1, "values": {"x": "a"}},
              {"op": "rename_table", "t": 4, "table_uuid": "A", "new_name": "purchases"},
              {"op": "change_column_type", "t": 5, "table_uuid": "A", "column_uuid": "q", "data_type": "TEXT"},
              {"op": "update", "t": 6, "table_uuid": "A", "key": 1, "values": {"q": "7"}},
              {"op": "delete", "t": 7, "table_uuid": "A", "key": 1}]
    store, model = _compacted(tmp_path, events, 1)
    got = delivered(store.changes(tables=["orders"], since=3))
    assert got == expected_changes(model, events, 3, 8, uuids={"A"})
    assert [r[4] for r in got] == ["insert", "rename_table", "change_column_type", "update", "delete"]
    update = got[3]
    assert update[1] == "purchases" and update[5] == {"qty": "5"} and update[6] == {"qty": "7"}  # cast before-image
    with pytest.raises(TableNotFoundError, match="no table named 'nothing'"):
        store.changes(tables=["nothing"], since=0)


def test_window_errors_are_typed_and_say_the_bounds(tmp_path):
    events = random_history(2, n_events=30)
    store, _ = _compacted(tmp_path, events, 2)
    with pytest.raises(FutureTimestampError, match=f"frontier is {store.frontier}"):
        store.changes(since=0, until=store.frontier + 2)
    with pytest.raises(QueryError, match="after until"):
        store.changes(since=5, until=4)
    assert list(store.changes(since=store.frontier + 1)) == []


@pytest.mark.slow
def test_erased_keys_never_appear(tmp_path):
    events = random_history(8, n_events=90)
    store, model = _compacted(tmp_path, events, 8)
    uuid, key = next((e["table_uuid"], e["key"]) for e in events if e["op"] == "update")
    store.erase(uuid, [key], requested_by="privacy desk", spark=False)
    erase_keys(model, uuid, {key})
    got = delivered(store.changes(since=0))
    assert not any(r[2] == uuid and r[3] == key for r in got)
    assert got == expected_changes(model, events, 0, store.frontier + 1)


def test_retention_refuses_a_window_before_the_earliest_point_and_keeps_the_rest(tmp_path):
    events = random_history(3, n_events=90)
    store, model = _compacted(tmp_path, events, 3)
    purge = store.frontier // 2
    store.retain(purge_before=purge, spark=False)
    with pytest.raises(PurgedTimestampError, match=f"earliest point a change feed can start from is {purge}"):
        store.changes(since=purge - 1)
    assert delivered(store.changes(since=purge)) == expected_changes(model, events, purge, store.frontier + 1)


def _orders(t0, keys, qty):
    return [{"op": "insert" if t0 == 2 else "update", "t": t0 + i, "table_uuid": "A", "key": k,
             "values": {"q": qty + i}} for i, k in enumerate(keys)]


def _orders_store(tmp_path):
    create = {"op": "create_table", "t": 1, "table_uuid": "A", "table_name": "orders",
              "columns": [{"column_uuid": "q", "column_name": "qty", "data_type": "BIGINT"}]}
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    write(store, [create, *_orders(2, [1, 2, 3], 10)])
    store.compact(spark=False)
    return store


def test_follow_delivers_commits_compacted_while_it_waits(tmp_path):
    import threading

    store = _orders_store(tmp_path)
    later = _orders(20, [2, 3], 50)

    def commit_later():
        write(store, later)
        store.compact(spark=False)

    writer = threading.Timer(0.3, commit_later)
    writer.start()
    try:
        seen = []
        for batch in store.follow_changes(since=2, poll_seconds=0.05, max_seconds=30):
            seen += [(r["t"], r["key"], r["op"]) for r in batch.records.to_pylist()]
            if batch.cursor > 21:
                break
    finally:
        writer.join()
    assert seen == [(2, 1, "insert"), (3, 2, "insert"), (4, 3, "insert"), (20, 2, "update"), (21, 3, "update")]
    assert batch.cursor == 22


def test_cli_changes_and_a_named_consumer_resume_where_they_stopped(tmp_path):
    import json

    from history_pipeline_tests.cli_support import run_command

    store = _orders_store(tmp_path)

    def cli(*args):
        return run_command(["--root", str(tmp_path), "--database", "db", "changes", *args])

    first = cli("--consumer", "billing", "--since", "0", "--format", "json")
    assert first.returncode == 0, first.stderr
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    assert [(r["t"], r["op"], r["key"]) for r in lines] == [(1, "create_table", None), (2, "insert", 1),
                                                              (3, "insert", 2), (4, "insert", 3)]
    assert lines[1]["after"] == {"qty": 10} and lines[1]["before"] is None and lines[-1]["cursor"] == 5
    assert "cursor 5 (resume with --since 5)" in first.stderr
    assert store.consumer_cursor("billing") == 5
    write(store, _orders(20, [2], 50))
    store.compact(spark=False)
    resumed = cli("--consumer", "billing")  # from the stored cursor
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines() == ['20  update  orders  key 2  {"qty": 50}']
    assert store.consumer_cursor("billing") == 21
    again = cli("--consumer", "billing")
    assert again.stdout == "" and store.consumer_cursor("billing") == 21
    missing = cli("--consumer", "new-one")
    assert missing.returncode == 1 and missing.stderr.startswith("error: give --since T")
    store.retain(purge_before=4, spark=False)
    purged = cli("--since", "1")
    assert purged.returncode == 1
    assert purged.stderr.count("\n") == 1 and "earliest point a change feed can start from is 4" in purged.stderr
