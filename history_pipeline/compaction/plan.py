"""Compaction, pure part: a verified segment becomes a plan, and a plan plus prior row images
becomes supertable versions.

``plan_segment`` walks the segment in order on the driver: it applies every
schema change to the schema history (the schema handlers of ``schema.py``) and checks each row
mutation against the schema in force at its timestamp (table, columns, value
types, nullability), mapping column uuids to supercolumns.

``fold_table`` then applies one table's mutations to the prior images of the
keys they touch: insert copies values, update copies the newest previous full
image forward and applies the change, delete writes ``is_deleted``; several
mutations of one key at one timestamp consolidate into one version. A
column added with a default, or a type change, gives every live row a value
for the new supercolumn: the fold writes those images as a *snapshot* of the
table as of ``t + 1`` (an in-place update, done copy-on-write).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from history_pipeline.casts import CastFailure, cast_value
from history_pipeline.errors import CastError, HistoryConflictError, ValueTypeError
from history_pipeline.events import (
    AddColumn,
    ChangeColumnNullable,
    ChangeColumnType,
    Close,
    Delete,
    Insert,
    SchemaChange,
    Update,
    is_schema_change,
)
from history_pipeline.schema import SchemaHistoryEntry, SchemaState, Supercolumn, apply_schema_change
from history_pipeline.supertable import Version
from history_pipeline.types import decode_value
from history_pipeline.wal.segments import SegmentContents


@dataclass(frozen=True)
class Mutation:
    """A validated row mutation: values by supercolumn, in Python form."""

    t: int
    line: int
    kind: str  # "insert" | "update" | "delete"
    key: int
    values: Mapping[str, Any]
    columns: tuple[str, ...]  # supercolumns in force at t


@dataclass(frozen=True)
class Backfill:
    """Every live row gets a value for a new supercolumn: a default, or its old value cast."""

    t: int
    line: int
    target: Supercolumn
    default: Any = None
    source: Supercolumn | None = None
    #: not a fill but a check (no snapshot): every row live at ``t`` must hold a value in ``target``,
    #: else the segment is refused with this reason (a NOT NULL column added without a default, or
    #: a column made NOT NULL, over live NULLs: PostgreSQL refuses both)
    refusal: str | None = None

    def refused(self, key: int) -> str:
        """Why the check refuses the change, naming the smallest live key holding NULL."""
        return f"{self.refusal}: live key {key} holds NULL in it"


@dataclass
class TablePlan:
    table_uuid: str
    segment: str
    mutations: list[Mutation] = field(default_factory=list)
    backfills: list[Backfill] = field(default_factory=list)

    @property
    def touched_keys(self) -> set[int]:
        return {m.key for m in self.mutations}

    @property
    def needs_all_keys(self) -> bool:
        return bool(self.backfills)


@dataclass(frozen=True)
class SegmentPlan:
    segment_id: int
    segment: str
    lower: int
    upper: int
    schema_entries: tuple[SchemaHistoryEntry, ...]
    schema_before: SchemaState
    schema_after: SchemaState
    tables: Mapping[str, TablePlan]


def _conflict(message: str, segment: str, line: int) -> HistoryConflictError:
    return HistoryConflictError(message, segment=segment, line=line)


def plan_segment(contents: SegmentContents, schema: SchemaState) -> SegmentPlan:
    """Validate a segment against the schema history and group its mutations by table."""
    segment = contents.ref.name
    entries: list[SchemaHistoryEntry] = []
    tables: dict[str, TablePlan] = {}
    state = schema
    columns_cache: dict[str, tuple[str, ...]] = {}
    by_uuid_cache: dict[str, dict[str, Any]] = {}
    for line, event in contents.events:
        if isinstance(event, Close):
            continue
        if is_schema_change(event):
            state = _apply_schema(state, event, segment, line, entries, tables)
            columns_cache.clear()
            by_uuid_cache.clear()
            continue
        assert isinstance(event, (Insert, Update, Delete))
        table = state.tables.get(event.table_uuid)
        if table is None:
            raise _conflict(f"{_op(event)} into unknown table {event.table_uuid}", segment, line)
        plan = tables.setdefault(table.table_uuid, TablePlan(table.table_uuid, segment))
        columns = columns_cache.get(table.table_uuid)
        if columns is None:
            columns = tuple(c.supercolumn for c in table.columns)
            columns_cache[table.table_uuid] = columns
        if isinstance(event, Delete):
            plan.mutations.append(Mutation(event.t, line, "delete", event.key, {}, columns))
            continue
        by_uuid = by_uuid_cache.get(table.table_uuid)
        if by_uuid is None:
            by_uuid = {c.column_uuid: c for c in table.columns}
            by_uuid_cache[table.table_uuid] = by_uuid
        values: dict[str, Any] = {}
        for column_uuid, raw in event.values.items():
            column = by_uuid.get(column_uuid)
            if column is None:
                raise _conflict(
                    f"table {table.table_name} has no column {column_uuid} at t={event.t}", segment, line
                )
            try:
                value = decode_value(column.data_type, raw)
            except ValueTypeError as exc:
                raise _conflict(
                    f"column {column.column_name} ({column_uuid}) of table {table.table_name}: {exc}",
                    segment,
                    line,
                ) from None
            if value is None and not column.is_nullable:
                raise _conflict(
                    f"column {column.column_name} of table {table.table_name} is NOT NULL", segment, line
                )
            values[column.supercolumn] = value
        if isinstance(event, Insert):
            for column in table.columns:
                if column.column_uuid not in event.values and column.default is not None:
                    values[column.supercolumn] = column.default_value()
                if not column.is_nullable and values.get(column.supercolumn) is None:
                    raise _conflict(
                        f"insert into {table.table_name} leaves NOT NULL column {column.column_name} empty",
                        segment,
                        line,
                    )
        plan.mutations.append(
            Mutation(event.t, line, _op(event), event.key, values, columns)
        )
    return SegmentPlan(
        segment_id=contents.ref.segment_id,
        segment=segment,
        lower=contents.lower,
        upper=contents.upper,
        schema_entries=tuple(entries),
        schema_before=schema,
        schema_after=state,
        tables=MappingProxyType(tables),
    )


def _op(event: Insert | Update | Delete) -> str:
    return {Insert: "insert", Update: "update", Delete: "delete"}[type(event)]


def _apply_schema(
    state: SchemaState,
    event: SchemaChange,
    segment: str,
    line: int,
    entries: list[SchemaHistoryEntry],
    tables: dict[str, TablePlan],
) -> SchemaState:
    try:
        new_state, written = apply_schema_change(state, event)
    except HistoryConflictError as exc:
        raise _conflict(str(exc), segment, line) from None
    entries.extend(written)
    backfill: Backfill | None = None
    if isinstance(event, AddColumn) and event.default is not None:
        column = event.column
        target = new_state.supercolumns[event.table_uuid][-1]
        backfill = Backfill(event.t, line, target, default=decode_value(column.data_type, event.default))
    elif isinstance(event, AddColumn) and not event.column.is_nullable:
        name = new_state.tables[event.table_uuid].table_name
        backfill = Backfill(event.t, line, new_state.supercolumns[event.table_uuid][-1], refusal=(
            f"add_column of NOT NULL column {event.column.column_name} without a default to table {name}"))
    elif isinstance(event, ChangeColumnType):
        old = state.tables[event.table_uuid].column(event.column_uuid)
        assert old is not None
        source = next(s for s in state.supercolumns[event.table_uuid] if s.name == old.supercolumn)
        target = new_state.supercolumns[event.table_uuid][-1]
        # values that follow the change: the rows read NULL until then (a backfill without source or default)
        backfill = Backfill(event.t, line, target, source=None if event.values_follow else source)
    elif isinstance(event, ChangeColumnNullable) and not event.is_nullable:
        old = state.tables[event.table_uuid].column(event.column_uuid)
        assert old is not None
        if old.is_nullable:  # already NOT NULL: its live rows hold values (checked when they were written)
            target = next(s for s in state.supercolumns[event.table_uuid] if s.name == old.supercolumn)
            name = state.tables[event.table_uuid].table_name
            backfill = Backfill(event.t, line, target, refusal=(
                f"change of column {old.column_name} of table {name} to NOT NULL"))
    if backfill is not None:
        tables.setdefault(event.table_uuid, TablePlan(event.table_uuid, segment)).backfills.append(backfill)
    return new_state


# --- the fold ---------------------------------------------------------------------


@dataclass(frozen=True)
class Image:
    """The newest version of a live key: its timestamp and full values."""

    t: int
    values: Mapping[str, Any]


@dataclass(frozen=True)
class FoldResult:
    versions: tuple[Version, ...]
    snapshots: tuple[tuple[int, tuple[Version, ...]], ...]  # (as_of, the live rows then)
    images: Mapping[int, Image]  # live keys afterwards


def fold_table(plan: TablePlan, prior: Mapping[int, Image]) -> FoldResult:
    """Apply one table's mutations and backfills in timestamp order to the prior images."""
    images: dict[int, Image] = dict(prior)
    versions: list[Version] = []
    last_index: dict[int, int] = {}  # key -> index in versions of its newest version
    live_before: dict[tuple[int, int], bool] = {}  # (key, t) -> live before the first mutation at t
    snapshots: list[tuple[int, tuple[Version, ...]]] = []
    timeline: list[tuple[int, int, Mutation | Backfill]] = [(m.t, m.line, m) for m in plan.mutations]
    timeline += [(b.t, b.line, b) for b in plan.backfills]
    timeline.sort(key=lambda item: (item[0], item[1]))
    for t, line, item in timeline:
        if isinstance(item, Backfill) and item.refusal is not None:
            _check_not_null(images, item, plan.segment)
            continue
        if isinstance(item, Backfill):
            images = _backfill(images, item, plan.segment)
            snapshots.append(
                (t + 1, tuple(Version(k, img.t, False, img.values) for k, img in sorted(images.items())))
            )
            continue
        key = item.key
        live_before.setdefault((key, t), key in images)
        current = images.get(key)
        if item.kind == "insert":
            if current is not None:
                raise _conflict(f"insert of key {key}, which is already live", plan.segment, line)
            values = {c: item.values.get(c) for c in item.columns}
            images[key] = Image(t, MappingProxyType(values))
            version = Version(key, t, False, images[key].values)
        elif item.kind == "update":
            if current is None:
                raise _conflict(f"update of key {key}, which does not exist", plan.segment, line)
            values = {c: (item.values[c] if c in item.values else current.values.get(c)) for c in item.columns}
            images[key] = Image(t, MappingProxyType(values))
            version = Version(key, t, False, images[key].values)
        else:
            if current is None:
                raise _conflict(f"delete of key {key}, which does not exist", plan.segment, line)
            del images[key]
            version = Version(key, t, True, MappingProxyType({}))
        index = last_index.get(key)
        if index is not None and versions[index].t == t:
            if version.is_deleted and not live_before[(key, t)]:
                versions[index] = None  # type: ignore[call-overload]  # born and gone within t
                del last_index[key]
                continue
            versions[index] = version
        else:
            last_index[key] = len(versions)
            versions.append(version)
    return FoldResult(
        versions=tuple(v for v in versions if v is not None),
        snapshots=tuple(snapshots),
        images=MappingProxyType(images),
    )


def _backfill(images: dict[int, Image], backfill: Backfill, segment: str) -> dict[int, Image]:
    target = backfill.target
    updated: dict[int, Image] = {}
    failed: list[tuple[int, str]] = []
    for key, image in images.items():
        if backfill.source is None:
            value = backfill.default
        else:
            old = image.values.get(backfill.source.name)
            try:
                value = cast_value(old, backfill.source.data_type, target.data_type)
            except CastFailure as exc:
                failed.append((key, str(exc)))
                continue
        updated[key] = Image(image.t, MappingProxyType({**image.values, target.name: value}))
    if failed:  # name the smallest failing key: the same whatever order the images were built in
        key, why = min(failed)
        raise CastError(
            f"change of column {target.column_uuid} to {target.data_type}: key {key} holds a value "
            f"that cannot be cast: {why}",
            segment=segment,
            line=backfill.line,
        )
    return updated


def _check_not_null(images: Mapping[int, Image], check: Backfill, segment: str) -> None:
    """Refuse the schema change of ``check`` if a live row holds NULL in its column (smallest key)."""
    empty = [key for key, image in images.items() if image.values.get(check.target.name) is None]
    if empty:
        raise HistoryConflictError(check.refused(min(empty)), segment=segment, line=check.line)


def images_from_rows(rows: Iterable[Mapping[str, Any]], supercolumns: Iterable[str]) -> dict[int, Image]:
    """Prior images from reconstructed rows (synthetic_key, logical_timestamp, supercolumns...)."""
    names = tuple(supercolumns)
    return {
        row["synthetic_key"]: Image(row["logical_timestamp"], MappingProxyType({n: row.get(n) for n in names}))
        for row in rows
    }
