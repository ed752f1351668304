"""An independent in-memory model of the base database, replayed event by event.

It knows nothing of supertables: it keeps each table's rows and schema and
answers "what did the database look like after every event below T".
"""

from __future__ import annotations

import copy
from typing import Any

from history_pipeline.casts import cast_value
from history_pipeline.types import decode_value, parse_data_type


class BaseDatabase:
    def __init__(self):
        self.tables: dict[str, dict[str, Any]] = {}  # uuid -> {name, columns: [(uuid, name, type, key)], rows}
        self.snapshots: list[tuple[int, dict]] = []  # (t, deep copy after all events at t)

    def apply(self, event: dict[str, Any]) -> None:
        op, t = event["op"], event["t"]
        if op == "close":
            return
        if op == "create_table":
            cols = [
                [
                    c["column_uuid"],
                    c["column_name"],
                    parse_data_type(c["data_type"]),
                    c.get("ordinal_key") or f"{i:08d}",
                    c.get("is_nullable", True),
                ]
                for i, c in enumerate(event["columns"])
            ]
            self.tables[event["table_uuid"]] = {"name": event["table_name"], "columns": cols, "rows": {}}
        elif op == "drop_table":
            del self.tables[event["table_uuid"]]
        elif op == "rename_table":
            self.tables[event["table_uuid"]]["name"] = event["new_name"]
        elif op == "add_column":
            table = self.tables[event["table_uuid"]]
            c = event["column"]
            dt = parse_data_type(c["data_type"])
            key = c.get("ordinal_key") or max(col[3] for col in table["columns"]) + "0"
            table["columns"].append([c["column_uuid"], c["column_name"], dt, key, c.get("is_nullable", True)])
            default = decode_value(dt, event.get("default"))
            # a default keeps its declared type and is cast to the column's type when used
            table.setdefault("defaults", {})[c["column_uuid"]] = None if default is None else (dt, default)
            for row in table["rows"].values():
                row[c["column_uuid"]] = default
        elif op == "drop_column":
            table = self.tables[event["table_uuid"]]
            table["columns"] = [c for c in table["columns"] if c[0] != event["column_uuid"]]
            for row in table["rows"].values():
                row.pop(event["column_uuid"], None)
        elif op == "rename_column":
            for c in self.tables[event["table_uuid"]]["columns"]:
                if c[0] == event["column_uuid"]:
                    c[1] = event["new_name"]
        elif op == "change_column_type":
            table = self.tables[event["table_uuid"]]
            new = parse_data_type(event["data_type"])
            for c in table["columns"]:
                if c[0] == event["column_uuid"]:
                    old, c[2] = c[2], new
            for row in table["rows"].values():
                row[event["column_uuid"]] = (None if event.get("values_follow")
                                             else cast_value(row.get(event["column_uuid"]), old, new))
            defaults = table.setdefault("defaults", {})
            if defaults.get(event["column_uuid"]) is not None:
                declared, value = defaults[event["column_uuid"]]
                try:
                    cast_value(value, declared, new)
                except ValueError:
                    defaults[event["column_uuid"]] = None  # a default that cannot become the new type is dropped
        elif op == "change_column_nullable":
            for c in self.tables[event["table_uuid"]]["columns"]:
                if c[0] == event["column_uuid"]:
                    c[4] = event["is_nullable"]
        elif op == "reorder_column":
            for c in self.tables[event["table_uuid"]]["columns"]:
                if c[0] == event["column_uuid"]:
                    c[3] = event["ordinal_key"]
        elif op == "insert":
            table = self.tables[event["table_uuid"]]
            types = {c[0]: c[2] for c in table["columns"]}
            defaults = table.get("defaults", {})

            def default(u):
                if defaults.get(u) is None:
                    return None
                declared, value = defaults[u]
                return cast_value(value, declared, types[u])

            table["rows"][event["key"]] = {
                u: decode_value(types[u], event["values"][u]) if u in event["values"] else default(u)
                for u in types
            }
        elif op == "update":
            table = self.tables[event["table_uuid"]]
            types = {c[0]: c[2] for c in table["columns"]}
            row = table["rows"][event["key"]]
            for u, v in event["values"].items():
                row[u] = decode_value(types[u], v)
        elif op == "delete":
            del self.tables[event["table_uuid"]]["rows"][event["key"]]
        self.snapshots.append((t, copy.deepcopy(self.tables)))

    def state_as_of(self, as_of: int) -> dict:
        state: dict = {}
        for t, snap in self.snapshots:
            if t < as_of:
                state = snap
        return state

    def table_as_of(self, name: str, as_of: int) -> dict[int, dict[str, Any]] | None:
        for table in self.state_as_of(as_of).values():
            if table["name"] == name:
                cols = sorted(table["columns"], key=lambda c: (c[3], c[0]))
                return {k: {c[1]: row.get(c[0]) for c in cols} for k, row in table["rows"].items()}
        return None

    def column_order(self, name: str, as_of: int) -> list[str] | None:
        for table in self.state_as_of(as_of).values():
            if table["name"] == name:
                return [c[1] for c in sorted(table["columns"], key=lambda c: (c[3], c[0]))]
        return None


def replayed(events: list[dict[str, Any]]) -> BaseDatabase:
    """The model after applying ``events`` in order."""
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    return model


def table_uuid_named(model: BaseDatabase, name: str, as_of: int) -> str | None:
    for uuid, table in model.state_as_of(as_of).items():
        if table["name"] == name:
            return uuid
    return None


def rows_by_uuid(model: BaseDatabase, table_uuid: str, as_of: int) -> dict | None:
    table = model.state_as_of(as_of).get(table_uuid)
    return None if table is None else table["rows"]


def nullability_of(model: BaseDatabase, table_uuid: str, as_of: int) -> list[bool]:
    """is_nullable of each column, in column order."""
    table = model.state_as_of(as_of)[table_uuid]
    return [c[4] for c in sorted(table["columns"], key=lambda c: (c[3], c[0]))]


def names_of(model: BaseDatabase, table_uuid: str, as_of: int) -> list[tuple[str, str, object]]:
    """(column uuid, name, type) in column order."""
    table = model.state_as_of(as_of)[table_uuid]
    return [(c[0], c[1], c[2]) for c in sorted(table["columns"], key=lambda c: (c[3], c[0]))]


def erase_keys(model: BaseDatabase, table_uuid: str, keys: set[int]) -> None:
    """Forget ``keys`` of one table in every past state (an erasure rewrites all of history)."""
    for snap in [model.tables, *(s for _, s in model.snapshots)]:
        table = snap.get(table_uuid)
        if table is not None:
            for key in keys:
                table["rows"].pop(key, None)
