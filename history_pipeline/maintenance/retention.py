"""Retention to a purge timestamp, with the purged history kept in a cold tier for load-back.

The rule: delete every version older than ``t_purge`` except the newest
version of each key as of ``t_purge``, and drop that one too if it is a delete.
Every answer for ``T >= t_purge`` stays identical; queries below fail with an
error naming the earliest answerable T. Schema history is kept.

Files are immutable, so retention is copy-on-write in one transaction:

* version files entirely below ``t_purge`` are removed;
* version files straddling it are rewritten with their rows at or after it;
* snapshots below ``t_purge`` are removed (a snapshot older than the purge
  point could resurrect a key deleted before it);
* the kept versions (the newest live version of each key as of ``t_purge``,
  with every supercolumn filled as of then) are written as one version file.

Before the commit, every file the transaction removes is copied whole to the
cold tier with a manifest (written last), so ``load_cold_tier`` can undo the
purge exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from history_pipeline.catalog.files import live_rows, write_parquet
from history_pipeline.catalog.handle import DatabaseHandle
from history_pipeline.catalog.model import (
    AddFile,
    CatalogState,
    FileEntry,
    FileKind,
    RemoveFile,
    SetEarliest,
)
from history_pipeline.errors import HistoryError
from history_pipeline.execution import map_tasks, open_executor_store, store_for_tasks
from history_pipeline.io.store import ObjectStore, now
from history_pipeline.schema import replay_schema_history
from history_pipeline.supertable import KEY, LT, FileMetadata, new_file_path, supertable_schema
from history_pipeline.supertable.read import dataset_of


@dataclass
class RetentionSummary:
    purge_before: int
    files_removed: int = 0
    files_added: int = 0
    versions_removed: int = 0
    bytes_removed: int = 0
    cold_tier: str | None = None
    tables: list[str] = field(default_factory=list)
    #: tables purged further by their own time-to-live in the same run (uuid -> purge point)
    ttl_purged: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class RetentionTask:
    """One table's share of a retention (picklable, for Spark executors)."""

    store_config: dict[str, Any]
    database: str
    table_uuid: str
    files: tuple[FileEntry, ...]
    supercolumns: tuple[Any, ...]
    purge_before: int
    txn_hint: int


@dataclass(frozen=True)
class RetentionOutcome:
    table_uuid: str
    removed: tuple[FileEntry, ...]
    added: tuple[FileEntry, ...]
    versions_removed: int


def retain_table_task(task: RetentionTask) -> RetentionOutcome:
    """Rewrite one table's files for the purge point; nothing is committed here."""
    objects = open_executor_store(task.store_config)
    purge_before, txn_hint = task.purge_before, task.txn_hint
    state = CatalogState(files=MappingProxyType({f.path: f for f in task.files}))
    schema = supertable_schema(task.supercolumns)
    versions = state.files_of(task.table_uuid, FileKind.VERSIONS)
    snapshots = [
        f for f in state.files_of(task.table_uuid, FileKind.SNAPSHOT)
        if f.snapshot_as_of is not None and f.snapshot_as_of < purge_before
    ]
    below = [f for f in versions if f.min_t is not None and f.min_t < purge_before]
    added: list[FileEntry] = []
    kept = live_rows(objects, state, task.table_uuid, task.supercolumns, purge_before)
    # a kept snapshot's pieces holding versions already store the newest versions below the purge
    # point of their keys (current at the snapshot, so as of the purge point too): not twice
    held = [f for f in state.files_of(task.table_uuid, FileKind.SNAPSHOT)
            if f.holds_versions and f.snapshot_as_of is not None and f.snapshot_as_of >= purge_before
            and f.min_t is not None and f.min_t < purge_before]
    if held and kept.num_rows:
        held_keys = dataset_of(objects, held, schema).to_table(columns=[KEY], filter=ds.field(LT) < purge_before)
        kept = kept.filter(pc.invert(pc.is_in(kept.column(KEY), value_set=held_keys.column(KEY))))
    if kept.num_rows:
        kept = kept.select(schema.names).cast(schema)
        meta = FileMetadata(task.database, task.table_uuid, FileKind.VERSIONS, txn_hint, None, purge_before,
                            replaces=tuple(f.path for f in below), earliest=purge_before)
        path = new_file_path(task.database, task.table_uuid, FileKind.VERSIONS, txn_hint)
        added.append(write_parquet(objects, path, kept, meta))
    for f in below:
        if f.max_t is not None and f.max_t >= purge_before:
            rest = dataset_of(objects, [f], schema).to_table(filter=ds.field(LT) >= purge_before)
            meta = FileMetadata(task.database, task.table_uuid, FileKind.VERSIONS, txn_hint, purge_before,
                                f.max_t + 1, segments=f.segments, replaces=(f.path,), earliest=purge_before)
            path = new_file_path(task.database, task.table_uuid, FileKind.VERSIONS, txn_hint)
            added.append(write_parquet(objects, path, rest, meta))
    # every row of the rewritten files is either kept (newest as of the purge point) or at/after it
    purged = sum(f.row_count for f in below) - sum(e.row_count for e in added)
    return RetentionOutcome(task.table_uuid, tuple(below + snapshots), tuple(added), purged)


def retain(
    store: DatabaseHandle,
    purge_before: int,
    cold_tier: ObjectStore | None = None,
    spark: Any | None = None,
    on_step: Any = None,
) -> RetentionSummary:
    """Purge history below ``purge_before`` (see the module docstring); table work runs on Spark if given."""
    step = on_step or (lambda s: None)
    state: CatalogState = store.catalog.latest()
    if purge_before < 0:
        raise HistoryError(f"cannot purge before {purge_before}: logical timestamps start at 0")
    if purge_before > state.frontier + 1:
        raise HistoryError(
            f"cannot purge before {purge_before}: the frontier is {state.frontier}, so at most {state.frontier + 1}"
        )
    summary = RetentionSummary(purge_before)
    if purge_before <= state.earliest:
        return summary
    supers = replay_schema_history(state.schema_history).supercolumns
    tasks = []
    store_config = store_for_tasks(spark, store.objects)
    for table_uuid in sorted({f.table_uuid for f in state.files.values() if f.table_uuid}):
        files = tuple(state.files_of(table_uuid))
        needs = any(
            (f.kind is FileKind.VERSIONS and f.min_t is not None and f.min_t < purge_before)
            or (f.kind is FileKind.SNAPSHOT and f.snapshot_as_of is not None and f.snapshot_as_of < purge_before)
            for f in files
        )
        if needs:
            tasks.append(RetentionTask(store_config, store.database, table_uuid, files,
                                       tuple(supers.get(table_uuid, ())), purge_before, state.txn_id + 1))
    outcomes = map_tasks(spark, retain_table_task, tasks)
    removed = [f for o in outcomes for f in o.removed]
    added = [f for o in outcomes for f in o.added]
    summary.tables = [o.table_uuid for o in outcomes]
    summary.versions_removed = sum(o.versions_removed for o in outcomes)
    step("files_written")
    if cold_tier is not None:  # even when no file goes, load-back must be able to undo the purge point
        summary.cold_tier = _export_purged(store, cold_tier, purge_before, removed, added)
    step("cold_tier_written")
    removed_at = now()

    def build(current: CatalogState) -> list[Any]:
        return [*(RemoveFile(f.path, removed_at) for f in removed), *(AddFile(e) for e in added),
                SetEarliest(purge_before)]

    store.catalog.commit(f"retain before {purge_before}", build)
    summary.files_removed = len(removed)
    summary.files_added = len(added)
    summary.bytes_removed = sum(f.size_bytes for f in removed)
    return summary


def _export_purged(
    store: DatabaseHandle, cold: ObjectStore, purge_before: int, removed: list[FileEntry], added: list[FileEntry]
) -> str:
    prefix = f"{store.database}/purged/before-{purge_before:020d}"
    for f in removed:
        cold.put(f"{prefix}/{f.path}", store.objects.get(f.path))
    manifest = {
        "database": store.database,
        "purge_before": purge_before,
        "previous_earliest": store.catalog.latest().earliest,
        "removed": [f.to_json() for f in removed],
        "added": [f.path for f in added],
    }
    cold.put(f"{prefix}/manifest.json", json.dumps(manifest).encode())  # last: the export is now visible
    return f"{cold.uri}/{prefix}"


def load_cold_tier(store: DatabaseHandle, cold: ObjectStore, purge_before: int | None = None) -> int:
    """Bring purged history back from the cold tier, newest purge first; returns the new earliest."""
    manifests = sorted(
        (o.path for o in cold.list(f"{store.database}/purged/") if o.path.endswith("/manifest.json")),
        reverse=True,
    )
    if purge_before is not None:
        manifests = [m for m in manifests if f"before-{purge_before:020d}/" in m]
    if not manifests:
        raise HistoryError(f"no purged history of {store.database} in the cold tier {cold.uri}")
    earliest = store.catalog.latest().earliest
    for manifest_path in manifests:
        earliest = _restore(store, cold, manifest_path)
    return earliest


@dataclass(frozen=True)
class UnpurgeTask:
    """One table's share of a load-back: drop the rows retention synthesized (picklable)."""

    store_config: dict[str, Any]
    database: str
    table_uuid: str
    restored: tuple[FileEntry, ...]  # the purged version files coming back
    candidates: tuple[FileEntry, ...]  # live version files that may hold synthesized rows
    supercolumns: tuple[Any, ...]
    txn_hint: int
    #: live snapshot pieces holding versions: closing an interval after the purge may have moved
    #: kept or rewritten rows into them, and they stay (they are snapshot rows too)
    held: tuple[FileEntry, ...] = ()


def unpurge_table_task(
    task: UnpurgeTask,
) -> tuple[tuple[str, ...], tuple[FileEntry, ...], tuple[tuple[str, FileEntry | None], ...]]:
    """Rewrite the live files without any version whose (key, t) the restored files hold.

    Retention's kept rows and rewritten straddling rows are copies of versions of the
    purged files, wherever a merge has moved them since; identity is (key, t), never
    the file name. A row that a live snapshot piece holding versions has (moved there when an
    interval was closed after the purge) stays there: the restored version file gives it up
    instead (rewritten without it), so each version is stored once. Returns (paths to remove,
    files added in their place, (restored path, its rewrite or None) for restored files rewritten).
    """
    from history_pipeline.io.store import open_store

    objects = open_store(task.store_config)
    schema = supertable_schema(task.supercolumns)
    restored = dataset_of(objects, task.restored, schema).to_table(columns=[KEY, LT])
    if restored.num_rows == 0:
        return (), (), ()
    identities = _identities(restored)
    swapped: list[tuple[str, FileEntry | None]] = []
    held = dataset_of(objects, task.held, schema).to_table(columns=[KEY, LT]) if task.held else None
    if held is not None and held.num_rows:
        held_identities = _identities(held)
        for e in task.restored:
            if e.kind is not FileKind.VERSIONS:
                continue
            rows = dataset_of(objects, [e], schema).to_table()
            duplicate = pc.is_in(_identities(rows), value_set=held_identities)
            if not pc.any(duplicate).as_py():
                continue
            rest = rows.filter(pc.invert(duplicate))
            rewrite = None
            if rest.num_rows:
                meta = FileMetadata(task.database, task.table_uuid, FileKind.VERSIONS, task.txn_hint, e.min_t,
                                    None if e.max_t is None else e.max_t + 1, segments=e.segments, replaces=(e.path,))
                path = new_file_path(task.database, task.table_uuid, FileKind.VERSIONS, task.txn_hint)
                rewrite = write_parquet(objects, path, rest, meta)
            swapped.append((e.path, rewrite))
    low, high = pc.min_max(restored.column(LT)).values()
    removed: list[str] = []
    added: list[FileEntry] = []
    for f in task.candidates:
        if f.min_t is None or f.max_t is None or f.max_t < low.as_py() or f.min_t > high.as_py():
            continue
        rows = dataset_of(objects, [f], schema).to_table()
        duplicate = pc.is_in(_identities(rows), value_set=identities)
        if not pc.any(duplicate).as_py():
            continue
        removed.append(f.path)
        rest = rows.filter(pc.invert(duplicate))
        if rest.num_rows:
            meta = FileMetadata(task.database, task.table_uuid, FileKind.VERSIONS, task.txn_hint, f.min_t,
                                f.max_t + 1, segments=f.segments)
            path = new_file_path(task.database, task.table_uuid, FileKind.VERSIONS, task.txn_hint)
            added.append(write_parquet(objects, path, rest, meta))
    return tuple(removed), tuple(added), tuple(swapped)


def _identities(rows: pa.Table) -> Any:
    """One comparable value per (synthetic_key, logical_timestamp)."""
    return pc.binary_join_element_wise(
        pc.cast(rows.column(KEY), pa.string()), pc.cast(rows.column(LT), pa.string()), ":"
    )


def _restore(store: DatabaseHandle, cold: ObjectStore, manifest_path: str) -> int:
    """Undo one retention: its removed files come back, the versions it synthesized go."""
    manifest = json.loads(cold.get(manifest_path))
    prefix = manifest_path.rsplit("/", 1)[0]
    purge_before, previous = manifest["purge_before"], manifest["previous_earliest"]
    earliest = store.catalog.latest().earliest
    if earliest < purge_before:
        return earliest  # this purge was undone already (or never committed): nothing to restore
    if earliest > purge_before:
        raise HistoryError(
            f"history of {store.database} is purged up to {earliest}, after this export's purge point "
            f"{purge_before}: load the newer purged history first (load_cold_tier without purge_before)"
        )
    state: CatalogState = store.catalog.latest()
    # a table its TTL purged past this purge point keeps nothing below its own point: its files
    # here are history the TTL forgot, and they would bring back keys deleted between the points
    forgotten = {table for table, point in state.table_earliest.items() if point > purge_before}
    restored = [e for e in map(FileEntry.from_json, manifest["removed"]) if e.table_uuid not in forgotten]
    for entry in restored:
        store.objects.put(entry.path, cold.get(f"{prefix}/{entry.path}"))
    supers = replay_schema_history(state.schema_history).supercolumns
    back = {e.path for e in restored}
    tasks = []
    # restored snapshot pieces holding versions hold versions the retention's kept file repeats
    for table_uuid in sorted({e.table_uuid for e in restored if e.table_uuid and e.is_versions}):
        tasks.append(UnpurgeTask(
            store.objects.config(), store.database, table_uuid,
            tuple(e for e in restored if e.table_uuid == table_uuid and e.is_versions),
            tuple(f for f in state.files_of(table_uuid, FileKind.VERSIONS) if f.path not in back),
            tuple(supers.get(table_uuid, ())), state.txn_id + 1,
            tuple(f for f in state.files_of(table_uuid, FileKind.SNAPSHOT) if f.holds_versions and f.path not in back),
        ))
    outcomes = map_tasks(None, unpurge_table_task, tasks)
    replaced = [p for removed, _, _ in outcomes for p in removed]
    rewritten = [e for _, added, _ in outcomes for e in added]
    swaps = {path: rewrite for _, _, swapped in outcomes for path, rewrite in swapped}
    restored = [e for e in restored if e.path not in swaps] + [e for e in swaps.values() if e is not None]
    at = now()

    def build(current: CatalogState) -> list[Any]:
        # a file rewritten here must still be live (RemoveFile fails cleanly otherwise)
        actions: list[Any] = [RemoveFile(p, at) for p in replaced]
        actions += [AddFile(e) for e in rewritten]
        actions += [AddFile(e) for e in restored if e.path not in current.files]
        if current.earliest != purge_before:
            raise HistoryError(f"the purge point of {store.database} changed during the load-back; run it again")
        actions.append(SetEarliest(previous))
        return actions

    store.catalog.commit("load cold tier", build)
    return store.catalog.latest().earliest
