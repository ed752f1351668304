"""A sampled check of the Reconstruction Invariant against the WAL segments still retained.

For a few random keys whose whole life is in the retained (applied) segments,
replay their row mutations straight from the WAL and compare the values at
each event's post-image (``as_of = t + 1``) with ``fetch_row``. Columns whose
values were rewritten by a later schema change (type change, added column
with a default) are compared only while the WAL value still stands.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from history_pipeline.events import AddColumn, ChangeColumnType, Delete, Insert, Update
from history_pipeline.query.engine import QueryContext
from history_pipeline.schema import TableDescriptor
from history_pipeline.types import decode_value
from history_pipeline.wal.segments import SegmentState, list_segments, read_segment


@dataclass(frozen=True)
class InvariantSample:
    checked: int
    mismatches: tuple[str, ...]
    reason: str = ""  # why nothing was checked, when ``checked`` is 0


class RetainedHistory(Protocol):
    """What the check reads: the WAL folder (its applied segments) and the store's newest state."""

    @property
    def wal_dir(self) -> Path: ...

    def query_context(self) -> QueryContext: ...


def sample_reconstruction(store: RetainedHistory, samples: int = 5, seed: int | None = None) -> InvariantSample:
    """Re-derive ``samples`` random keys from retained segments and compare with the store."""
    rng = random.Random(seed)
    histories: dict[tuple[str, int], list[Insert | Update | Delete]] = {}
    rewrites: dict[str, list[tuple[int, str]]] = {}  # table -> (t, column uuid) whose old values were rewritten
    for ref in list_segments(store.wal_dir, SegmentState.APPLIED):
        for _, event in read_segment(ref).events:
            if isinstance(event, (Insert, Update, Delete)):
                histories.setdefault((event.table_uuid, event.key), []).append(event)
            elif isinstance(event, ChangeColumnType):
                rewrites.setdefault(event.table_uuid, []).append((event.t, event.column_uuid))
            elif isinstance(event, AddColumn):
                rewrites.setdefault(event.table_uuid, []).append((event.t, event.column.column_uuid))
    whole = [k for k, events in histories.items() if isinstance(events[0], Insert)]
    context = store.query_context()
    if context.state.earliest > 0:
        whole = [k for k in whole if histories[k][0].t >= context.state.earliest]
    mismatches: list[str] = []
    checked = 0
    for table_uuid, key in rng.sample(whole, min(samples, len(whole))):
        values: dict[str, tuple[int, Any]] | None = None  # column uuid -> (t written, WAL value); None: gone
        events = histories[(table_uuid, key)]
        for index, event in enumerate(events):
            if isinstance(event, Delete):
                values = None
            else:
                if isinstance(event, Insert):
                    values = {}
                assert values is not None
                values.update({uuid: (event.t, raw) for uuid, raw in event.values.items()})
            if index + 1 < len(events) and events[index + 1].t == event.t:
                continue  # mutations of one key at one t consolidate: compare after the last of them
            as_of = event.t + 1
            descriptor = _descriptor(context, table_uuid, as_of) if as_of <= context.state.frontier + 1 else None
            if descriptor is None:
                break
            got = context.fetch_row(table_uuid, key, as_of)
            checked += 1
            where = f"{table_uuid} key {key} as of {as_of}"
            if values is None or got is None:
                if (values is None) != (got is None):
                    # never a value: the sample is shown in Dagster, which keeps it beyond an erasure's reach
                    mismatches.append(f"{where}: expected {'no row' if values is None else 'a row'}, "
                                      f"got {'a row' if got is not None else 'none'}")
                continue
            for column in descriptor.columns:
                if column.column_uuid not in values:
                    continue
                written, raw = values[column.column_uuid]
                if any(uuid == column.column_uuid and written < t < as_of for t, uuid in rewrites.get(table_uuid, [])):
                    continue  # the value was cast by a later type change: not the WAL's any more
                expected = decode_value(column.data_type, raw)
                actual = got[column.column_name]
                if not _equal(expected, actual):
                    mismatches.append(f"{where}: {column.column_name} differs from the value the WAL says")
    reason = ""
    if not checked:
        reason = ("no key's whole life (insert onwards) is in the retained WAL segments at or after the "
                  f"earliest answerable as_of {context.state.earliest}" if not whole else
                  "no sampled state is answerable yet")
    return InvariantSample(checked, tuple(mismatches), reason)


def _descriptor(context: QueryContext, table_uuid: str, as_of: int) -> TableDescriptor | None:
    for descriptor in context.get_catalog(as_of):
        if descriptor.table_uuid == table_uuid:
            return descriptor
    return None


def _equal(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b
