"""The change feed of a captured PostgreSQL database: a consumer that reads the feed, stores its
cursor, and resumes after more commits were captured sees each committed transaction's row changes
exactly once, in commit order, each with the row PostgreSQL had before the transaction and after
it; schema changes come as records of their own, and a table is followed across its rename."""

from __future__ import annotations

import pytest

from history_pipeline import HistoryStore
from history_pipeline.capture.postgres import CaptureConfig, current_lsn, run_capture
from history_pipeline_tests.test_capture_postgres import _run, _tables, database, pg  # noqa: F401 (fixtures)

FIRST = [
    "CREATE TABLE acct (id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(12,2))",
    "INSERT INTO acct SELECT g, 'o' || g, g * 1.5 FROM generate_series(1, 20) g",
    ["UPDATE acct SET balance = balance + 10 WHERE id <= 5", "DELETE FROM acct WHERE id = 20",
     "INSERT INTO acct VALUES (21, 'o21', 2.25)"],
    "ALTER TABLE acct ADD COLUMN note text DEFAULT 'n'",
]
SECOND = [
    "UPDATE acct SET note = 'x' WHERE id % 2 = 0",
    "ALTER TABLE acct RENAME TO accounts",
    # one key changed twice in one transaction: one row version
    ["UPDATE accounts SET balance = 0 WHERE id = 3", "UPDATE accounts SET balance = 1 WHERE id = 3"],
    "DELETE FROM accounts WHERE id > 15",
]


def _by_id(tables: dict, name: str) -> dict:
    return {row["id"]: row for row in tables.get(name, [])}


@pytest.mark.postgres
def test_a_consumer_sees_each_committed_transaction_once_in_commit_order_with_its_images(tmp_path, database):  # noqa: F811
    dsn, conn = database
    store = HistoryStore.open(tmp_path, database="bank")
    config = CaptureConfig(dsn=dsn, slot="feed")
    run_capture(store, config, once=True)
    steps = [(current_lsn(conn), _tables(conn), None)]

    def run(workload):
        for step in workload:
            _run(conn, step)
            steps.append((current_lsn(conn), _tables(conn), step))
        run_capture(store, config, once=True)
        store.compact(spark=False)

    seen, cursor = [], 0

    def consume():
        nonlocal cursor
        for batch in store.changes(since=cursor):
            seen.extend(batch.records.to_pylist())
            cursor = batch.cursor  # stored with the consumer's results

    run(FIRST)
    consume()
    run(SECOND)
    consume()

    assert [r["t"] for r in seen] == sorted(r["t"] for r in seen)  # commit order
    rows = [r for r in seen if r["key"] is not None]
    assert len({(r["t"], r["table_uuid"], r["key"]) for r in rows}) == len(rows)  # nothing twice
    assert len({r["table_uuid"] for r in seen}) == 1  # one table, followed across its rename
    for (before_lsn, before, _), (after_lsn, after, step) in zip(steps, steps[1:], strict=False):
        inside = [r for r in seen if before_lsn < r["t"] < after_lsn]
        name = "accounts" if "accounts" in after else "acct"
        old, new = _by_id(before, "accounts" if "accounts" in before else "acct"), _by_id(after, name)
        if isinstance(step, str) and step.startswith(("CREATE", "ALTER")):
            assert inside and all(r["key"] is None for r in inside), step  # schema records only
            continue
        assert len({r["t"] for r in inside}) == 1, step  # one transaction, one timestamp
        changed = {i for i in old.keys() | new.keys() if old.get(i) != new.get(i)}
        got = {(r["before"] or r["after"])["id"]: r for r in inside}
        assert set(got) == changed and len(inside) == len(changed), step
        for key, r in got.items():
            assert (r["before"], r["after"]) == (old.get(key), new.get(key)), (step, key)
            assert r["op"] == ("insert" if key not in old else "delete" if key not in new else "update")
            assert r["table"] == name
            # the pre-image is what fetch_row as of the change's t gives
            assert store.fetch_row(r["table_uuid"], r["key"], as_of=r["t"]) == r["before"]
    assert [r["op"] for r in seen if r["key"] is None] == ["create_table", "add_column", "rename_table"]
