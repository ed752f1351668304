"""The pooled query sandboxes: reused across queries without leaking anything between them.

A DuckDB database costs more to open than a small query costs to run, so queries share one
locked sandbox per catalog state (``query/sandbox.py``); these tests pin what that sharing must
not change: each query's views are its own, only the state's live files are readable, the
settings stay locked, and a new state gets a sandbox that reads its new files.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from history_pipeline import HistoryStore
from history_pipeline.errors import SandboxViolationError, TableNotFoundError
from history_pipeline.query import sandbox
from history_pipeline_tests.test_compaction import write

COLUMNS = [{"column_uuid": "v", "column_name": "v", "data_type": "INTEGER"}]


def test_cursors_of_one_sandbox_share_nothing_but_the_locked_settings(tmp_path):
    readable, other = tmp_path / "readable.parquet", tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1]}), readable)
    pq.write_table(pa.table({"x": [2]}), other)
    key = ("test", str(tmp_path), "1", "u")
    first = sandbox.query_cursor(key, [str(readable)])
    second = sandbox.query_cursor(key, [str(readable)])
    first.execute("CREATE TEMP VIEW mine AS SELECT 7 // 2 AS x")
    assert first.sql("SELECT x FROM mine").fetchall() == [(3,)]  # PostgreSQL's integer division
    with pytest.raises(duckdb.CatalogException):
        second.sql("SELECT * FROM mine")
    assert second.sql(f"SELECT x FROM read_parquet('{readable}')").fetchall() == [(1,)]
    with pytest.raises(duckdb.PermissionException):
        second.sql(f"SELECT x FROM read_parquet('{other}')").fetchall()
    with pytest.raises(duckdb.Error):
        second.execute("SET enable_external_access = true")
    first.close()
    third = sandbox.query_cursor(key, [str(readable)])
    with pytest.raises(duckdb.CatalogException):
        third.sql("SELECT * FROM mine")  # a closed cursor's views are gone
    sandbox.register_schema_history(third, pa.table({"table_uuid": ["T"], "table_name": ["t"],
                                                      "logical_timestamp": [1], "schema_descriptor": [None]}))
    assert third.sql("SELECT table_name FROM _history_catalog.schema_history").fetchall() == [("t",)]
    with pytest.raises(duckdb.CatalogException):
        second.sql("SELECT * FROM _history_catalog.schema_history")  # another cursor's rows are not seen


def test_queries_in_a_row_see_only_their_own_tables_and_each_new_state(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    write(store, [
        {"op": "create_table", "t": 1, "table_uuid": "A", "table_name": "a", "columns": COLUMNS},
        {"op": "create_table", "t": 2, "table_uuid": "B", "table_name": "b", "columns": COLUMNS},
        {"op": "insert", "t": 3, "table_uuid": "A", "key": 1, "values": {"v": 1}},
    ])
    store.compact(spark=False)
    assert store.sql("SELECT v FROM a", as_of=4).to_pylist() == [{"v": 1}]
    with pytest.raises(TableNotFoundError):
        store.sql("SELECT v FROM a", as_of=1)  # the view of the query before is not left behind
    assert store.sql("SELECT count(*) AS n FROM b", as_of=4).to_pylist() == [{"n": 0}]
    before = store.catalog_state()
    write(store, [{"op": "update", "t": 5, "table_uuid": "A", "key": 1, "values": {"v": 2}}])
    store.compact(spark=False)
    assert store.sql("SELECT v FROM a", as_of=6).to_pylist() == [{"v": 2}]  # the new file is readable
    new_file = next(f for f in store.catalog_state().files_of("A") if f.path not in before.files)
    assert new_file.path not in before.files


def test_only_the_newest_sandboxes_are_kept_and_a_kept_cursor_still_works(tmp_path):
    oldest = sandbox.query_cursor(("test", "evicted", "0"), None)
    for n in range(2 * sandbox.KEPT):
        sandbox.query_cursor(("test", "evict", str(n)), None).close()
    assert len(sandbox._sandboxes) == sandbox.KEPT
    assert ("test", "evicted", "0") not in sandbox._sandboxes
    assert oldest.sql("SELECT 7 // 2").fetchall() == [(3,)]  # its database lives while the cursor does


def test_a_file_outside_the_state_stays_unreadable_from_a_reused_sandbox(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    write(store, [
        {"op": "create_table", "t": 1, "table_uuid": "A", "table_name": "a", "columns": COLUMNS},
        {"op": "insert", "t": 2, "table_uuid": "A", "key": 1, "values": {"v": 1}},
    ])
    store.compact(spark=False)
    store.sql("SELECT v FROM a", as_of=3)  # the state's sandbox exists now
    stray = tmp_path / "db" / "stray.parquet"
    pq.write_table(pa.table({"secret": ["x"]}), stray)
    with pytest.raises(SandboxViolationError):
        store.sql(f"SELECT * FROM read_parquet('{stray}')", as_of=3)


def test_a_sandbox_asked_at_ever_new_t_is_replaced_before_it_grows_without_bound(monkeypatch):
    monkeypatch.setattr(sandbox, "KEPT_AS_OF", 3)
    key = ("test", "many-t", "0")
    first, views = sandbox.sandbox_cursor(key, None)
    for as_of in range(4):
        views.ensure(first, sandbox.AS_OF_SCHEMA.format(as_of=as_of), None)
    assert len(views.schemas) == 4
    again, fresh = sandbox.sandbox_cursor(key, None)
    assert fresh is not views and fresh.schemas == set()
    names = {row[0] for row in again.sql("SELECT schema_name FROM information_schema.schemata").fetchall()}
    assert not any(name.startswith("__hp_asof_") for name in names)
    assert sandbox.sandbox_cursor(key, None)[1] is fresh  # under the bound it is reused
