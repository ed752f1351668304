"""Deterministic workloads for the benchmarks, written through the real WAL writer.

N tables with mixed types; L live rows per table; then updates, deletes and inserts (70/5/25 %)
until the history holds H versions; schema changes of every kind spread through the history.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from history_pipeline import HistoryStore


@dataclass(frozen=True)
class Workload:
    tables: int = 2
    live_rows: int = 10_000
    versions: int = 100_000
    segment_events: int = 50_000
    seed: int = 42


COLUMNS = [
    ("qty", "INTEGER"),
    ("price", "NUMERIC(12,2)"),
    ("name", "TEXT"),
    ("at", "TIMESTAMPTZ"),
    ("flag", "BOOLEAN"),
    ("score", "DOUBLE PRECISION"),
]


def _value(rng: random.Random, data_type: str, n: int) -> Any:
    if data_type == "INTEGER" or data_type == "BIGINT":
        return rng.randint(0, 1_000_000)
    if data_type == "NUMERIC(12,2)":
        return f"{rng.randint(0, 10_000_000) / 100:.2f}"
    if data_type == "TEXT":
        return f"item-{n % 9973}"
    if data_type == "TIMESTAMPTZ":
        return f"2024-{1 + n % 12:02d}-{1 + n % 28:02d}T{n % 24:02d}:00:00+00:00"
    if data_type == "BOOLEAN":
        return n % 2 == 0
    return rng.random() * 1000


def events(w: Workload) -> Iterator[dict[str, Any]]:
    """The event stream of a workload (closes mark segment boundaries)."""
    rng = random.Random(w.seed)
    t = 0
    tables = []
    for i in range(w.tables):
        t += 1
        uuid = f"00000000-0000-4000-8000-{i:012d}"
        cols = {f"{uuid[:8]}-{j:04d}-4000-8000-{i:012d}": (name, ty) for j, (name, ty) in enumerate(COLUMNS)}
        tables.append({"uuid": uuid, "cols": cols, "live": [], "next_key": 1})
        yield {"op": "create_table", "t": t, "table_uuid": uuid, "table_name": f"table_{i}",
               "columns": [{"column_uuid": c, "column_name": n, "data_type": ty} for c, (n, ty) in cols.items()]}
    written = 0
    since_close = 0
    schema_every = max(w.versions // 12, 1)
    change = 0
    while written < w.versions:
        t += 1
        table = tables[written % w.tables]
        live = table["live"]
        roll = rng.random()
        if len(live) < w.live_rows * 0.98 or (roll < 0.25 and len(live) < w.live_rows * 1.02):
            key = table["next_key"]
            table["next_key"] += 1
            live.append(key)
            yield {"op": "insert", "t": t, "table_uuid": table["uuid"], "key": key,
                   "values": {c: _value(rng, ty, key) for c, (_, ty) in table["cols"].items()}}
        elif roll < 0.95 or len(live) < 2:
            key = live[rng.randrange(len(live))]
            c = rng.choice(sorted(table["cols"]))
            yield {"op": "update", "t": t, "table_uuid": table["uuid"], "key": key,
                   "values": {c: _value(rng, table["cols"][c][1], written)}}
        else:
            index = rng.randrange(len(live))
            live[index], live[-1] = live[-1], live[index]
            yield {"op": "delete", "t": t, "table_uuid": table["uuid"], "key": live.pop()}
        written += 1
        since_close += 1
        if written % schema_every == 0 and written < w.versions:
            t += 1
            yield from _schema_change(table, t, change)
            change += 1
        if since_close >= w.segment_events:
            yield {"op": "close", "t": t}
            since_close = 0
    yield {"op": "close", "t": t}


def _schema_change(table: dict[str, Any], t: int, n: int) -> Iterator[dict[str, Any]]:
    uuid = table["uuid"]
    kind = n % 6
    if kind == 0:
        c = f"{uuid[:8]}-9{n:03d}-4000-8000-{uuid[-12:]}"
        table["cols"][c] = (f"extra_{n}", "INTEGER")
        yield {"op": "add_column", "t": t, "table_uuid": uuid,
               "column": {"column_uuid": c, "column_name": f"extra_{n}", "data_type": "INTEGER"}, "default": 0}
    elif kind == 1:
        c = next(c for c, (_, ty) in table["cols"].items() if ty == "TEXT")
        yield {"op": "rename_column", "t": t, "table_uuid": uuid, "column_uuid": c, "new_name": f"label_{n}"}
    elif kind == 2:
        c = next((c for c, (_, ty) in table["cols"].items() if ty == "INTEGER"), None)
        if c is None:
            yield {"op": "reorder_column", "t": t, "table_uuid": uuid, "column_uuid": next(iter(table["cols"])),
                   "ordinal_key": "0"}
            return
        table["cols"][c] = (table["cols"][c][0], "BIGINT")
        yield {"op": "change_column_type", "t": t, "table_uuid": uuid, "column_uuid": c, "data_type": "BIGINT"}
    elif kind == 3:
        yield {"op": "reorder_column", "t": t, "table_uuid": uuid, "column_uuid": next(iter(table["cols"])),
               "ordinal_key": f"z{n}"}
    elif kind == 4:
        yield {"op": "change_column_nullable", "t": t, "table_uuid": uuid,
               "column_uuid": next(iter(table["cols"])), "is_nullable": n % 2 == 0}
    else:
        droppable = [c for c, (name, _) in table["cols"].items() if name.startswith("extra_")]
        if droppable:
            del table["cols"][droppable[0]]
            yield {"op": "drop_column", "t": t, "table_uuid": uuid, "column_uuid": droppable[0]}
        else:
            yield {"op": "rename_table", "t": t, "table_uuid": uuid, "new_name": f"table_{uuid[-1]}_{n}"}


def write_workload(store: HistoryStore, w: Workload) -> int:
    """Write the workload into the store's WAL as sealed segments; returns the event count."""
    count = 0
    with store.wal_writer(max_segment_bytes=1 << 40) as wal:
        for event in events(w):
            wal.append(event)
            count += 1
            if event["op"] == "close":
                wal.seal()
    return count


@dataclass(frozen=True)
class UpdateHeavy:
    """One table of six columns; transactions of ``transaction`` mutations (25 % inserts, 70 %
    updates setting 1-3 columns, 5 % deletes) sharing a timestamp; a close every ``close_every``
    transactions; a segment sealed at the first close after ``segment_events`` row events."""

    events: int = 300_000
    segment_events: int = 100_000
    transaction: int = 10
    close_every: int = 20
    seed: int = 42


UPDATE_HEAVY_TABLE = "00000000-0000-4000-8000-0000000000a1"
UPDATE_HEAVY_COLUMNS = {
    f"0000a1a1-{j:04d}-4000-8000-000000000000": (name, ty)
    for j, (name, ty) in enumerate([
        ("account", "BIGINT"), ("quantity", "BIGINT"), ("score", "DOUBLE PRECISION"),
        ("name", "TEXT"), ("note", "TEXT"), ("price", "NUMERIC(12,2)"),
    ])
}


def update_heavy_events(w: UpdateHeavy) -> Iterator[dict[str, Any]]:
    """The event stream of the update-heavy workload (its closes and segment ends included)."""
    rng = random.Random(w.seed)
    cols = UPDATE_HEAVY_COLUMNS
    names = sorted(cols)
    yield {"op": "create_table", "t": 1, "table_uuid": UPDATE_HEAVY_TABLE, "table_name": "accounts",
           "columns": [{"column_uuid": c, "column_name": n, "data_type": ty} for c, (n, ty) in cols.items()]}
    live: list[int] = []
    next_key, t, written, since_seal, transactions = 1, 1, 0, 0, 0
    while written < w.events:
        t += 1
        touched: set[int] = set()  # a key once per transaction: its events share the timestamp
        for _ in range(w.transaction):
            roll = rng.random()
            if roll < 0.25 or len(live) < 2 * w.transaction:
                key, next_key = next_key, next_key + 1
                live.append(key)
                touched.add(key)
                yield {"op": "insert", "t": t, "table_uuid": UPDATE_HEAVY_TABLE, "key": key,
                       "values": {c: _value(rng, ty, key) for c, (_, ty) in cols.items()}}
            else:
                index = rng.randrange(len(live))
                while live[index] in touched:
                    index = rng.randrange(len(live))
                key = live[index]
                touched.add(key)
                if roll < 0.95:
                    chosen = rng.sample(names, rng.randint(1, 3))
                    yield {"op": "update", "t": t, "table_uuid": UPDATE_HEAVY_TABLE, "key": key,
                           "values": {c: _value(rng, cols[c][1], written) for c in chosen}}
                else:
                    live[index], live[-1] = live[-1], live[index]
                    live.pop()
                    yield {"op": "delete", "t": t, "table_uuid": UPDATE_HEAVY_TABLE, "key": key}
            written += 1
            since_seal += 1
        transactions += 1
        if transactions % w.close_every == 0 or written >= w.events:
            yield {"op": "close", "t": t}
            if since_seal >= w.segment_events or written >= w.events:
                yield {"op": "seal", "t": t}
                since_seal = 0


def write_update_heavy(store: HistoryStore, w: UpdateHeavy) -> int:
    """Write the update-heavy workload into the store's WAL as sealed segments; returns the count
    of records written."""
    count = 0
    with store.wal_writer(max_segment_bytes=1 << 40) as wal:
        for event in update_heavy_events(w):
            if event["op"] == "seal":
                wal.seal()
                continue
            wal.append(event)
            count += 1
    return count


_SPARK_TYPES = {"BIGINT": "bigint", "INTEGER": "int", "SMALLINT": "smallint", "DOUBLE PRECISION": "double",
                "REAL": "float", "TEXT": "string", "BOOLEAN": "boolean", "TIMESTAMPTZ": "timestamp"}


def typed_wal_schema(stream: Iterator[dict[str, Any]]) -> Any:
    """The Spark schema a user who knows the tables gives to read a WAL's files: the envelope, and
    ``values`` as a struct of every table's columns, each of its (last) SQL type."""
    from pyspark.sql.types import StructField, StructType, _parse_datatype_string

    types: dict[str, str] = {}
    for event in stream:
        op = event["op"]
        if op == "create_table":
            types |= {c["column_uuid"]: c["data_type"] for c in event["columns"]}
        elif op == "add_column":
            types[event["column"]["column_uuid"]] = event["column"]["data_type"]
        elif op == "change_column_type":
            types[event["column_uuid"]] = event["data_type"]

    def spark_type(sql: str) -> str:
        return sql.replace("NUMERIC", "decimal") if sql.startswith("NUMERIC") else _SPARK_TYPES[sql]

    values = StructType([StructField(c, _parse_datatype_string(spark_type(ty))) for c, ty in sorted(types.items())])
    return _parse_datatype_string("op string, t bigint, table_uuid string, key bigint").add("values", values)
