"""Compaction: worked examples of every operation, every handler, quarantine, crash recovery, and a
property test of the Reconstruction Invariant against an independent in-memory model."""

from __future__ import annotations

import random

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from history_pipeline import HistoryStore, SegmentQuarantinedError
from history_pipeline.catalog.model import FileKind
from history_pipeline.wal import SegmentState
from history_pipeline_tests.model import BaseDatabase


def write(store, *batches):
    """Each batch becomes one sealed segment."""
    with store.wal_writer() as wal:
        for batch in batches:
            for event in batch:
                wal.append(event)
            if batch[-1]["op"] != "close":
                wal.append({"op": "close", "t": batch[-1]["t"]})
            wal.seal()


def supertable_rows(store, table_uuid):
    state = store.catalog_state()
    rows = []
    for f in state.files_of(table_uuid, FileKind.VERSIONS):
        rows += pq.read_table(store.objects.full_path(f.path)).to_pylist()
    return sorted(rows, key=lambda r: (r["logical_timestamp"], r["synthetic_key"]))


T1 = "tbl-example"


def example_events():
    col = {"column_uuid": "col1", "column_name": "column1", "data_type": "TEXT"}
    return [
        {"op": "create_table", "t": 1, "table_uuid": T1, "table_name": "my_table", "columns": [col]},
        {"op": "insert", "t": 2, "table_uuid": T1, "key": 1, "values": {"col1": "value1"}},
        {"op": "insert", "t": 3, "table_uuid": T1, "key": 2, "values": {"col1": "value2"}},
        {"op": "update", "t": 4, "table_uuid": T1, "key": 2, "values": {"col1": "value2_prime"}},
        {"op": "delete", "t": 5, "table_uuid": T1, "key": 1},
    ]


@pytest.mark.spark
def test_worked_example_supertable_states(tmp_path):
    store = HistoryStore.open(tmp_path, database="example")
    write(store, example_events())
    store.compact()
    rows = [
        (r["synthetic_key"], r["col1-1"], r["is_deleted"], r["logical_timestamp"])
        for r in supertable_rows(store, T1)
    ]
    assert rows == [
        (1, "value1", False, 2),
        (2, "value2", False, 3),
        (2, "value2_prime", False, 4),
        (1, None, True, 5),
    ]
    assert store.load_table("my_table", 6).to_pylist() == [{"synthetic_key": 2, "column1": "value2_prime"}]
    assert store.fetch_row("my_table", 2, 4) == {"column1": "value2"}  # pre-image of event 4
    assert store.fetch_row("my_table", 2, 5) == {"column1": "value2_prime"}  # post-image


@pytest.mark.spark
def test_worked_example_schema_history_states(tmp_path):
    store = HistoryStore.open(tmp_path, database="example")
    col1 = {"column_uuid": "u1", "column_name": "column1", "data_type": "BIGINT"}
    col2 = {"column_uuid": "u2", "column_name": "column2", "data_type": "TEXT"}
    write(
        store,
        [
            {"op": "create_table", "t": 1, "table_uuid": T1, "table_name": "my_table", "columns": [col1]},
            {"op": "insert", "t": 2, "table_uuid": T1, "key": 1, "values": {"u1": 1}},
        ],
        [
            {"op": "add_column", "t": 3, "table_uuid": T1, "column": col2, "default": "2"},
            {"op": "drop_column", "t": 4, "table_uuid": T1, "column_uuid": "u1"},
            {"op": "change_column_type", "t": 5, "table_uuid": T1, "column_uuid": "u2", "data_type": "BIGINT"},
            {"op": "rename_column", "t": 6, "table_uuid": T1, "column_uuid": "u2", "new_name": "mycolumn2"},
            {"op": "drop_table", "t": 7, "table_uuid": T1},
        ],
    )
    store.compact()
    history = store.sql("SELECT * FROM _history_catalog.schema_history ORDER BY logical_timestamp", 8).to_pylist()
    described = [
        (
            h["logical_timestamp"],
            None
            if h["schema_descriptor"] is None
            else [(c["column_name"], c["data_type"], c["supercolumn_name"])
                  for c in h["schema_descriptor"]["column_descriptors"]],
        )
        for h in history
    ]
    assert described == [
        (1, [("column1", "BIGINT", "u1-1")]),
        (3, [("column1", "BIGINT", "u1-1"), ("column2", "TEXT", "u2-3")]),
        (4, [("column2", "TEXT", "u2-3")]),
        (5, [("column2", "BIGINT", "u2-5")]),
        (6, [("mycolumn2", "BIGINT", "u2-5")]),
        (7, None),
    ]
    assert store.load_table("my_table", 4).to_pylist() == [{"synthetic_key": 1, "column1": 1, "column2": "2"}]
    assert store.load_table("my_table", 6).to_pylist() == [{"synthetic_key": 1, "column2": 2}]
    assert store.load_table("my_table", 7).to_pylist() == [{"synthetic_key": 1, "mycolumn2": 2}]
    with pytest.raises(Exception, match="no table 'my_table' as of 8"):
        store.load_table("my_table", 8)
    assert store.row_history(T1, 1) == [{"logical_timestamp": 2, "is_deleted": False, "values": {"column1": 1}}]


@pytest.mark.spark
def test_rename_table_writes_two_entries_and_names_resolve_by_time(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    write(store, example_events() + [{"op": "rename_table", "t": 6, "table_uuid": T1, "new_name": "renamed"}])
    store.compact()
    entries = [e for e in store.catalog_state().schema_history if e.logical_timestamp == 6]
    assert [(e.table_name, e.descriptor is None) for e in entries] == [("my_table", True), ("renamed", False)]
    assert store.load_table("my_table", 6).num_rows == 1
    assert store.load_table("renamed", 7).num_rows == 1
    with pytest.raises(Exception, match="tables then: renamed"):
        store.load_table("my_table", 7)


@pytest.mark.spark
def test_same_key_same_t_consolidates(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    events = example_events()[:1] + [
        {"op": "insert", "t": 2, "table_uuid": T1, "key": 7, "values": {"col1": "a"}},
        {"op": "update", "t": 2, "table_uuid": T1, "key": 7, "values": {"col1": "b"}},
        {"op": "insert", "t": 2, "table_uuid": T1, "key": 8, "values": {"col1": "x"}},
        {"op": "delete", "t": 2, "table_uuid": T1, "key": 8},
    ]
    write(store, events)
    store.compact()
    rows = supertable_rows(store, T1)
    assert [(r["synthetic_key"], r["logical_timestamp"], r["col1-1"]) for r in rows] == [(7, 2, "b")]


def test_compaction_on_spark_matches_and_applies_once(tmp_path, spark):
    store = HistoryStore.open(tmp_path, database="db")
    write(store, example_events()[:3], example_events()[3:])
    summary = store.compact(spark=spark)
    assert summary.segments_applied == [1, 2] and summary.versions_written == 4 and summary.frontier == 5
    assert store.compact(spark=spark).segments_applied == []
    assert len(store.segments(SegmentState.APPLIED)) == 2
    assert store.load_table("my_table", 6).to_pylist() == [{"synthetic_key": 2, "column1": "value2_prime"}]


@pytest.mark.spark
@pytest.mark.parametrize(
    "bad, fragment",
    [
        ({"op": "update", "t": 10, "table_uuid": T1, "key": 99, "values": {"col1": "x"}}, "does not exist"),
        ({"op": "delete", "t": 10, "table_uuid": T1, "key": 99}, "does not exist"),
        ({"op": "insert", "t": 10, "table_uuid": T1, "key": 2, "values": {"col1": "x"}}, "already live"),
        ({"op": "insert", "t": 10, "table_uuid": "nope", "key": 5, "values": {}}, "unknown table"),
        ({"op": "insert", "t": 10, "table_uuid": T1, "key": 5, "values": {"zz": 1}}, "no column zz"),
        ({"op": "insert", "t": 10, "table_uuid": T1, "key": 5, "values": {"col1": 5}}, "expected a string"),
        ({"op": "change_column_type", "t": 10, "table_uuid": T1, "column_uuid": "col1", "data_type": "INTEGER"},
         "cannot be cast"),
    ],
)
def test_bad_segment_is_quarantined_and_nothing_is_lost(tmp_path, bad, fragment):
    store = HistoryStore.open(tmp_path, database="db")
    good_later = [{"op": "insert", "t": 20, "table_uuid": T1, "key": 50, "values": {"col1": "later"}}]
    write(store, example_events(),
          [{"op": "insert", "t": 8, "table_uuid": T1, "key": 3, "values": {"col1": "ok"}}, bad], good_later)
    with pytest.raises(SegmentQuarantinedError, match=fragment) as info:
        store.compact()
    assert "segment 00000000000000000002, line 3" in str(info.value)
    assert store.frontier == 5  # the first segment committed, nothing of the bad one
    assert store.fetch_row("my_table", 3, 6) is None
    with pytest.raises(SegmentQuarantinedError):
        store.compact()  # the later segment waits behind the quarantined one
    assert [s.segment_id for s in store.segments(SegmentState.SEALED)] == [3]
    files_before = set(store.catalog_state().files)
    assert all(f.startswith("example") is False for f in files_before)


CRASH_STEPS = ["planned", "files_written", "schema_history_written", "committed"]


class Crash(Exception):
    pass


@pytest.mark.spark
@pytest.mark.parametrize("step", CRASH_STEPS)
def test_crash_at_any_step_applies_exactly_once(tmp_path, step):
    store = HistoryStore.open(tmp_path, database="db")
    write(store, example_events())

    def crash(at):
        if at == step:
            raise Crash(at)

    with pytest.raises(Crash):
        store.compact(on_step=crash)
    committed = step == "committed"
    assert (store.frontier == 5) is committed
    reopened = HistoryStore.open(tmp_path, database="db")
    summary = reopened.compact()
    assert summary.segments_applied == ([] if committed else [1])
    assert len(supertable_rows(reopened, T1)) == 4
    assert reopened.load_table("my_table", 6).to_pylist() == [{"synthetic_key": 2, "column1": "value2_prime"}]
    assert [s.state for s in reopened.segments()] == [SegmentState.APPLIED]


# --- property test: random histories against the in-memory model -------------------------

TYPES = ["INTEGER", "TEXT", "NUMERIC(8,2)", "BOOLEAN", "DOUBLE PRECISION"]
#: type changes whose casts always succeed on the values _value makes (PostgreSQL agrees)
CASTABLE = {
    "INTEGER": ["BIGINT", "NUMERIC(12,2)", "TEXT", "DOUBLE PRECISION"],
    "BIGINT": ["INTEGER", "TEXT"],
    "NUMERIC(8,2)": ["INTEGER", "TEXT", "DOUBLE PRECISION", "NUMERIC(12,2)"],
    "NUMERIC(12,2)": ["INTEGER", "TEXT"],
    "BOOLEAN": ["TEXT", "INTEGER"],
    "DOUBLE PRECISION": ["TEXT", "NUMERIC(12,2)", "INTEGER"],
    "TEXT": ["TEXT"],
}


def _value(rng, data_type):
    if rng.random() < 0.15:
        return None
    if data_type in ("INTEGER", "BIGINT"):
        return rng.randint(-1000, 1000)
    if data_type == "DOUBLE PRECISION":
        return round(rng.uniform(-1000, 1000), rng.choice([0, 1, 3, 6]))
    if data_type == "TEXT":
        return rng.choice(["a", "b", "ü", "12", "-7", ""])
    if data_type in ("NUMERIC(8,2)", "NUMERIC(12,2)"):
        return f"{rng.randint(-99999, 99999) / 100:.2f}"
    return rng.random() < 0.5


def random_history(seed, n_events=60):
    """A valid random stream over two tables with every kind of schema change."""
    rng = random.Random(seed)
    events, t = [], 0
    tables: dict[str, dict] = {}
    names = iter(f"tab{i}" for i in range(1000))
    col_ids = iter(f"c{i}" for i in range(1000))
    while len(events) < n_events:
        t += 1
        roll = rng.random()
        if not tables or (roll < 0.05 and len(tables) < 3):
            uuid, name = f"T{t}", next(names)
            cols = {next(col_ids): rng.choice(TYPES) for _ in range(rng.randint(1, 3))}
            tables[uuid] = {"name": name, "cols": cols, "keys": set()}
            events.append({"op": "create_table", "t": t, "table_uuid": uuid, "table_name": name,
                           "columns": [{"column_uuid": c, "column_name": f"n_{c}", "data_type": ty}
                                       for c, ty in cols.items()]})
            continue
        uuid = rng.choice(sorted(tables))
        table = tables[uuid]
        if roll < 0.10:
            c, ty = next(col_ids), rng.choice(TYPES)
            event = {"op": "add_column", "t": t, "table_uuid": uuid,
                     "column": {"column_uuid": c, "column_name": f"n_{c}", "data_type": ty}}
            default = _value(rng, ty)
            if default is not None:
                event["default"] = default
            table["cols"][c] = ty
            events.append(event)
        elif roll < 0.13 and len(table["cols"]) > 1:
            c = rng.choice(sorted(table["cols"]))
            del table["cols"][c]
            events.append({"op": "drop_column", "t": t, "table_uuid": uuid, "column_uuid": c})
        elif roll < 0.16:
            c = rng.choice(sorted(table["cols"]))
            events.append({"op": "rename_column", "t": t, "table_uuid": uuid, "column_uuid": c,
                           "new_name": f"r{t}_{c}"})
        elif roll < 0.19:
            c = rng.choice(sorted(table["cols"]))
            new = rng.choice(CASTABLE[table["cols"][c]])
            table["cols"][c] = new
            events.append({"op": "change_column_type", "t": t, "table_uuid": uuid, "column_uuid": c,
                           "data_type": new})
        elif roll < 0.21:
            c = rng.choice(sorted(table["cols"]))
            events.append({"op": "reorder_column", "t": t, "table_uuid": uuid, "column_uuid": c,
                           "ordinal_key": rng.choice(["0", "5", "z", "00000000a"])})
        elif roll < 0.22:
            table["name"] = f"{table['name']}_r{t}"
            events.append({"op": "rename_table", "t": t, "table_uuid": uuid, "new_name": table["name"]})
        elif roll < 0.225 and len(tables) > 1:
            del tables[uuid]
            events.append({"op": "drop_table", "t": t, "table_uuid": uuid})
        else:
            for _ in range(rng.randint(1, 3)):  # row mutations may share a timestamp
                live = sorted(table["keys"])
                choice = rng.random()
                if not live or choice < 0.4:
                    key = rng.randint(-50, 50)
                    if key in table["keys"]:
                        continue
                    table["keys"].add(key)
                    events.append({"op": "insert", "t": t, "table_uuid": uuid, "key": key,
                                   "values": {c: _value(rng, ty) for c, ty in table["cols"].items()
                                              if rng.random() < 0.85}})  # omitted: the column default
                elif choice < 0.85:
                    key = rng.choice(live)
                    cols = rng.sample(sorted(table["cols"]), rng.randint(1, len(table["cols"])))
                    events.append({"op": "update", "t": t, "table_uuid": uuid, "key": key,
                                   "values": {c: _value(rng, table["cols"][c]) for c in cols}})
                else:
                    key = rng.choice(live)
                    table["keys"].discard(key)
                    events.append({"op": "delete", "t": t, "table_uuid": uuid, "key": key})
    return events


def check_against_model(store, events):
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    frontier = store.frontier
    for as_of in range(0, frontier + 2):
        names = {t["name"] for t in model.state_as_of(as_of).values()}
        assert {d.table_name for d in store.get_catalog(as_of)} == names, as_of
        for name in names:
            got = store.load_table(name, as_of)
            assert got.column_names == ["synthetic_key"] + model.column_order(name, as_of), (name, as_of)
            rows = {r.pop("synthetic_key"): r for r in got.to_pylist()}
            assert rows == model.table_as_of(name, as_of), (name, as_of)


def _split(events, rng):
    """Cut the stream into segments at timestamp boundaries."""
    batches, current = [], []
    for i, e in enumerate(events):
        current.append(e)
        nxt = events[i + 1]["t"] if i + 1 < len(events) else None
        if nxt != e["t"] and rng.random() < 0.3:
            batches.append(current)
            current = []
    if current:
        batches.append(current)
    return batches


@pytest.mark.slow
@pytest.mark.spark
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000))
def test_reconstruction_invariant_on_random_histories(tmp_path_factory, seed):
    events = random_history(seed)
    store = HistoryStore.open(tmp_path_factory.mktemp("prop"), database="db")
    write(store, *_split(events, random.Random(seed)))
    store.compact()
    check_against_model(store, events)


def test_reconstruction_invariant_with_spark(tmp_path, spark):
    events = random_history(4242, n_events=80)
    store = HistoryStore.open(tmp_path, database="db")
    write(store, *_split(events, random.Random(1)))
    store.compact(spark=spark)
    check_against_model(store, events)


@pytest.mark.spark
@pytest.mark.parametrize("seed", [5, 6, 7])
def test_periodic_snapshots_keep_the_invariant_and_bound_reads(tmp_path, seed):
    from history_pipeline import StoreSettings
    from history_pipeline.catalog.files import select_files

    events = random_history(seed, n_events=90)
    store = HistoryStore.open(
        tmp_path, database="db", settings=StoreSettings(snapshot_min_versions=4, snapshot_ratio=0.5)
    )
    for batch in _split(events, random.Random(seed)):
        write(store, batch)
        store.compact()
    state = store.catalog_state()
    snapshots = [f for f in state.files.values() if f.kind is FileKind.SNAPSHOT]
    assert snapshots
    check_against_model(store, events)
    for f in snapshots:
        selection = select_files(state, f.table_uuid, state.frontier + 1)
        assert selection.snapshot_as_of is not None
        assert all(v.max_t >= selection.snapshot_as_of for v in selection.versions)


def test_tables_split_by_key_across_tasks_keep_the_invariant(tmp_path, spark, monkeypatch):
    from history_pipeline.compaction import compactor

    monkeypatch.setattr(compactor, "SPLIT_THRESHOLD", 1)
    events = random_history(99, n_events=80)
    store = HistoryStore.open(tmp_path, database="db")
    write(store, *_split(events, random.Random(3)))
    store.compact(spark=spark)
    check_against_model(store, events)
    files = store.catalog_state().files_of(events[0]["table_uuid"], FileKind.VERSIONS)
    per_segment = [f.segments for f in files]
    assert any(per_segment.count(s) > 1 for s in per_segment)  # a segment's table work ran as several tasks


def test_corrupted_segment_is_quarantined_before_anything_is_applied(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    write(store, example_events()[:3], example_events()[3:])
    second = store.segments(SegmentState.SEALED)[1]
    data = bytearray(second.path.read_bytes())
    data[data.index(b"value2_prime")] ^= 0x01  # one flipped bit
    second.path.write_bytes(bytes(data))
    with pytest.raises(SegmentQuarantinedError, match="checksum") as info:
        store.compact(spark=False)
    assert info.value.segment == second.name
    assert store.frontier == 3  # the good first segment is applied, nothing of the corrupt one
    assert [s.segment_id for s in store.segments(SegmentState.QUARANTINED)] == [2]
