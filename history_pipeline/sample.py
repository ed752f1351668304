"""A small, realistic sample workload: three tables, thousands of row mutations, every kind of
schema change, spread over several sealed segments. Deterministic by seed."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any


def sample_events(seed: int = 7, customers: int = 500, orders: int = 4000) -> Iterator[dict[str, Any]]:
    """The sample stream; a ``close`` closes each batch of work (segments end at closes)."""
    rng = random.Random(seed)
    t = 0

    def tick() -> int:
        nonlocal t
        t += 1
        return t

    yield {
        "op": "create_table", "t": tick(), "table_uuid": "7d6c0c1e-0000-4000-8000-000000000001",
        "table_name": "customers",
        "columns": [
            {"column_uuid": "c0000001-0000-4000-8000-000000000001", "column_name": "name", "data_type": "TEXT",
             "is_nullable": False},
            {"column_uuid": "c0000001-0000-4000-8000-000000000002", "column_name": "email",
             "data_type": "VARCHAR(120)"},
            {"column_uuid": "c0000001-0000-4000-8000-000000000003", "column_name": "signed_up",
             "data_type": "TIMESTAMPTZ"},
        ],
    }
    yield {
        "op": "create_table", "t": tick(), "table_uuid": "7d6c0c1e-0000-4000-8000-000000000002",
        "table_name": "orders",
        "columns": [
            {"column_uuid": "c0000002-0000-4000-8000-000000000001", "column_name": "customer_id",
             "data_type": "BIGINT", "is_nullable": False},
            {"column_uuid": "c0000002-0000-4000-8000-000000000002", "column_name": "amount",
             "data_type": "NUMERIC(12,2)"},
            {"column_uuid": "c0000002-0000-4000-8000-000000000003", "column_name": "status", "data_type": "TEXT"},
            {"column_uuid": "c0000002-0000-4000-8000-000000000004", "column_name": "tags", "data_type": "TEXT[]"},
        ],
    }
    customer_uuid, order_uuid = "7d6c0c1e-0000-4000-8000-000000000001", "7d6c0c1e-0000-4000-8000-000000000002"
    yield {"op": "close", "t": t}
    for key in range(1, customers + 1):
        yield {
            "op": "insert", "t": tick(), "table_uuid": customer_uuid, "key": key,
            "values": {
                "c0000001-0000-4000-8000-000000000001": f"customer {key}",
                "c0000001-0000-4000-8000-000000000002": f"c{key}@example.com",
                "c0000001-0000-4000-8000-000000000003": f"2024-01-{1 + key % 28:02d}T10:00:00+02:00",
            },
        }
    yield {"op": "close", "t": t}
    live_orders: list[int] = []
    statuses = ["new", "paid", "shipped", "returned"]
    for n in range(orders):
        ts = tick()
        roll = rng.random()
        if not live_orders or roll < 0.45:
            key = 10_000 + n
            live_orders.append(key)
            yield {
                "op": "insert", "t": ts, "table_uuid": order_uuid, "key": key,
                "values": {
                    "c0000002-0000-4000-8000-000000000001": rng.randint(1, customers),
                    "c0000002-0000-4000-8000-000000000002": f"{rng.randint(100, 99_999) / 100:.2f}",
                    "c0000002-0000-4000-8000-000000000003": "new",
                    "c0000002-0000-4000-8000-000000000004": rng.sample(["gift", "express", "bulk"], rng.randint(0, 2)),
                },
            }
        elif roll < 0.92:
            yield {
                "op": "update", "t": ts, "table_uuid": order_uuid, "key": rng.choice(live_orders),
                "values": {"c0000002-0000-4000-8000-000000000003": rng.choice(statuses)},
            }
        else:
            key = live_orders.pop(rng.randrange(len(live_orders)))
            yield {"op": "delete", "t": ts, "table_uuid": order_uuid, "key": key}
        if n % 400 == 399:
            yield {"op": "close", "t": t}
        if n == 1800:
            yield {"op": "add_column", "t": tick(), "table_uuid": order_uuid,
                   "column": {"column_uuid": "c0000002-0000-4000-8000-000000000005", "column_name": "priority",
                              "data_type": "INTEGER"}, "default": 0}
            yield {"op": "rename_column", "t": tick(), "table_uuid": order_uuid,
                   "column_uuid": "c0000002-0000-4000-8000-000000000003", "new_name": "state"}
            yield {"op": "change_column_type", "t": tick(), "table_uuid": order_uuid,
                   "column_uuid": "c0000002-0000-4000-8000-000000000001", "data_type": "NUMERIC(20,0)"}
            yield {"op": "change_column_nullable", "t": tick(), "table_uuid": customer_uuid,
                   "column_uuid": "c0000001-0000-4000-8000-000000000002", "is_nullable": False}
            yield {"op": "reorder_column", "t": tick(), "table_uuid": order_uuid,
                   "column_uuid": "c0000002-0000-4000-8000-000000000005", "ordinal_key": "0"}
    yield {"op": "create_table", "t": tick(), "table_uuid": "7d6c0c1e-0000-4000-8000-000000000003",
           "table_name": "audit_tmp",
           "columns": [{"column_uuid": "c0000003-0000-4000-8000-000000000001", "column_name": "note",
                        "data_type": "JSONB"}]}
    yield {"op": "insert", "t": tick(), "table_uuid": "7d6c0c1e-0000-4000-8000-000000000003", "key": 1,
           "values": {"c0000003-0000-4000-8000-000000000001": {"kind": "migration", "ok": True}}}
    yield {"op": "rename_table", "t": tick(), "table_uuid": customer_uuid, "new_name": "clients"}
    yield {"op": "drop_column", "t": tick(), "table_uuid": customer_uuid,
           "column_uuid": "c0000001-0000-4000-8000-000000000003"}
    yield {"op": "drop_table", "t": tick(), "table_uuid": "7d6c0c1e-0000-4000-8000-000000000003"}
    yield {"op": "close", "t": t}
