"""From decoded PostgreSQL transactions to WAL events (pure: no database, no files).

The capture's knowledge of the captured tables is a :class:`CaptureState` (immutable, saved as
JSON beside the WAL). :func:`transaction_events` takes the state and the messages of one
transaction and returns the next state and the transaction's WAL records, with their timestamps:

* the transaction's logical timestamp ``c`` is its commit record's LSN;
* a transaction without schema changes writes every row change at ``c``;
* otherwise each schema change, and each run of row changes between them, takes one of the
  consecutive timestamps ending at ``c`` (every one of them wrote WAL bytes before the commit
  record, so they stay above the previous commit's LSN; this is checked);
* a ``close`` at ``c`` ends every transaction.

Schema changes come from the rows that the capture's event triggers insert into
``history_capture.ddl_log``: each holds the table's description after the DDL command (name,
columns with attnum, type, nullability and the UUIDs the database assigned once), and the
change events are the difference from the previous description.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from history_pipeline.capture.pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    DeleteMessage,
    Ignored,
    InsertMessage,
    Message,
    Relation,
    RelationColumn,
    TruncateMessage,
    UpdateMessage,
)
from history_pipeline.capture.values import CaptureValueError, contract_type, convert, converter, parse_array
from history_pipeline.errors import HistoryError

CAPTURE_SCHEMA = "history_capture"
DDL_LOG = "ddl_log"
SNAPSHOT_ROWS = "snapshot_rows"
_KEY_TYPES = ("SMALLINT", "INTEGER", "BIGINT")


class CaptureError(HistoryError):
    """A captured change cannot be written to the WAL as it is."""


@dataclass(frozen=True)
class ColumnState:
    attnum: int
    column_uuid: str
    name: str
    data_type: str
    not_null: bool


@dataclass(frozen=True)
class TableState:
    relid: int
    table_uuid: str
    name: str
    columns: tuple[ColumnState, ...]
    key_attnums: tuple[int, ...] = ()

    def column(self, name: str) -> ColumnState:
        for c in self.columns:
            if c.name == name:
                return c
        raise CaptureError(f"table {self.name!r} has no captured column {name!r}; the capture state is behind")


@dataclass(frozen=True)
class CaptureOptions:
    """What to capture and how."""

    schemas: tuple[str, ...] = ("public",)
    #: table name -> the integer column that is its synthetic key (default: the primary key)
    keys: Mapping[str, str] = field(default_factory=dict)
    #: unknown PostgreSQL types become TEXT holding their text output instead of an error
    text_fallback: bool = False
    #: names of tables that are not captured (as named when the capture first sees them)
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class CaptureState:
    """What the capture knows after the transactions it has written."""

    tables: Mapping[int, TableState] = field(default_factory=dict)
    #: the last written transaction's commit LSN (its WAL timestamp) and end LSN (the slot's position)
    last_t: int = -1
    last_end_lsn: int = 0

    def to_json(self) -> str:
        """The state as JSON (what the capture saves beside the WAL)."""
        return json.dumps(
            {
                "last_t": self.last_t,
                "last_end_lsn": self.last_end_lsn,
                "tables": [
                    {
                        "relid": t.relid,
                        "table_uuid": t.table_uuid,
                        "name": t.name,
                        "key_attnums": list(t.key_attnums),
                        "columns": [c.__dict__ for c in t.columns],
                    }
                    for t in self.tables.values()
                ],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> CaptureState:
        """Read a state written by :meth:`to_json`."""
        raw = json.loads(text)
        tables = {
            t["relid"]: TableState(
                t["relid"],
                t["table_uuid"],
                t["name"],
                tuple(ColumnState(**c) for c in t["columns"]),
                tuple(t["key_attnums"]),
            )
            for t in raw["tables"]
        }
        return cls(tables, raw["last_t"], raw["last_end_lsn"])


@dataclass(frozen=True)
class Transaction:
    """One decoded transaction: its messages from ``Begin`` to ``Commit`` (relations included)."""

    commit_lsn: int
    end_lsn: int
    messages: tuple[Message, ...]
    #: commit time in microseconds since 2000-01-01 UTC (PostgreSQL's epoch)
    commit_time: int = 0


def split_transactions(messages: Sequence[Message]) -> tuple[list[Transaction], list[Message]]:
    """Complete transactions in ``messages``, and the messages after the last commit (if any)."""
    done: list[Transaction] = []
    current: list[Message] = []
    for message in messages:
        current.append(message)
        if isinstance(message, Commit):
            done.append(Transaction(message.commit_lsn, message.end_lsn, tuple(current), message.commit_time))
            current = []
    return done, current


# --- schema changes ------------------------------------------------------------------


def _describe(raw: Mapping[str, Any], relid: int, options: CaptureOptions) -> TableState:
    name = raw["name"]
    columns = []
    for c in raw["columns"]:
        where = f"table {name!r} column {c['name']!r}"
        data_type = contract_type(c["type_oid"], c["typmod"], text_fallback=options.text_fallback, where=where)
        columns.append(ColumnState(c["attnum"], str(c["column_uuid"]), c["name"], data_type, bool(c["not_null"])))
    return TableState(relid, str(raw["table_uuid"]), name, tuple(columns), tuple(raw.get("key") or ()))


def _column_record(c: ColumnState) -> dict[str, Any]:
    return {
        "column_uuid": c.column_uuid,
        "column_name": c.name,
        "data_type": c.data_type,
        "is_nullable": not c.not_null,
    }


def schema_changes(
    before: TableState | None, after: TableState | None, raw: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The WAL schema-change records (without ``t``) that turn ``before`` into ``after``."""
    if after is None:
        return [] if before is None else [{"op": "drop_table", "table_uuid": before.table_uuid}]
    if before is None:
        return [
            {
                "op": "create_table",
                "table_uuid": after.table_uuid,
                "table_name": after.name,
                "columns": [_column_record(c) for c in after.columns],
            }
        ]
    table = after.table_uuid
    out: list[dict[str, Any]] = []
    if before.name != after.name:
        out.append({"op": "rename_table", "table_uuid": table, "new_name": after.name})
    old = {c.attnum: c for c in before.columns}
    new = {c.attnum: c for c in after.columns}
    for attnum, c in old.items():
        if attnum not in new:
            out.append({"op": "drop_column", "table_uuid": table, "column_uuid": c.column_uuid})
    for attnum, c in new.items():
        if attnum not in old:
            continue
        was = old[attnum]
        if was.name != c.name:
            out.append({"op": "rename_column", "table_uuid": table, "column_uuid": c.column_uuid, "new_name": c.name})
        if was.data_type != c.data_type:
            change = {"op": "change_column_type", "table_uuid": table, "column_uuid": c.column_uuid}
            out.append({**change, "data_type": c.data_type})
        if was.not_null != c.not_null:
            out.append(
                {
                    "op": "change_column_nullable",
                    "table_uuid": table,
                    "column_uuid": c.column_uuid,
                    "is_nullable": not c.not_null,
                }
            )
    raw_columns = {c["attnum"]: c for c in (raw or {}).get("columns", [])}
    for attnum, c in new.items():
        if attnum in old:
            continue
        record: dict[str, Any] = {"op": "add_column", "table_uuid": table, "column": _column_record(c)}
        described = raw_columns.get(attnum, {})
        where = f"table {after.name!r} column {c.name!r}"
        if described.get("missing") is not None:
            record["default"] = convert(c.data_type, described["missing"], where=where)
        elif described.get("has_default") and (raw or {}).get("has_rows"):
            raise CaptureError(
                f"{where} was added with a volatile default that gave each existing row its own value; the WAL "
                "cannot say which. Add the column without a default, then UPDATE the rows in a separate statement"
            )
        out.append(record)
    return out


# --- row changes ---------------------------------------------------------------------


@dataclass(frozen=True)
class RowPlan:
    """How the rows of one relation become WAL values, worked out once per table state and relation
    (not per row): where the key is, and each column's UUID and converter."""

    table: TableState
    relation: Relation
    #: the key column's position in a decoded row, or -1 when :attr:`key_error` says why there is none
    key_index: int
    key_error: str
    #: per decoded column: its position, UUID (None when the state has no such column), contract type,
    #: converter and the name errors give it
    columns: tuple[tuple[int, str | None, str, Callable[[str], Any], str], ...]


def row_plan(table: TableState, relation: Relation, options: CaptureOptions) -> RowPlan:
    """The :class:`RowPlan` of ``relation``'s rows for the captured ``table``."""
    columns = []
    by_name = {c.name: c for c in table.columns}
    for index, rc in enumerate(relation.columns):
        column = by_name.get(rc.name)
        where = f"table {table.name!r} column {rc.name!r}"
        if column is None:
            columns.append((index, None, "", _identity, where))
        else:
            columns.append((index, column.column_uuid, column.data_type, converter(column.data_type), where))
    key_index, key_error = -1, ""
    try:
        key = _key_column(table, options)
        key_error = f"table {table.name!r}: key column {key.name!r} is not in the decoded row"
        key_index = next(i for i, rc in enumerate(relation.columns) if rc.name == key.name)
        key_error = f"table {table.name!r}: a row without a value for key column {key.name!r}"
    except CaptureError as exc:
        key_error = str(exc)
    except StopIteration:
        pass
    return RowPlan(table, relation, key_index, key_error, tuple(columns))


def _identity(text: str) -> str:
    return text


def _key_column(table: TableState, options: CaptureOptions) -> ColumnState:
    declared = options.keys.get(table.name)
    if declared is not None:
        column = table.column(declared)
    else:
        if len(table.key_attnums) != 1:
            raise CaptureError(
                f"table {table.name!r} has no single-column primary key to use as the synthetic key; add one, "
                f"or declare an integer key column (--key {table.name}=COLUMN)"
            )
        column = next(c for c in table.columns if c.attnum == table.key_attnums[0])
    if column.data_type not in _KEY_TYPES:
        raise CaptureError(
            f"table {table.name!r}: key column {column.name!r} is {column.data_type}, but a synthetic key is a 64-bit "
            "integer; declare an integer key column (--key TABLE=COLUMN)"
        )
    return column


def _key(plan: RowPlan, values: tuple[Any, ...]) -> int:
    if plan.key_index < 0:
        raise CaptureError(plan.key_error)
    value = values[plan.key_index]
    if value is None or value is UNCHANGED:
        raise CaptureError(plan.key_error)
    return int(value)


def _values(plan: RowPlan, values: tuple[Any, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for index, uuid, data_type, convert_text, where in plan.columns:
        value = values[index]
        if value is UNCHANGED:
            continue  # an unchanged TOASTed value: the previous version's value is carried forward
        if uuid is None:
            plan.table.column(plan.relation.columns[index].name)  # raises: the capture state is behind
        if value is None:
            out[uuid] = None  # type: ignore[index]
            continue
        try:
            out[uuid] = convert_text(value)  # type: ignore[index]
        except (ValueError, KeyError, IndexError) as exc:
            raise CaptureValueError(f"{where}: value {value!r} of type {data_type} has no WAL form: {exc}") from None
    return out


def _row_changes(plan: RowPlan, message: Message) -> list[dict[str, Any]]:
    table = plan.table
    width = len(plan.columns)
    if type(message) is InsertMessage and len(message.new) == width:  # most rows: no further checks
        key = _key(plan, message.new)
        return [{"op": "insert", "table_uuid": table.table_uuid, "key": key, "values": _values(plan, message.new)}]
    for values in (getattr(message, "new", None), getattr(message, "old", None)):
        if values is not None and len(values) != width:
            raise CaptureError(
                f"table {table.name!r}: a decoded row has {len(values)} values for {width} columns of its relation"
            )
    if isinstance(message, InsertMessage):
        key = _key(plan, message.new)
        return [{"op": "insert", "table_uuid": table.table_uuid, "key": key, "values": _values(plan, message.new)}]
    if isinstance(message, DeleteMessage):
        return [{"op": "delete", "table_uuid": table.table_uuid, "key": _key(plan, message.old)}]
    assert isinstance(message, UpdateMessage)
    base = {"table_uuid": table.table_uuid}
    key = _key(plan, message.new)
    values = _values(plan, message.new)
    if message.old is not None:
        old_key = _key(plan, message.old)
        if old_key != key:  # the key itself changed: a row with a new identity
            if any(v is UNCHANGED for v in message.new):
                raise CaptureError(
                    f"table {table.name!r}: an update moved key {old_key} to {key} but left a TOASTed value "
                    "unsent; set REPLICA IDENTITY FULL on the table to capture such updates"
                )
            return [{"op": "delete", **base, "key": old_key}, {"op": "insert", **base, "key": key, "values": values}]
    return [{"op": "update", **base, "key": key, "values": values}]


# --- one transaction -----------------------------------------------------------------


@dataclass(frozen=True)
class Decoded:
    """A transaction's outcome: the next state and its WAL records (timestamps assigned)."""

    state: CaptureState
    records: tuple[dict[str, Any], ...]
    relations: Mapping[int, Relation]


#: the keys of a table (by uuid) live in the history as of a timestamp (every event at or below it)
LiveKeys = Callable[[str, int], Iterable[int]]


def transaction_events(
    state: CaptureState,
    transaction: Transaction,
    relations: Mapping[int, Relation],
    options: CaptureOptions,
    live_keys: LiveKeys | None = None,
) -> Decoded:
    """The WAL records of one transaction and the capture state after it.

    A ``TRUNCATE`` of a captured table becomes a delete of every key live in it at that point:
    ``live_keys`` gives those the history holds before the transaction, and the transaction's own
    earlier changes of the table are applied to them.
    """
    relations = dict(relations)
    tables = dict(state.tables)
    items: list[tuple[str, dict[str, Any]]] = []  # ("schema" | "row", record without t)
    resnapshot: set[int] = set()  # tables whose snapshot rows update rows the history already has
    plans: dict[tuple[int, bool], RowPlan] = {}  # (relid, from a snapshot) -> the plan of its rows
    for message in transaction.messages:
        if isinstance(message, Relation):
            relations[message.relid] = message
            continue
        if isinstance(message, (Begin, Commit, Ignored)):
            continue
        if isinstance(message, TruncateMessage):
            for relid in message.relids:
                if relid in tables:
                    items.extend(("row", r) for r in _truncated(tables[relid], items, state.last_t, options,
                                                                live_keys))
            continue
        relid = message.relid
        relation = relations.get(relid)
        if relation is None:
            raise CaptureError(f"a change of relation {relid} arrived before its relation message")
        if relation.namespace == CAPTURE_SCHEMA:
            if relation.name == DDL_LOG and isinstance(message, InsertMessage):
                for record in _apply_ddl(tables, relation, message, options, resnapshot):
                    items.append(("schema", record))
            elif relation.name == SNAPSHOT_ROWS and isinstance(message, InsertMessage):
                items.extend(("row", r) for r in _snapshot_row(tables, relation, message, options, resnapshot,
                                                                  plans))
            continue
        if relation.namespace not in options.schemas:
            continue
        table = tables.get(relid)
        if table is None:
            # a table the capture has not described yet: one that existed before capture was set up, or
            # a CREATE TABLE AS; its rows arrive as a snapshot when it is described
            continue
        plan = plans.get((relid, False))
        if plan is None or plan.table is not table or plan.relation is not relation:
            plan = plans[relid, False] = row_plan(table, relation, options)
        for record in _row_changes(plan, message):
            items.append(("row", record))
    records = _stamp(items, transaction.commit_lsn, state.last_t)
    next_state = CaptureState(tables, transaction.commit_lsn, transaction.end_lsn)
    return Decoded(next_state, tuple(records), relations)


def apply_key_changes(keys: set[int], records: Iterable[Mapping[str, Any]], table_uuid: str) -> None:
    """Apply, in order, what ``records`` (WAL events) do to the set of ``table_uuid``'s live keys: an
    insert adds its key, a delete removes it, a create or drop of the table empties the set."""
    for record in records:
        if record.get("table_uuid") != table_uuid:
            continue
        if record["op"] == "insert":
            keys.add(record["key"])
        elif record["op"] == "delete":
            keys.discard(record["key"])
        elif record["op"] in ("create_table", "drop_table"):
            keys.clear()


def _truncated(table: TableState, items: Sequence[tuple[str, dict[str, Any]]], before: int,
               options: CaptureOptions, live_keys: LiveKeys | None) -> list[dict[str, Any]]:
    """The deletes a TRUNCATE of ``table`` means: the keys live in the history as of ``before`` (the
    previous transaction's commit), then changed by this transaction's records so far."""
    if options.keys.get(table.name) is None and len(table.key_attnums) != 1:
        raise CaptureError(
            f"TRUNCATE of {table.name!r} cannot be captured: the table has no key, so its rows cannot be named "
            f"as deletes; --exclude it, or declare an integer key column (--key {table.name}=COLUMN)"
        )
    if live_keys is None:
        raise CaptureError(f"TRUNCATE of {table.name!r} needs the history's keys of the table, which are not at hand")
    keys = set(live_keys(table.table_uuid, before))
    apply_key_changes(keys, (record for _, record in items), table.table_uuid)
    return [{"op": "delete", "table_uuid": table.table_uuid, "key": key} for key in sorted(keys)]


def _apply_ddl(
    tables: dict[int, TableState], relation: Relation, message: InsertMessage, options: CaptureOptions,
    resnapshot: set[int],
) -> list[dict[str, Any]]:
    row = {c.name: v for c, v in zip(relation.columns, message.new, strict=True)}
    relid = int(row["relid"])
    before = tables.get(relid)
    resnapshot.discard(relid)
    if row["dropped"] == "t":
        tables.pop(relid, None)
        return schema_changes(before, None)
    raw = json.loads(row["description"])
    if raw["schema"] not in options.schemas:  # moved out of the captured schemas: gone for the history
        tables.pop(relid, None)
        return schema_changes(before, None)
    if before is None and raw["name"] in options.exclude:
        return []
    after = _describe(raw, relid, options)
    tables[relid] = after
    changes = schema_changes(before, after, raw)
    if before is not None and raw.get("snapshot"):
        # a type change PostgreSQL may have computed otherwise than CAST (USING, the session's time zone,
        # json text): the rows that follow are the table as the change left it, so nothing is cast
        resnapshot.add(relid)
        changes = [{**c, "values_follow": True} if c["op"] == "change_column_type" else c for c in changes]
    if before is not None and before.key_attnums != after.key_attnums and before.key_attnums:
        raise CaptureError(
            f"table {after.name!r}: its primary key changed, which would change every row's synthetic key"
        )
    return changes


def _snapshot_row(
    tables: dict[int, TableState], relation: Relation, message: InsertMessage, options: CaptureOptions,
    resnapshot: set[int], plans: dict[tuple[int, bool], RowPlan],
) -> list[dict[str, Any]]:
    row = {c.name: v for c, v in zip(relation.columns, message.new, strict=True)}
    table = tables.get(int(row["relid"]))
    if table is None:
        return []
    vals = row["vals"]
    # a two-dimensional array holds many rows; a one-dimensional one a single row (whose first element, were
    # it to start with a brace, would be quoted: "{{" starts only a two-dimensional array)
    rows = parse_array(vals) if vals.startswith("{{") else [parse_array(vals)]
    plan = plans.get((table.relid, True))
    if plan is None or plan.table is not table:
        columns = tuple(RelationColumn(c.name, 0, -1, False) for c in table.columns)
        as_relation = Relation(table.relid, "", table.name, "d", columns)
        plan = plans[table.relid, True] = row_plan(table, as_relation, options)
    as_update = table.relid in resnapshot
    records = []
    for texts in rows:
        if len(texts) != len(table.columns):
            raise CaptureError(
                f"table {table.name!r}: a snapshot row has {len(texts)} values, not {len(table.columns)}"
            )
        values = tuple(texts)
        change = UpdateMessage(table.relid, None, values) if as_update else InsertMessage(table.relid, values)
        records.extend(_row_changes(plan, change))
    return records


def _stamp(items: list[tuple[str, dict[str, Any]]], commit_lsn: int, last_t: int) -> list[dict[str, Any]]:
    slots: list[list[dict[str, Any]]] = []
    previous = None
    for kind, record in items:
        if kind == "schema" or previous != "row":
            slots.append([])
        slots[-1].append(record)
        previous = kind
    first = commit_lsn - max(len(slots) - 1, 0)
    if commit_lsn <= last_t or first <= last_t:
        raise CaptureError(
            f"the transaction committed at LSN {commit_lsn} needs {len(slots)} timestamps above the previous "
            f"commit's {last_t}, and there is no room; this is not expected to happen: report it"
        )
    out = []
    for i, slot in enumerate(slots):
        for record in slot:  # each record is this transaction's own dict: stamped in place, not copied
            record["t"] = first + i
        out.extend(slot)
    out.append({"op": "close", "t": commit_lsn})
    return out
