"""Per-table time-to-live: retention of one table to ``frontier + 1 - ttl``.

A table's ``ttl`` (a catalog property, in logical-timestamp units) says how much history
below the frontier it keeps. ``apply_ttl`` runs retention's own per-table task for each
table whose TTL purge point has moved past its current one: every version older than the
purge point goes except the newest of each key as of it (dropped too if a delete), snapshots
below it go, and one transaction commits the files and the table's purge point
(:class:`SetTableEarliest`). Every answer for that table at or after the purge point stays
identical; below it, queries of that table fail with :class:`PurgedTimestampError`; other
tables are untouched. TTL-purged history is not copied to a cold tier: a TTL says the
history is to be forgotten.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from history_pipeline.catalog.handle import DatabaseHandle
from history_pipeline.catalog.model import AddFile, CatalogState, RemoveFile, SetTableEarliest, SetTableTtl
from history_pipeline.errors import HistoryError, MaintenanceInputError
from history_pipeline.execution import map_tasks, store_for_tasks
from history_pipeline.io.store import now
from history_pipeline.maintenance.retention import RetentionTask, retain_table_task
from history_pipeline.schema import replay_schema_history


@dataclass
class TtlSummary:
    """Which tables TTL retention purged, to which point."""

    purged: dict[str, int] = field(default_factory=dict)  # table uuid -> its new purge point
    files_removed: int = 0
    files_added: int = 0
    versions_removed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def set_ttl(store: DatabaseHandle, table_uuid: str, ttl: int | None) -> None:
    """Set (or with None clear) a table's TTL in logical-timestamp units."""
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1):
        raise MaintenanceInputError(f"a time-to-live is a positive number of logical-timestamp units, not {ttl!r}")
    store.catalog.commit(f"set ttl of {table_uuid}", lambda current: [SetTableTtl(table_uuid, ttl)])


def ttl_purge_points(state: CatalogState) -> dict[str, int]:
    """Each table whose TTL purge point is past its current one -> that purge point."""
    due = {}
    for table_uuid, ttl in state.table_ttl.items():
        point = state.frontier + 1 - ttl
        if point > state.earliest_of(table_uuid):
            due[table_uuid] = point
    return due


def apply_ttl(store: DatabaseHandle, spark: Any | None = None) -> TtlSummary:
    """Retention of every table with a TTL to its purge point (see the module docstring)."""
    state: CatalogState = store.catalog.latest()
    summary = TtlSummary()
    due = ttl_purge_points(state)
    if not due:
        return summary
    supers = replay_schema_history(state.schema_history).supercolumns
    store_config = store_for_tasks(spark, store.objects)
    tasks = [
        RetentionTask(store_config, store.database, table_uuid, tuple(state.files_of(table_uuid)),
                      tuple(supers.get(table_uuid, ())), point, state.txn_id + 1)
        for table_uuid, point in sorted(due.items())
    ]
    outcomes = map_tasks(spark, retain_table_task, tasks)
    removed = [f for o in outcomes for f in o.removed]
    added = [f for o in outcomes for f in o.added]
    at = now()

    def build(current: CatalogState) -> list[Any]:
        for table_uuid, point in due.items():
            if current.earliest_of(table_uuid) >= point:
                raise HistoryError(f"table {table_uuid} was purged meanwhile; run the TTL retention again")
        # RemoveFile fails cleanly if a file went meanwhile (merge): nothing is committed then
        return [*(RemoveFile(f.path, at) for f in removed), *(AddFile(e) for e in added),
                *(SetTableEarliest(t, p) for t, p in sorted(due.items()))]

    store.catalog.commit("ttl retention", build)
    summary.purged = dict(sorted(due.items()))
    summary.files_removed = len(removed)
    summary.files_added = len(added)
    summary.versions_removed = sum(o.versions_removed for o in outcomes)
    return summary

