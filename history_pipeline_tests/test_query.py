"""Time-travel queries: guards, name resolution, typed values end to end, and the SQL sandbox."""

import datetime as dt
import math
import uuid
from decimal import Decimal

import pyarrow as pa
import pytest

from history_pipeline import (
    FutureTimestampError,
    HistoryStore,
    SandboxViolationError,
    StoreSettings,
    TableNotFoundError,
)
from history_pipeline.catalog.files import is_closed_read, select_files
from history_pipeline.io.store import LocalStore
from history_pipeline.maintenance.export import load_export
from history_pipeline.types import Interval

TYPED_COLUMNS = [
    ("b", "BOOLEAN", True),
    ("s", "SMALLINT", -32768),
    ("i", "INTEGER", 2**31 - 1),
    ("g", "BIGINT", -(2**63)),
    ("r", "REAL", 0.1),
    ("d", "DOUBLE PRECISION", "NaN"),
    ("n", "NUMERIC(10,2)", "12.34"),
    ("w", "NUMERIC", "123456789012345678901234567890123456789"),
    ("t", "TEXT", "héllo ✓"),
    ("v", "VARCHAR(3)", "abc"),
    ("c", "CHAR(4)", "ab"),
    ("y", "BYTEA", "AAEC/w=="),
    ("u", "UUID", "0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01"),
    ("dd", "DATE", "2024-02-29"),
    ("tm", "TIME", "12:30:00.5"),
    ("ts", "TIMESTAMP", "2024-01-02T03:04:05.123456"),
    ("tz", "TIMESTAMPTZ", "2024-01-02T03:04:05+05:30"),
    ("iv", "INTERVAL", {"months": 1, "days": 2, "micros": 3}),
    ("j", "JSONB", {"a": [1, None]}),
    ("a", "INTEGER[]", [1, None]),
]


@pytest.fixture
def typed_store(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    with store.wal_writer() as wal:
        wal.append({"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "typed",
                    "columns": [{"column_uuid": c, "column_name": c, "data_type": ty} for c, ty, _ in TYPED_COLUMNS]})
        wal.append({"op": "insert", "t": 2, "table_uuid": "T", "key": 1,
                    "values": {c: v for c, _, v in TYPED_COLUMNS}})
        wal.append({"op": "close", "t": 2})
        wal.seal()
    store.compact()
    return store


@pytest.mark.spark
def test_every_type_comes_back_equal_and_natural(typed_store):
    row = typed_store.fetch_row("typed", 1, as_of=3)
    assert row["b"] is True and row["s"] == -32768 and row["g"] == -(2**63)
    assert row["r"] == 0.1 and row["d"] != row["d"]  # NaN
    assert row["n"] == Decimal("12.34") and row["w"] == Decimal("123456789012345678901234567890123456789")
    assert row["t"] == "héllo ✓" and row["y"] == b"\x00\x01\x02\xff"
    assert row["u"] == uuid.UUID("0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01")
    assert row["dd"] == dt.date(2024, 2, 29) and row["tm"] == dt.time(12, 30, 0, 500000)
    assert row["ts"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456)
    assert row["tz"] == dt.datetime(2024, 1, 1, 21, 34, 5, tzinfo=dt.UTC)
    assert row["iv"] == Interval(1, 2, 3) and row["j"] == {"a": [1, None]} and row["a"] == [1, None]


@pytest.mark.spark
def test_sql_sees_natural_types(typed_store):
    result = typed_store.sql(
        "SELECT n + 1 AS n1, tz > TIMESTAMPTZ '2024-01-01 00:00:00+00' AS later, u::VARCHAR AS u, "
        "iv = INTERVAL '1 month 2 days 3 microseconds' AS same_interval, j->>'a' AS ja FROM typed",
        as_of=3,
    ).to_pylist()
    assert result == [{"n1": Decimal("13.34"), "later": True, "u": "0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01",
                       "same_interval": True, "ja": "[1,null]"}]


@pytest.mark.spark
def test_frontier_guard_and_unknown_tables(typed_store):
    assert typed_store.frontier == 2
    assert typed_store.load_table("typed", 3).num_rows == 1
    assert typed_store.load_table("typed", 2).num_rows == 0
    with pytest.raises(FutureTimestampError, match="frontier is 2"):
        typed_store.load_table("typed", 4)
    with pytest.raises(TableNotFoundError, match="tables then: typed"):
        typed_store.fetch_row("missing", 1, 3)
    with pytest.raises(TableNotFoundError, match="tables then: none"):
        typed_store.load_table("typed", 1)
    assert typed_store.load_table("T", 3).num_rows == 1  # by uuid


@pytest.mark.spark
@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_parquet('/etc/hosts')",
        "COPY (SELECT 1) TO '/tmp/escape.csv'",
        "ATTACH '/tmp/escape.duckdb' AS x",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "CREATE TABLE x AS SELECT 1",
        "INSERT INTO typed (synthetic_key) VALUES (2)",
        "SELECT 1; SET lock_configuration = false",
    ],
)
def test_sandbox_refuses_escapes(typed_store, query):
    with pytest.raises(SandboxViolationError):
        typed_store.sql(query, as_of=3)


@pytest.mark.spark
def test_sql_joins_tables_consistently_and_ignores_identifier_case(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    with store.wal_writer() as wal:
        for uuid, name in (("A", "customers"), ("B", "orders")):
            wal.append({"op": "create_table", "t": 1 if uuid == "A" else 2, "table_uuid": uuid, "table_name": name,
                        "columns": [{"column_uuid": f"{uuid}v", "column_name": "v", "data_type": "INTEGER"}]})
        wal.append({"op": "insert", "t": 3, "table_uuid": "A", "key": 1, "values": {"Av": 10}})
        wal.append({"op": "insert", "t": 3, "table_uuid": "B", "key": 1, "values": {"Bv": 20}})
        wal.append({"op": "update", "t": 4, "table_uuid": "A", "key": 1, "values": {"Av": 11}})
        wal.append({"op": "close", "t": 4})
        wal.seal()
    store.compact()
    query = "SELECT c.v AS cv, o.v AS ov FROM Customers c JOIN ORDERS o USING (synthetic_key)"
    assert store.sql(query, as_of=4).to_pylist() == [{"cv": 10, "ov": 20}]
    assert store.sql(query, as_of=5).to_pylist() == [{"cv": 11, "ov": 20}]
    assert store.sql("SELECT count(*) AS n FROM _history_catalog.schema_history", as_of=2).to_pylist() == [{"n": 1}]


@pytest.mark.spark
def test_sql_cannot_read_another_databases_history(tmp_path, typed_store):
    other = HistoryStore.open(typed_store.objects.uri, database="other_tenant")
    with other.wal_writer() as wal:
        wal.append({"op": "create_table", "t": 1, "table_uuid": "S", "table_name": "secrets",
                    "columns": [{"column_uuid": "s", "column_name": "s", "data_type": "TEXT"}]})
        wal.append({"op": "insert", "t": 2, "table_uuid": "S", "key": 1, "values": {"s": "hidden"}})
        wal.append({"op": "close", "t": 2})
        wal.seal()
    other.compact()
    path = next(iter(other.catalog_state().files_of("S")))
    with pytest.raises(TableNotFoundError):
        typed_store.sql("SELECT * FROM secrets", as_of=3)
    with pytest.raises(SandboxViolationError):
        typed_store.sql(f"SELECT * FROM read_parquet('{other.objects.full_path(path.path)}')", as_of=3)
    with pytest.raises(SandboxViolationError):
        typed_store.sql(f"SELECT * FROM glob('{typed_store.objects.uri}/*')", as_of=3)


@pytest.mark.spark
def test_load_table_values_read_back_as_written(typed_store):
    row = typed_store.load_table("typed", as_of=3).to_pylist()[0]
    assert row["j"] == {"a": [1, None]}  # JSONB reads back as the JSON value
    assert row["u"] == uuid.UUID("0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01")
    assert row["n"] == Decimal("12.34") and row["a"] == [1, None]
    assert typed_store.sql("SELECT j->'a'->>0 AS first FROM typed", as_of=3).to_pylist() == [{"first": "1"}]


@pytest.mark.spark
def test_load_table_in_scan_order_holds_every_type_as_in_key_order(typed_store):
    ordered = typed_store.load_table("typed", as_of=3, ordered=True)
    unordered = typed_store.load_table("typed", as_of=3)
    assert unordered.schema == ordered.schema
    # the same values in the same types, NaN included (which no equality holds equal to itself)
    assert unordered.drop_columns(["d"]).combine_chunks().equals(ordered.drop_columns(["d"]).combine_chunks())
    assert math.isnan(unordered.column("d")[0].as_py()) and math.isnan(ordered.column("d")[0].as_py())


@pytest.mark.spark
def test_an_export_of_every_type_loads_back_as_load_table_gives_it(typed_store, tmp_path):
    """An export is Parquet: INTERVAL values (Arrow's month_day_nano, which Parquet cannot hold)
    are written as stored and given back as they were."""
    typed_store.export(as_of=3, to=str(tmp_path / "exports"))
    loaded = load_export(LocalStore(tmp_path / "exports"), "db", 3)["typed"]
    table = typed_store.load_table("typed", as_of=3)
    assert loaded.schema == table.schema
    assert loaded.drop_columns(["d"]).equals(table.drop_columns(["d"]))
    assert math.isnan(loaded.column("d")[0].as_py())


@pytest.fixture
def closed_typed_store(tmp_path):
    """Eight rows of every type, then updates of some columns and a delete, segment by segment,
    with snapshots so small that most T are closed reads (files of closed intervals, read by
    filters on their statistics). Returns the store, those T, and the model's rows as of each T
    ({key: {column: value}} of the columns the updates change)."""
    store = HistoryStore.open(tmp_path, database="db", settings=StoreSettings(snapshot_min_versions=6,
                                                                             snapshot_ratio=0.2))
    base = {c: v for c, _, v in TYPED_COLUMNS}
    rows: dict[int, dict] = {}
    model = {}
    t = 1
    with store.wal_writer() as wal:
        wal.append({"op": "create_table", "t": t, "table_uuid": "T", "table_name": "typed",
                    "columns": [{"column_uuid": c, "column_name": c, "data_type": ty} for c, ty, _ in TYPED_COLUMNS]})
        wal.append({"op": "close", "t": t})
        wal.seal()
    for batch in range(6):
        t += 1
        model[t] = {k: dict(v) for k, v in rows.items()}  # as of t: every event below it
        with store.wal_writer() as wal:
            for key in range(1, 9):
                if batch == 0:
                    wal.append({"op": "insert", "t": t, "table_uuid": "T", "key": key, "values": base})
                    rows[key] = {"i": base["i"], "t": base["t"], "a": base["a"]}
                elif (key + batch) % 3 == 0 and key in rows:
                    change = {"i": batch * 10 + key, "t": f"v{batch}", "a": [batch, None, key]}
                    wal.append({"op": "update", "t": t, "table_uuid": "T", "key": key, "values": change})
                    rows[key] = change
            if batch == 4:
                wal.append({"op": "delete", "t": t, "table_uuid": "T", "key": 8})
                del rows[8]
            wal.append({"op": "close", "t": t})
            wal.seal()
        store.compact(spark=False)
    model[t + 1] = {k: dict(v) for k, v in rows.items()}
    state = store.catalog_state()
    closed = [as_of for as_of in model if is_closed_read(store.objects, select_files(state, "T", as_of))]
    assert len(closed) >= 3  # the snapshots made most T closed reads
    return store, closed, model


def test_load_table_reads_every_type_back_on_a_closed_read_in_either_order(closed_typed_store):
    """The key-ordered read (filters on the footers' statistics of every file, a nested column
    before ``superseded_at`` included) and ``ordered=False`` (DuckDB's scan of the files) give the
    model's rows, every type as written."""
    store, closed, model = closed_typed_store
    for as_of in closed:
        ordered = store.load_table("typed", as_of, ordered=True)
        got = {r["synthetic_key"]: {c: r[c] for c in ("i", "t", "a")} for r in ordered.to_pylist()}
        assert got == model[as_of], as_of
        assert ordered.column("synthetic_key").to_pylist() == sorted(model[as_of]), as_of
        unordered = store.load_table("typed", as_of).sort_by("synthetic_key")
        assert unordered.schema == ordered.schema, as_of
        # the same values in the same types, NaN included (which no equality holds equal to itself)
        assert unordered.drop_columns(["d"]).combine_chunks().equals(
            ordered.drop_columns(["d"]).combine_chunks()), as_of
        assert all(math.isnan(v) for v in unordered.column("d").to_pylist()), as_of


def test_lookups_histories_and_diffs_of_every_type_on_closed_reads(closed_typed_store):
    store, closed, model = closed_typed_store
    for as_of in closed:
        for key in range(1, 10):
            row = store.fetch_row("typed", key, as_of)
            if key not in model[as_of]:
                assert row is None, (as_of, key)
                continue
            assert {c: row[c] for c in ("i", "t", "a")} == model[as_of][key], (as_of, key)
            assert row["u"] == uuid.UUID("0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01") and row["j"] == {"a": [1, None]}
            assert row["n"] == Decimal("12.34") and row["iv"] == Interval(1, 2, 3) and math.isnan(row["d"])
    for key in range(1, 9):
        versions = store.row_history("typed", key)
        live = [t for t in sorted(model) if key in model[t]]
        changed = [t - 1 for t, before in zip(live[1:], live, strict=False) if model[t][key] != model[before][key]]
        assert [v["logical_timestamp"] for v in versions if not v["is_deleted"]] == [live[0] - 1, *changed], key
    assert store.diff("typed", from_=closed[0], to=closed[0]) == {"inserted": [], "deleted": [], "changed": []}
    first, last = closed[0], closed[-1]
    diff = store.diff("typed", from_=first, to=last)
    assert [d["key"] for d in diff["changed"]] == sorted(
        k for k in model[first] if k in model[last] and model[first][k] != model[last][k])
    assert [d["key"] for d in diff["deleted"]] == sorted(set(model[first]) - set(model[last]))


@pytest.mark.spark
def test_sql_follows_postgresql_where_duckdb_differs(typed_store):
    result = typed_store.sql("SELECT 7 / 2 AS q, 7.0 / 2 AS r", as_of=3).to_pylist()
    assert result == [{"q": 3, "r": Decimal("3.5")}] or result == [{"q": 3, "r": 3.5}]
    ordered = typed_store.sql("SELECT x FROM (VALUES (1), (NULL), (3)) t(x) ORDER BY x DESC", as_of=3)
    assert ordered.column("x").to_pylist() == [None, 3, 1]
    ordered = typed_store.sql("SELECT x FROM (VALUES (1), (NULL), (3)) t(x) ORDER BY x", as_of=3)
    assert ordered.column("x").to_pylist() == [1, 3, None]


@pytest.mark.parametrize("with_array", [False, True])
def test_user_columns_named_like_the_reserved_ones_are_the_users_in_sql(tmp_path, with_array):
    """A PostgreSQL table may have columns named ``synthetic_key``, ``is_deleted`` or
    ``logical_timestamp``: the store's own columns of those names never hide them. In SQL the user's
    ``synthetic_key`` is the one a query names (it was renamed ``synthetic_key_1`` and the key took its
    name); ``load_table`` keeps the contract's key first, then the columns under their names."""
    columns = [{"column_uuid": "c1", "column_name": "is_deleted", "data_type": "BOOLEAN"},
               {"column_uuid": "c2", "column_name": "logical_timestamp", "data_type": "BIGINT"},
               {"column_uuid": "c3", "column_name": "synthetic_key", "data_type": "TEXT"}]
    if with_array:  # such a table is exposed to SQL from its reconstruction
        columns.append({"column_uuid": "c4", "column_name": "tags", "data_type": "INTEGER[]"})
    store = HistoryStore.open(tmp_path, database="db")
    with store.wal_writer() as wal:
        wal.append({"op": "create_table", "t": 1, "table_uuid": "u1", "table_name": "items", "columns": columns})
        for key, deleted, stamp, label in ((5, True, 77, "x"), (9, False, -3, "y")):
            values = {"c1": deleted, "c2": stamp, "c3": label, **({"c4": [key]} if with_array else {})}
            wal.append({"op": "insert", "t": 2, "table_uuid": "u1", "key": key, "values": values})
        wal.append({"op": "delete", "t": 3, "table_uuid": "u1", "key": 9})
        wal.append({"op": "close", "t": 3})
        wal.seal()
    store.compact(spark=False)
    got = store.sql('SELECT synthetic_key, is_deleted, logical_timestamp FROM items ORDER BY 1', 3).to_pylist()
    assert got == [{"synthetic_key": "x", "is_deleted": True, "logical_timestamp": 77},
                   {"synthetic_key": "y", "is_deleted": False, "logical_timestamp": -3}]
    assert store.sql("SELECT * FROM items", 4).column_names == [c["column_name"] for c in columns]
    assert store.sql("SELECT count(*) AS n FROM items WHERE is_deleted", 4).to_pylist() == [{"n": 1}]
    table = store.load_table("items", 4, ordered=True)
    assert table.schema.names == ["synthetic_key", *(c["column_name"] for c in columns)]
    assert table.column(0).to_pylist() == [5] and table.column(3).to_pylist() == ["x"]
    assert store.fetch_row("items", 5, 4)["synthetic_key"] == "x"


# --- diff: computed by DuckDB, the values' semantics kept -------------------------------------------

_DIFF_COLUMNS = [("i", "INTEGER"), ("n", "NUMERIC"), ("f", "DOUBLE PRECISION"), ("r", "REAL"), ("j", "JSONB"),
                 ("a", "INTEGER[]"), ("x", "TEXT"), ("c", "INTEGER"), ("m", "INTEGER"), ("s", "TEXT"),
                 ("p", "NUMERIC(8,3)")]


def _diff_history() -> list[dict]:
    """Values equal in all but their stored text (trailing zeros, signs of zero, JSONB key order and
    1 vs 1.0, NaN), NULLs, type changes both lossless and not, renames of a column and of the table,
    added and dropped columns, deletes and re-inserts."""
    row = {"i": 1, "n": "1.50", "f": 0.0, "r": 1.5, "j": {"a": 1, "b": [2]}, "a": [1, None], "x": "a", "c": 5,
           "m": 7, "s": " 12 ", "p": "1.500"}
    def ev(op, t, **fields):
        return {"op": op, "t": t, "table_uuid": "E", **fields}

    return [
        ev("create_table", 1, table_name="edges", columns=[
            {"column_uuid": c, "column_name": c, "data_type": ty} for c, ty in _DIFF_COLUMNS]),
        *[ev("insert", 2, key=k, values={**row, "i": k}) for k in range(1, 9)],
        ev("insert", 2, key=20, values={"i": 20}),
        ev("update", 3, key=1, values={"n": "1.5"}),
        ev("update", 3, key=2, values={"n": "-0.000", "f": -0.0}),
        ev("update", 3, key=3, values={"f": "NaN", "r": "NaN"}),
        ev("update", 3, key=4, values={"j": {"b": [2], "a": 1.0}}),
        ev("update", 3, key=5, values={"x": None}),
        ev("update", 3, key=6, values={"n": "1.5000001", "p": "1.501"}),
        ev("update", 3, key=20, values={"n": "0"}),
        ev("update", 4, key=3, values={"f": "NaN"}),
        ev("change_column_type", 5, column_uuid="c", data_type="BIGINT"),
        ev("change_column_type", 6, column_uuid="m", data_type="TEXT"),
        ev("change_column_type", 7, column_uuid="s", data_type="INTEGER"),
        ev("rename_column", 8, column_uuid="x", new_name="x2"),
        ev("add_column", 9, column={"column_uuid": "z", "column_name": "z", "data_type": "TEXT"}, default="d"),
        ev("drop_column", 10, column_uuid="f"),
        ev("update", 11, key=7, values={"m": "7 ", "c": 6}),
        ev("update", 11, key=8, values={"s": 13, "z": None}),
        ev("delete", 11, key=2),
        ev("insert", 11, key=30, values={"i": 30}),
        ev("change_column_type", 12, column_uuid="a", data_type="BIGINT[]"),
        ev("rename_table", 13, new_name="edges2"),
        ev("delete", 14, key=20),
        ev("insert", 14, key=2, values={"i": 2, "n": "-0"}),
    ]


def _nan_marked(value):
    """``value`` with every float NaN replaced by a marker (NaN never equals itself)."""
    if isinstance(value, float) and math.isnan(value):
        return "<NaN>"
    if isinstance(value, dict):
        return {k: _nan_marked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_marked(v) for v in value]
    return value


def test_diff_keeps_the_value_semantics_through_edge_values_type_changes_and_renames(tmp_path):
    from history_pipeline.query.diff import diff_to_dict
    from history_pipeline_tests.model import BaseDatabase
    from history_pipeline_tests.test_compaction import write
    from history_pipeline_tests.test_reconstruction import expected_diff

    events = _diff_history()
    store = HistoryStore.open(tmp_path, database="db")
    write(store, events[:10], events[10:])
    store.compact(spark=False)
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    end = store.frontier + 1
    # across each kind of change (a diff costs DuckDB queries: not every pair)
    pairs = {(0, end): "edges2", (3, 4): "edges", (4, 12): "edges", (6, 9): "edges", (8, 12): "edges",
             (11, end): "edges2", (12, 14): "edges"}
    for (t1, t2), name in pairs.items():
        got = _nan_marked(store.diff(name, from_=t1, to=t2))
        assert got == _nan_marked(expected_diff(model, name, t1, t2)), (name, t1, t2)
        if (t1, t2) in ((4, 12), (11, end)):
            streamed = store.diff_reader(name, from_=t1, to=t2, batch_size=2, as_stored=True)
            assert _nan_marked(diff_to_dict(streamed)) == got, (name, t1, t2)
    # equal values written otherwise are no change (trailing zeros, JSONB key order and 1 vs 1.0, NaN)
    assert [e["key"] for e in store.diff("edges", from_=3, to=4)["changed"]] == [2, 3, 5, 6, 20]
    assert store.diff("edges", from_=4, to=5) == {"inserted": [], "deleted": [], "changed": []}
    answer = store.diff_reader("edges2", from_=0, to=end).read_all()
    assert answer.column("kind").to_pylist() == ["inserted"] * 9
    assert answer.column("key").to_pylist() == sorted(answer.column("key").to_pylist())
    assert answer.schema.field("after").type.field("n").metadata == {b"data_type": b"NUMERIC"}
    assert answer.schema.field("before").type == pa.struct([])  # no table as of 0
    # the rows as load_table gives them: the same names, types and values
    loaded = store.load_table("edges2", end, ordered=True)
    after = pa.Table.from_struct_array(answer.column("after").combine_chunks())
    assert [(f.name, f.type) for f in after.schema] == [(f.name, f.type) for f in loaded.schema][1:]
    assert _nan_marked(after.to_pylist()) == _nan_marked(loaded.drop_columns(["synthetic_key"]).to_pylist())


def test_diff_turns_only_the_changed_rows_into_python_values(tmp_path, monkeypatch):
    """A diff of a large table with few changes must not convert every row of both states (the
    cost that kept a 300,000-row diff from finishing within a service time limit)."""
    import history_pipeline.query.diff as diff_module
    import history_pipeline.query.engine as engine_module
    import history_pipeline.types as types_module
    from history_pipeline_tests.test_compaction import write

    rows = 3000
    events = [{"op": "create_table", "t": 1, "table_uuid": "L", "table_name": "large", "columns": [
        {"column_uuid": c, "column_name": c, "data_type": ty}
        for c, ty in (("q", "INTEGER"), ("n", "NUMERIC"), ("j", "JSONB"), ("w", "NUMERIC(12,2)"))]}]
    events += [{"op": "insert", "t": 2, "table_uuid": "L", "key": k,
                "values": {"q": k, "n": f"{k}.10", "j": {"k": k}, "w": "1.00"}} for k in range(rows)]
    events += [{"op": "update", "t": 3, "table_uuid": "L", "key": 7, "values": {"j": {"k": 8}}},
               {"op": "update", "t": 3, "table_uuid": "L", "key": 9, "values": {"n": "9.1"}},  # equal
               {"op": "delete", "t": 3, "table_uuid": "L", "key": 11}]
    store = HistoryStore.open(tmp_path, database="db")
    write(store, events)
    store.compact(spark=False)
    converted = []

    def counting(original):
        def count(data_type, values, *rest):
            if hasattr(values, "__len__"):
                converted.append(len(values))
            else:
                converted.append(1)
            return original(data_type, values, *rest)
        return count

    for module in (engine_module, diff_module, types_module):
        for name in ("from_arrow_value", "from_arrow_values"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, counting(getattr(module, name)))
    got = store.diff("large", from_=3, to=4)
    assert [e["key"] for e in got["changed"]] == [7] and [e["key"] for e in got["deleted"]] == [11]
    assert got["changed"][0]["after"]["j"] == {"k": 8}
    # tens of conversions (a value may be counted twice: from_arrow_values calls from_arrow_value) for
    # the two rows answered and the one JSONB value compared, not the 2 x 3,000 x 4 values of both states
    assert sum(converted) <= 200, converted


def test_diff_compares_numeric_texts_as_numbers_and_leaves_other_forms_to_python():
    import duckdb

    from history_pipeline.query.diff import _Pair, python_differs
    from history_pipeline.schema import ColumnDescriptor
    from history_pipeline.types import parse_data_type

    numeric = parse_data_type("NUMERIC")
    column = ColumnDescriptor("c", "c", numeric, True, "a", "c-1")
    pair = _Pair(column, column, "b0", "a0")
    assert not pair.settled_in_sql  # a text SQL cannot read (an exponent) goes to Python
    con = duckdb.connect()
    cases = [("1.50", "1.5", False), ("-0.00", "0", False), ("12", "12.000", False), ("NaN", "NaN", False),
             (None, None, False), ("1.5", "1.51", True), ("10", "1", True), ("100", "1.00", True),
             (None, "1", True), ("1E+2", "100", None)]
    for before, after, expected in cases:
        got = con.execute(f"SELECT {pair.differs_sql()} FROM (SELECT CAST(? AS VARCHAR) AS b0) b, "
                          "(SELECT CAST(? AS VARCHAR) AS a0) a", [before, after]).fetchone()[0]
        assert got is expected, (before, after, got)
    assert python_differs([(numeric, numeric, [Decimal("1E+2"), Decimal("1E+2")],
                            [Decimal("100"), Decimal("101")])], 2) == [False, True]


def test_queries_of_one_state_and_time_reuse_a_set_up_cursor_and_answer_alike(tmp_path):
    """A finished query's cursor (its schema in use, its views and registrations made) serves the next
    query of the same state and T; a query reading another table, another T, or the schema history
    on it answers as on a fresh one, and a reader still streaming never shares its cursor."""
    from history_pipeline.query import sandbox

    store = HistoryStore.open(tmp_path, database="db")
    with store.wal_writer() as wal:
        for t, uuid_, name in ((1, "A", "customers"), (2, "B", "orders")):
            wal.append({"op": "create_table", "t": t, "table_uuid": uuid_, "table_name": name,
                        "columns": [{"column_uuid": f"{uuid_}v", "column_name": "v", "data_type": "NUMERIC(9,2)"}]})
        for k in range(3):
            wal.append({"op": "insert", "t": 3, "table_uuid": "A", "key": k, "values": {"Av": f"{k}.50"}})
            wal.append({"op": "insert", "t": 3, "table_uuid": "B", "key": k, "values": {"Bv": f"{k * 2}.25"}})
        wal.append({"op": "update", "t": 4, "table_uuid": "A", "key": 0, "values": {"Av": "9.00"}})
        wal.append({"op": "close", "t": 4})
        wal.seal()
    store.compact(spark=False)
    assert store.sql("SELECT sum(v) AS s FROM customers", as_of=4).to_pylist() == [{"s": Decimal("4.50")}]
    context = store.query_context()
    views = sandbox._sandboxes[context._sandbox_key()][1]
    (pooled,) = views.idle["__hp_asof_4"]
    assert "use" in pooled.done
    # the next query of T=3 takes that cursor: another table, an average, the schema history
    assert store.sql("SELECT avg(v) AS a FROM orders", as_of=4).column("a").to_pylist() == [
        Decimal("2.2500000000000000")]
    assert views.idle["__hp_asof_4"] == [pooled] and "B" in pooled.done
    assert store.sql("SELECT count(*) AS n FROM _history_catalog.schema_history", as_of=4).to_pylist() == [{"n": 2}]
    assert store.sql("SELECT sum(v) AS s FROM customers", as_of=5).to_pylist() == [{"s": Decimal("13.00")}]
    # two readers open at once each have their own cursor
    first = store.query_context().sql_reader("SELECT v FROM customers ORDER BY v", 5)
    second = store.query_context().sql_reader("SELECT v FROM orders ORDER BY v", 5)
    assert first.read_all().column("v").to_pylist() == [Decimal("1.50"), Decimal("2.50"), Decimal("9.00")]
    assert second.read_all().column("v").to_pylist() == [Decimal("0.25"), Decimal("2.25"), Decimal("4.25")]
    assert len(views.idle["__hp_asof_5"]) == 2
    # a failed query's cursor is not kept
    with pytest.raises(Exception, match="(?i)division by zero"):
        store.sql("SELECT v / (v - v) FROM customers", as_of=5)
    assert len(views.idle["__hp_asof_5"]) <= 2


def test_the_first_query_at_a_new_t_reuses_an_idle_cursor_of_another_t_and_answers_as_at_that_t(tmp_path):
    """A finished query's cursor serves the first query at another T of the same state: its macros are
    kept, its schema in use and schema-history rows are those of the new T, so answers are the new T's."""
    from history_pipeline.query import sandbox

    store = HistoryStore.open(tmp_path, database="db")
    with store.wal_writer() as wal:
        wal.append({"op": "create_table", "t": 1, "table_uuid": "A", "table_name": "customers",
                    "columns": [{"column_uuid": "Av", "column_name": "v", "data_type": "NUMERIC(9,2)"}]})
        for k in range(3):
            wal.append({"op": "insert", "t": 2, "table_uuid": "A", "key": k, "values": {"Av": f"{k}.50"}})
        wal.append({"op": "update", "t": 3, "table_uuid": "A", "key": 0, "values": {"Av": "9.00"}})
        wal.append({"op": "add_column", "t": 4, "table_uuid": "A",
                    "column": {"column_uuid": "Aw", "column_name": "w", "data_type": "TEXT"}})
        wal.append({"op": "close", "t": 4})
        wal.seal()
    store.compact(spark=False)
    query = "SELECT avg(v) AS a, sum(v) / count(*) AS per_row FROM customers"
    assert store.sql(query, as_of=5).to_pylist() == [{"a": Decimal("4.3333333333333333"),
                                                      "per_row": Decimal("4.3333333333333333")}]
    views = sandbox._sandboxes[store.query_context()._sandbox_key()][1]
    (pooled,) = views.idle["__hp_asof_5"]
    assert store.sql(query, as_of=3).to_pylist() == [{"a": Decimal("1.5000000000000000"),
                                                      "per_row": Decimal("1.5000000000000000")}]
    assert views.idle["__hp_asof_3"] == [pooled] and not views.idle["__hp_asof_5"]
    assert pooled.macros  # the exact average's macros, made at T=5, served T=3
    assert store.sql("SELECT count(*) AS n FROM _history_catalog.schema_history", as_of=4).to_pylist() == [{"n": 1}]
    assert store.sql("SELECT count(*) AS n FROM _history_catalog.schema_history", as_of=5).to_pylist() == [{"n": 2}]
    assert store.sql("SELECT * FROM customers WHERE synthetic_key = 1", as_of=3).column_names == ["synthetic_key", "v"]
    assert store.sql("SELECT v FROM customers ORDER BY v", as_of=3).column("v").to_pylist() == [
        Decimal("0.50"), Decimal("1.50"), Decimal("2.50")]
