"""The Reconstruction Invariant for every query API: random event streams with schema changes are
compacted, and load_table, fetch_row, get_catalog, sql, row_history and diff are compared at every
T from 0 to frontier + 1 against the independent in-memory model."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from history_pipeline import HistoryStore, TableNotFoundError
from history_pipeline.casts import CastFailure, cast_value
from history_pipeline_tests.model import BaseDatabase, names_of, rows_by_uuid, table_uuid_named
from history_pipeline_tests.test_compaction import _split, random_history, write


def _named(model, uuid, as_of, row):
    return {name: row.get(cu) for cu, name, _ in names_of(model, uuid, as_of)}


def expected_diff(model, name, t1, t2):
    uuid = table_uuid_named(model, name, t2) or table_uuid_named(model, name, t1)
    before, after = rows_by_uuid(model, uuid, t1) or {}, rows_by_uuid(model, uuid, t2) or {}
    out = {"inserted": [], "deleted": [], "changed": []}
    for k in sorted(after.keys() - before.keys()):
        out["inserted"].append({"key": k, "after": _named(model, uuid, t2, after[k])})
    for k in sorted(before.keys() - after.keys()):
        out["deleted"].append({"key": k, "before": _named(model, uuid, t1, before[k])})
    old_types = {cu: ty for cu, _, ty in names_of(model, uuid, t1)} if before else {}
    for k in sorted(before.keys() & after.keys()):
        differs = False
        for cu, _, ty in names_of(model, uuid, t2):
            if cu not in old_types:
                continue
            value = before[k].get(cu)
            if old_types[cu] != ty:
                try:
                    value = cast_value(value, old_types[cu], ty)
                except CastFailure:
                    differs = True
                    break
            new = after[k].get(cu)
            if not (value == new or (value != value and new != new)):  # NaN equals NaN, as in PostgreSQL
                differs = True
                break
        if differs:
            out["changed"].append({"key": k, "before": _named(model, uuid, t1, before[k]),
                                   "after": _named(model, uuid, t2, after[k])})
    return out


def expected_history(model, events, uuid, key, frontier):
    versions = []
    times = sorted({e["t"] for e in events if e.get("table_uuid") == uuid and e.get("key") == key})
    for t in times:
        if t > frontier:
            break
        before = key in (rows_by_uuid(model, uuid, t) or {})
        rows_after = rows_by_uuid(model, uuid, t + 1) or {}
        after = key in rows_after
        if not before and not after:
            continue  # born and gone within one timestamp: no version
        values = _named(model, uuid, t + 1, rows_after[key]) if after else None
        versions.append({"logical_timestamp": t, "is_deleted": not after, "values": values})
    return versions


def check_every_api(store, events, rng):
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    frontier = store.frontier
    context = store.query_context()
    every_key = sorted({e["key"] for e in events if "key" in e}) + [10_000]  # deleted ones, and one never there
    for as_of in range(0, frontier + 2):
        state = model.state_as_of(as_of)
        names = sorted(t["name"] for t in state.values())
        assert [d.table_name for d in context.get_catalog(as_of)] == names
        for name in names:
            expected = model.table_as_of(name, as_of)
            got = {r.pop("synthetic_key"): r for r in context.load_table(name, as_of).to_pylist()}
            assert got == expected, (name, as_of)
            for key in every_key:
                assert context.fetch_row(name, key, as_of) == expected.get(key), (name, key, as_of)
            sql_rows = context.sql(f'SELECT * FROM "{name}" ORDER BY synthetic_key', as_of).to_pylist()
            assert {r.pop("synthetic_key"): r for r in sql_rows} == expected, (name, as_of)
        if not names:
            with pytest.raises(TableNotFoundError):
                context.load_table("tab0", as_of)
    for _ in range(6):
        t1, t2 = sorted(rng.randint(0, frontier + 1) for _ in range(2))
        for name in {t["name"] for t in model.state_as_of(t2).values()} | {
            t["name"] for t in model.state_as_of(t1).values()
        }:
            assert context.diff(name, from_=t1, to=t2) == expected_diff(model, name, t1, t2), (name, t1, t2)
    touched = sorted({(e["table_uuid"], e["key"]) for e in events if "key" in e})
    for uuid, key in rng.sample(touched, min(8, len(touched))):
        assert context.row_history(uuid, key) == expected_history(model, events, uuid, key, frontier), (uuid, key)


@pytest.mark.spark
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6, 7, 8])
def test_every_api_matches_the_model(tmp_path, seed):
    events = random_history(seed, n_events=60)
    store = HistoryStore.open(tmp_path, database="db")
    write(store, *_split(events, random.Random(seed)))
    store.compact()
    check_every_api(store, events, random.Random(seed))


@pytest.mark.spark
def test_sql_sums_numeric_exactly(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    with store.wal_writer() as wal:
        wal.append({"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "o",
                    "columns": [{"column_uuid": "a", "column_name": "amount", "data_type": "NUMERIC(12,2)"}]})
        for key in range(1, 11):
            wal.append({"op": "insert", "t": 2, "table_uuid": "T", "key": key, "values": {"a": "0.10"}})
        wal.append({"op": "close", "t": 2})
        wal.seal()
    store.compact()
    assert store.sql("SELECT sum(amount) AS s FROM o", as_of=3).to_pylist() == [{"s": Decimal("1.00")}]
