"""Keeping a catalog honest: garbage collection, verification, and rebuilding from Parquet alone.

* ``collect_garbage`` prunes the transaction log to what the grace period
  must keep, deletes tombstoned files that no retained transaction references,
  and deletes orphans (written, never committed) older than the grace period.
  Nothing live, and nothing a retained transaction can still read, is deleted.
* ``verify`` checks every live file against its recorded statistics and the
  frontier and applied segments against the files; it returns problems as data.
* ``rebuild`` writes a fresh catalog from the files' own footer metadata.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from history_pipeline.catalog.log import TransactionLog
from history_pipeline.catalog.model import (
    AddFile,
    AddSchemaHistory,
    AdvanceFrontier,
    ApplySegments,
    CatalogState,
    FileEntry,
    FileKind,
    ForgetTombstones,
    SetEarliest,
)
from history_pipeline.errors import CatalogError, HistoryError
from history_pipeline.io.store import ObjectStore, now
from history_pipeline.schema import SchemaHistoryEntry
from history_pipeline.supertable import KEY, LT, FileMetadata, read_file_metadata
from history_pipeline.wal.segments import SegmentState, list_segments

DATA_PREFIXES = ("tables/", "_history_catalog/")


def data_paths(store: ObjectStore, database: str) -> list[tuple[str, float, int]]:
    """Every Parquet object a database owns: (path, modified, size)."""
    found = []
    for prefix in DATA_PREFIXES:
        for obj in store.list(f"{database}/{prefix}"):
            if obj.path.endswith(".parquet"):
                found.append((obj.path, obj.modified, obj.size))
    return found


@dataclass
class GcReport:
    transactions_pruned: int = 0
    tombstones_deleted: list[str] = field(default_factory=list)
    orphans_deleted: list[str] = field(default_factory=list)
    bytes_freed: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "transactions_pruned": self.transactions_pruned,
            "tombstones_deleted": len(self.tombstones_deleted),
            "orphans_deleted": len(self.orphans_deleted),
            "bytes_freed": self.bytes_freed,
        }


def referenced_paths(log: TransactionLog) -> set[str]:
    """Every file some retained transaction can read (live at the earliest retained one, or added later)."""
    earliest = log.earliest_retained()
    if earliest < 0:
        return set()
    state = log.state_at(earliest)
    paths = set(state.files)
    txn_id = earliest + 1
    while True:
        try:
            txn = log.read_transaction(txn_id)
        except HistoryError:
            break
        paths.update(a.entry.path for a in txn.actions if isinstance(a, AddFile))
        txn_id += 1
    return paths


def collect_garbage(
    log: TransactionLog, store: ObjectStore, database: str, grace_s: float, at: float | None = None
) -> GcReport:
    """Delete what the grace period no longer protects (see the module docstring)."""
    at = now() if at is None else at
    cutoff = at - grace_s
    report = GcReport()
    state = log.latest()
    if state.txn_id < 0:
        return report
    log.write_checkpoint(state)  # so a later run can prune up to here
    old_checkpoints = []
    for checkpoint in log.checkpoint_ids():
        if log.read_checkpoint(checkpoint).committed_at <= cutoff:
            old_checkpoints.append(checkpoint)
    if old_checkpoints:
        report.transactions_pruned = log.prune(old_checkpoints[-1])
    referenced = referenced_paths(log)
    expired = [
        path
        for path, tomb in state.tombstones.items()
        if tomb.removed_at <= cutoff and path not in referenced
    ]
    for path in expired:
        report.bytes_freed += state.tombstones[path].entry.size_bytes
        store.delete(path)
    if expired:
        def forget(current: CatalogState) -> list[ForgetTombstones] | None:
            gone = tuple(p for p in expired if p in current.tombstones)
            return [ForgetTombstones(gone)] if gone else None

        log.commit("cleanup", forget)
    report.tombstones_deleted = expired
    known = referenced | set(state.files) | set(state.tombstones)
    for path, modified, size in data_paths(store, database):
        if path not in known and modified <= cutoff:
            store.delete(path)
            report.orphans_deleted.append(path)
            report.bytes_freed += size
    return report


@dataclass(frozen=True)
class Problem:
    """One inconsistency found by :func:`verify`."""

    kind: str
    path: str | None
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.path + ': ' if self.path else ''}{self.message}"


def _column_range(footer: pq.FileMetaData, name: str) -> tuple[int | None, int | None]:
    index = footer.schema.to_arrow_schema().get_field_index(name)
    if index < 0:
        return None, None
    low = high = None
    for rg in range(footer.num_row_groups):
        stats = footer.row_group(rg).column(index).statistics
        if stats is None or not stats.has_min_max:
            return None, None
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    return low, high


def verify_file(store: ObjectStore, entry: FileEntry) -> list[Problem]:
    """Does one live file exist, read, and match its recorded statistics?"""
    if not store.exists(entry.path):
        return [Problem("missing_file", entry.path, "listed as live but not in storage")]
    try:
        meta, footer = read_file_metadata(store, entry.path)
    except Exception as exc:  # any unreadable file is a finding, not a crash
        return [Problem("unreadable_file", entry.path, str(exc))]
    problems = []
    if footer.num_rows != entry.row_count:
        problems.append(
            Problem("row_count_mismatch", entry.path, f"catalog says {entry.row_count}, file has {footer.num_rows}")
        )
    if meta is None:
        problems.append(Problem("missing_metadata", entry.path, "no history_pipeline footer metadata"))
    if entry.kind is not FileKind.SCHEMA_HISTORY and entry.row_count:
        for column, low, high in ((LT, entry.min_t, entry.max_t), (KEY, entry.min_key, entry.max_key)):
            actual = _column_range(footer, column)
            if actual != (low, high):
                problems.append(
                    Problem("statistics_mismatch", entry.path, f"{column} range {actual} != recorded {(low, high)}")
                )
    return problems


def verify(state: CatalogState, store: ObjectStore, wal_dir: Path | None = None) -> list[Problem]:
    """Every problem between the catalog, its files and the WAL (empty when consistent)."""
    problems: list[Problem] = []
    for entry in state.files.values():
        problems += verify_file(store, entry)
    data_max = max((f.max_t for f in state.files.values() if f.max_t is not None and f.kind is FileKind.VERSIONS),
                   default=None)
    if data_max is not None and data_max > state.frontier:
        problems.append(Problem("frontier_behind_data", None, f"frontier {state.frontier} < data up to {data_max}"))
    file_segments = {s for f in state.files.values() for s in f.segments}
    file_segments |= {s for t in state.tombstones.values() for s in t.entry.segments}
    for segment in sorted(file_segments - state.applied_segments):
        problems.append(Problem("segment_not_applied", None, f"files of segment {segment} but it is not applied"))
    if wal_dir is not None:
        for ref in list_segments(wal_dir):
            if ref.state is SegmentState.APPLIED and ref.segment_id not in state.applied_segments:
                problems.append(
                    Problem("segment_applied_on_disk_only", str(ref.path), "in applied/ but not in the catalog")
                )
    return problems


def rebuild(log: TransactionLog, store: ObjectStore, database: str) -> CatalogState:
    """A fresh catalog from the Parquet files alone (the old log is moved aside first)."""
    files: list[tuple[str, FileMetadata, pq.FileMetaData, int]] = []
    for path, _, size in data_paths(store, database):
        meta, footer = read_file_metadata(store, path)
        if meta is None or meta.database != database:
            continue
        files.append((path, meta, footer, size))
    commits = {(m.segments, m.txn_id) for _, m, _, _ in files if m.kind is FileKind.SCHEMA_HISTORY}
    committed_segments = {segments for segments, _ in commits}
    replaced = {r for _, m, _, _ in files for r in m.replaces}
    keep: list[tuple[str, FileMetadata, pq.FileMetaData, int]] = []
    for path, meta, footer, size in files:
        if path in replaced:
            continue
        if meta.kind is FileKind.SCHEMA_HISTORY or meta.replaces:
            keep.append((path, meta, footer, size))
        elif (meta.segments, meta.txn_id) in commits:
            keep.append((path, meta, footer, size))
        elif meta.segments and meta.segments not in committed_segments:
            continue  # an orphan of an attempt that never wrote its commit record
    history: list[tuple[int, int, SchemaHistoryEntry]] = []
    actions: list[object] = []
    frontier, segments, earliest = -1, set(), 0
    for path, meta, footer, size in sorted(keep, key=lambda item: (item[1].txn_id, item[0])):
        actions.append(AddFile(_entry_from_footer(path, meta, footer, size)))
        if meta.kind is FileKind.SCHEMA_HISTORY:
            frontier = max(frontier, meta.frontier if meta.frontier is not None else -1)
            segments.update(meta.segments)
            table = pq.read_table(store.full_path(path), filesystem=store.arrow_filesystem()[0])
            for order, row in enumerate(table.to_pylist()):
                descriptor = row["schema_descriptor"]
                history.append(
                    (
                        row["logical_timestamp"],
                        order,
                        SchemaHistoryEntry.from_json(
                            {**row, "schema_descriptor": None if descriptor is None else json.loads(descriptor)}
                        ),
                    )
                )
        if meta.earliest is not None:
            earliest = max(earliest, meta.earliest)
    entries = tuple(e for _, _, e in sorted(history, key=lambda h: (h[0], h[1])))
    actions += [AddSchemaHistory(entries), AdvanceFrontier(frontier), ApplySegments(tuple(sorted(segments)))]
    if earliest:
        actions.append(SetEarliest(earliest))
    _move_aside(store, log)
    log.forget_cached_state()
    state = log.commit("rebuild", lambda current: _fresh(current, actions))
    return state


def _fresh(current: CatalogState, actions: Iterable[object]) -> list[object]:
    if current.txn_id >= 0:
        raise CatalogError("the catalog was written to while it was being rebuilt; run rebuild again")
    return list(actions)


def _entry_from_footer(path: str, meta: FileMetadata, footer: pq.FileMetaData, size: int) -> FileEntry:
    min_t, max_t = _column_range(footer, LT)
    min_key, max_key = _column_range(footer, KEY)
    if meta.kind is FileKind.SCHEMA_HISTORY:
        min_t, max_t = meta.lower, meta.frontier
    return FileEntry(
        path=path,
        kind=meta.kind,
        table_uuid=meta.table_uuid,
        size_bytes=size,
        row_count=footer.num_rows,
        min_t=min_t,
        max_t=max_t,
        min_key=min_key,
        max_key=max_key,
        segments=meta.segments,
        snapshot_as_of=meta.snapshot_as_of,
    )


def _move_aside(store: ObjectStore, log: TransactionLog) -> None:
    stamp = f"{int(now() * 1000)}"
    for obj in store.list(f"{log.prefix}/"):
        data = store.get(obj.path)
        store.put(f"{log.prefix}_replaced/{stamp}/{obj.path[len(log.prefix) + 1:]}", data)
        store.delete(obj.path)
