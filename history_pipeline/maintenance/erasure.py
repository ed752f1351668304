"""Erasure: forget every version of some keys of a table, everywhere the store keeps them.

The right to erasure, done the way merge and retention change files (copy-on-write,
one catalog transaction):

1. the WAL: every segment file still on disk is rewritten without the keys' row
   events and re-sealed (``wal/masking.py``), under the writer lock, first, so that
   no compaction from here on writes them again;
2. the warehouse: every live version and snapshot file of the table that holds a key
   is rewritten without it (one Spark task per file, an Arrow filter), and one
   transaction removes the old files, adds the new ones and records the erasure
   (:class:`RecordErasure`: table, key count, SHA-256 of the key set, who, when, why;
   never keys or values). The old files are tombstones: ``cleanup(grace)`` deletes
   them after the grace period, ``purge_now=True`` at once (see :func:`purge_erased`);
3. the cold tier and exports: purged history and point-in-time exports in every
   target the store has written to (and any named by the caller) are rewritten
   without the keys, so ``load_cold_tier`` and ``load_export`` never bring them back.

Every step is idempotent: after a crash anywhere, running the same erasure again
finishes it. A crash before the commit leaves every answer as it was (the keys
included, unless the WAL was masked already, which no answer reads).
"""

from __future__ import annotations

import hashlib
import io
import json
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from history_pipeline.catalog.files import write_parquet
from history_pipeline.catalog.handle import DatabaseHandle
from history_pipeline.catalog.model import (
    AddFile,
    CatalogState,
    FileEntry,
    FileKind,
    ForgetTombstones,
    RecordErasure,
    RemoveFile,
)
from history_pipeline.catalog.records import prune_records, write_base
from history_pipeline.errors import CommitConflictError, MaintenanceInputError, ObjectNotFoundError
from history_pipeline.execution import map_tasks, open_executor_store, store_for_tasks
from history_pipeline.io.store import TEMPORARY_MIN_AGE_S, ObjectStore, now, sweep_folder
from history_pipeline.schema import Supercolumn, replay_schema_history
from history_pipeline.supertable import (
    CLOSED_LAYOUT,
    KEY,
    METADATA_KEY,
    SUPERSEDED,
    FileMetadata,
    layout_of,
    new_file_path,
    read_file_metadata,
    supertable_schema,
)
from history_pipeline.supertable.read import dataset_of, footer

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
ERASABLE = (FileKind.VERSIONS, FileKind.SNAPSHOT)
MAX_REPLANS = 5


ErasureInputError = MaintenanceInputError  # the name erasure callers know


class NothingToEraseWarning(UserWarning):
    """Some (or all) of an erasure's keys had nothing anywhere to erase."""


#: where erased keys can be found, as a :class:`Place` names it
TIERS = ("warehouse", "tombstone", "wal", "audit", "cold tier", "export")


@dataclass(frozen=True)
class Place:
    """One file that holds erased keys: what the erasure rewrites, masks, redacts or deletes there."""

    tier: str  # one of TIERS
    path: str  # a path under the root, a WAL file, or a cold tier's or export target's URI and path
    count: int  # versions, events or rows of the keys in it (an audit record is redacted whole: 0)

    def as_dict(self) -> dict[str, Any]:
        return {"tier": self.tier, "path": self.path, "count": self.count}


@dataclass
class ErasureSummary:
    """What one erasure did (``dry_run``: what it would do; nothing was changed)."""

    table_uuid: str
    key_count: int
    keys_sha256: str
    txn_id: int | None = None
    files_rewritten: int = 0
    versions_removed: int = 0
    wal_files_masked: int = 0
    wal_events_removed: int = 0
    cold_files_rewritten: int = 0
    export_files_rewritten: int = 0
    files_deleted: int = 0
    #: how many of the keys had anything to erase (a live or replaced version, a WAL event, a purged
    #: or exported row)
    keys_found: int = 0
    dry_run: bool = False
    places: list[Place] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["places"] = [p.as_dict() for p in self.places]
        out["warnings"] = list(self.warnings)
        return out


def normalize_keys(keys: Iterable[Any]) -> tuple[int, ...]:
    """The distinct keys, sorted; anything but a 64-bit integer is an :class:`ErasureInputError`."""
    found = []
    for key in keys:
        if isinstance(key, bool) or not isinstance(key, int) or not INT64_MIN <= key <= INT64_MAX:
            raise ErasureInputError(f"erasure key {key!r} is not a synthetic key: pass 64-bit integers")
        found.append(key)
    if not found:
        raise ErasureInputError("an erasure needs at least one key")
    return tuple(sorted(set(found)))


def check_requester(requested_by: str) -> None:
    """An erasure's record must say who asked for it."""
    if not requested_by.strip():
        raise ErasureInputError("an erasure needs the name of who requested it (--by NAME)")


def keys_digest(table_uuid: str, keys: Sequence[int]) -> str:
    """SHA-256 over the table uuid and the sorted keys: confirms a key list without listing it."""
    text = table_uuid + ":" + ",".join(str(k) for k in sorted(keys))
    return hashlib.sha256(text.encode()).hexdigest()


def may_hold(entry: FileEntry, keys: Sequence[int]) -> bool:
    """Can ``entry`` hold one of the sorted ``keys`` (by its key range)?"""
    if entry.row_count == 0:
        return False
    if entry.min_key is None or entry.max_key is None:
        return True
    index = bisect_left(keys, entry.min_key)
    return index < len(keys) and keys[index] <= entry.max_key


# --- the warehouse ---------------------------------------------------------------------


@dataclass(frozen=True)
class EraseTask:
    """One file's share of an erasure (picklable, for Spark executors)."""

    store_config: dict[str, Any]
    database: str
    table_uuid: str
    file: FileEntry
    supercolumns: tuple[Supercolumn, ...]
    keys: tuple[int, ...]
    txn_hint: int
    dry_run: bool = False  # only count what the file holds of the keys


@dataclass(frozen=True)
class EraseOutcome:
    removed: str | None  # the file rewritten (None: it held none of the keys)
    added: FileEntry | None  # its replacement (None: nothing of it remains)
    versions_removed: int
    keys_found: tuple[int, ...] = ()


def erase_file_task(task: EraseTask) -> EraseOutcome:
    """Rewrite one file without the keys; nothing is committed here."""
    objects = open_executor_store(task.store_config)
    entry = task.file
    schema = supertable_schema(task.supercolumns)
    # removing whole keys leaves every other row's next version as it was: a closed interval's
    # superseded_at (and the file's mark) is kept
    marked = SUPERSEDED in footer(objects, entry.path).columns
    if marked:
        schema = schema.append(pa.field(SUPERSEDED, pa.int64()))
    dataset = dataset_of(objects, [entry], schema)
    erased = pa.array(task.keys, pa.int64())
    hits, found = _hits(dataset.to_table(columns=[KEY]).column(KEY), erased)
    if not hits:
        return EraseOutcome(None, None, 0)
    if task.dry_run:
        return EraseOutcome(entry.path, None, hits, found)
    rest = dataset.to_table(filter=~ds.field(KEY).isin(erased))
    if rest.num_rows == 0 and entry.kind is FileKind.VERSIONS:
        return EraseOutcome(entry.path, None, hits, found)
    # an empty snapshot stays: it still says "the table as of then", and reads start from it
    meta, _ = read_file_metadata(objects, entry.path)
    if meta is None:
        meta = FileMetadata(task.database, task.table_uuid, entry.kind, task.txn_hint, entry.min_t,
                            None if entry.max_t is None else entry.max_t + 1, segments=entry.segments,
                            snapshot_as_of=entry.snapshot_as_of)
    meta = replace(meta, txn_id=task.txn_hint, replaces=(entry.path,),
                   closed_until=meta.closed_until if marked else None,
                   closed_layout=CLOSED_LAYOUT if marked and meta.closed_until is not None else None)
    path = new_file_path(task.database, task.table_uuid, entry.kind, task.txn_hint)
    row_groups = None
    if marked and meta.closed_until is not None:  # the kept rows in the closed layout again
        rest, row_groups = layout_of(rest, entry.snapshot_as_of, entry.holds_versions)
    return EraseOutcome(entry.path, write_parquet(objects, path, rest, meta, row_groups), hits, found)


def _hits(column: pa.ChunkedArray | pa.Array, erased: pa.Array) -> tuple[int, tuple[int, ...]]:
    """(how many of ``column``'s keys are erased, which of them)."""
    mask = pc.is_in(column, value_set=erased)
    hits = pc.sum(mask).as_py() or 0
    return hits, tuple(sorted(pc.unique(pc.filter(column, mask)).to_pylist())) if hits else ()


class _Replan(Exception):
    """The table changed between planning and commit: plan again."""


def _planned_tasks(store: DatabaseHandle, state: CatalogState, table_uuid: str, keys: tuple[int, ...],
                   spark: Any | None, dry_run: bool) -> list[EraseTask]:
    supers = tuple(replay_schema_history(state.schema_history).supercolumns.get(table_uuid, ()))
    store_config = store_for_tasks(spark, store.objects)
    return [EraseTask(store_config, store.database, table_uuid, f, supers, keys, state.txn_id + 1, dry_run)
            for f in state.files_of(table_uuid) if f.kind in ERASABLE and may_hold(f, keys)]


def _tombstones_holding(store: DatabaseHandle, state: CatalogState, table_uuid: str, keys: tuple[int, ...],
                        found: set[int]) -> list[Place]:
    """The replaced files (not yet deleted) that hold the keys: cleanup deletes them after its grace
    period, ``purge_now`` at once."""
    places = []
    erased = pa.array(keys, pa.int64())
    for path, tomb in sorted(state.tombstones.items()):
        if tomb.entry.table_uuid != table_uuid or tomb.entry.kind not in ERASABLE or not may_hold(tomb.entry, keys):
            continue
        if not store.objects.exists(path):  # deleted, not yet forgotten (a crashed cleanup)
            continue
        column = pq.read_table(store.objects.full_path(path), filesystem=store.objects.arrow_filesystem()[0],
                               columns=[KEY]).column(KEY)
        hits, keys_in = _hits(column, erased)
        if hits:
            found.update(keys_in)
            places.append(Place("tombstone", path, hits))
    return places


def _rewrite_and_commit(
    store: DatabaseHandle, table_uuid: str, keys: tuple[int, ...], record: RecordErasure, spark: Any | None, step: Any,
    found: set[int],
) -> tuple[int, list[EraseOutcome]]:
    """(txn id, the outcomes of the files rewritten), after one commit; the keys found are added to
    ``found`` before the commit (the record counts them)."""
    for _ in range(MAX_REPLANS):
        state: CatalogState = store.catalog.latest()
        planned = {f.path for f in state.files_of(table_uuid)}
        tasks = _planned_tasks(store, state, table_uuid, keys, spark, dry_run=False)
        outcomes = [o for o in map_tasks(spark, erase_file_task, tasks) if o.removed is not None]
        held = {k for o in outcomes for k in o.keys_found} | found
        step("files_written")
        removed = [o.removed for o in outcomes if o.removed is not None]
        added = [o.added for o in outcomes if o.added is not None]
        at = now()

        def build(current: CatalogState, removed: list[str] = removed, added: list[FileEntry] = added,
                  planned: set[str] = planned, at: float = at, held: set[int] = held) -> list[Any]:
            # a compaction that read a segment before it was masked may have committed since
            late = [f for f in current.files_of(table_uuid)
                    if f.path not in planned and f.kind in ERASABLE and may_hold(f, keys)]
            if late:
                raise _Replan()
            return [*(RemoveFile(p, at) for p in removed), *(AddFile(e) for e in added),
                    replace(record, erased_at=at, files_rewritten=len(removed), keys_found=len(held))]

        try:
            committed = store.catalog.commit(f"erase {len(keys)} key(s) of {table_uuid}", build)
        except (_Replan, CommitConflictError):
            for entry in added:  # never committed: delete at once rather than leave orphans of erased tables
                store.objects.delete(entry.path)
            continue
        found.update(held)
        return committed.txn_id, outcomes
    raise CommitConflictError(
        f"the files of table {table_uuid} kept changing during the erasure; run the erasure again"
    )


# --- cold tier and exports --------------------------------------------------------------


def _filter_parquet(data: bytes, keys: Sequence[int], found: set[int]) -> tuple[pa.Table, int] | None:
    """(the rows without the keys, how many went), or None when the file holds none of them; the
    keys it holds are added to ``found``."""
    table = pq.read_table(io.BytesIO(data))
    if KEY not in table.column_names:
        return None
    hit = pc.is_in(table.column(KEY), value_set=pa.array(keys, pa.int64()))
    count = pc.sum(hit).as_py() or 0
    if not count:
        return None
    found.update(pc.unique(pc.filter(table.column(KEY), hit)).to_pylist())
    return table.filter(pc.invert(hit)), count


def _parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    return buffer.getvalue()


def _filter_in_place(target: ObjectStore, paths: Iterable[str], keys: Sequence[int], tier: str,
                     found: set[int], dry_run: bool) -> list[Place]:
    """Rewrite files that no manifest names (a crashed retention's or export's) without the keys."""
    done = []
    for path in paths:
        filtered = _filter_parquet(target.get(path), keys, found)
        if filtered is not None:
            if not dry_run:
                target.put(path, _parquet_bytes(filtered[0]))
            done.append(Place(tier, f"{target.uri}/{path}", filtered[1]))
    return done


def _prefixes(target: ObjectStore, root: str, depth: int) -> dict[str, list[str]]:
    """Objects under ``root`` grouped by their first ``depth`` path parts after it."""
    groups: dict[str, list[str]] = {}
    for obj in target.list(root):
        parts = obj.path[len(root):].split("/")
        if len(parts) > depth:
            groups.setdefault(root + "/".join(parts[:depth]), []).append(obj.path)
    return groups


def erase_purged(
    target: ObjectStore, database: str, table_uuid: str, keys: tuple[int, ...], txn_hint: int,
    found: set[int] | None = None, *, dry_run: bool = False,
) -> list[Place]:
    """Rewrite the purged history in a cold tier without the keys; returns the files rewritten
    (``dry_run``: to be rewritten) and adds the keys they held to ``found``.

    A rewritten file gets a new path and the manifest names it (written after it), then the
    old file goes; objects of a purge prefix that its manifest does not name are leftovers of
    an interrupted erasure and go too. Files of a retention that never wrote its manifest are
    filtered in place.
    """
    found = set() if found is None else found
    rewritten: list[Place] = []
    for prefix, paths in _prefixes(target, f"{database}/purged/", 1).items():
        manifest_path = f"{prefix}/manifest.json"
        if manifest_path not in paths:
            rewritten += _filter_in_place(target, [p for p in paths if p.endswith(".parquet")], keys, "cold tier",
                                          found, dry_run)
            continue
        manifest = json.loads(target.get(manifest_path))
        entries, gone = [], []
        for raw in manifest["removed"]:
            entry = FileEntry.from_json(raw)
            if entry.table_uuid != table_uuid or entry.kind not in ERASABLE or not may_hold(entry, keys):
                entries.append(raw)
                continue
            data = target.get(f"{prefix}/{entry.path}")
            filtered = _filter_parquet(data, keys, found)
            if filtered is None:
                entries.append(raw)
                continue
            gone.append(entry.path)
            rewritten.append(Place("cold tier", f"{target.uri}/{prefix}/{entry.path}", filtered[1]))
            if dry_run:
                continue
            rest = filtered[0]
            if rest.num_rows == 0 and entry.kind is FileKind.VERSIONS:
                continue
            footer = pq.read_metadata(io.BytesIO(data)).metadata or {}
            meta = FileMetadata.from_bytes(footer[METADATA_KEY]) if METADATA_KEY in footer else FileMetadata(
                database, table_uuid, entry.kind, txn_hint, entry.min_t, None, snapshot_as_of=entry.snapshot_as_of)
            path = new_file_path(database, table_uuid, entry.kind, txn_hint)
            written = write_parquet(target, f"{prefix}/{path}", rest, replace(meta, replaces=(entry.path,)))
            entries.append(replace(written, path=path).to_json())
        if dry_run:
            continue
        if gone:
            target.put(manifest_path, json.dumps({**manifest, "removed": entries}).encode())
        named = {manifest_path, *(f"{prefix}/{e['path']}" for e in entries)}
        for path in paths:
            if path not in named:
                target.delete(path)
    return rewritten


def erase_exports(target: ObjectStore, database: str, table_uuid: str, keys: tuple[int, ...],
                  found: set[int] | None = None, *, dry_run: bool = False) -> list[Place]:
    """Rewrite the table's files of every export in ``target`` without the keys; returns them
    (``dry_run``: those to be rewritten) and adds the keys they held to ``found``.

    As for purged history: new path, manifest after it, old file (and any object the manifest
    does not name) deleted; an export without a manifest is filtered in place.
    """
    found = set() if found is None else found
    rewritten: list[Place] = []
    for prefix, paths in _prefixes(target, f"{database}/exports/", 1).items():
        manifest_path = f"{prefix}/manifest.json"
        if manifest_path not in paths:
            mine = [p for p in paths if p.endswith(f"-{table_uuid}.parquet") or f"-{table_uuid}-erased-" in p]
            rewritten += _filter_in_place(target, mine, keys, "export", found, dry_run)
            continue
        manifest = json.loads(target.get(manifest_path))
        tables, changed = [], False
        for item in manifest["tables"]:
            if (item.get("schema") or {}).get("table_uuid") != table_uuid:
                tables.append(item)
                continue
            filtered = _filter_parquet(target.get(item["path"]), keys, found)
            if filtered is None:
                tables.append(item)
                continue
            rewritten.append(Place("export", f"{target.uri}/{item['path']}", filtered[1]))
            if dry_run:
                continue
            data = _parquet_bytes(filtered[0])
            stem = item["path"].removesuffix(".parquet").split("-erased-")[0]
            path = f"{stem}-erased-{hashlib.sha256(data).hexdigest()[:12]}.parquet"
            target.put(path, data)
            tables.append({**item, "path": path, "rows": filtered[0].num_rows, "bytes": len(data)})
            changed = True
        if dry_run:
            continue
        if changed:
            target.put(manifest_path, json.dumps({**manifest, "tables": tables}, indent=2).encode())
        named = {manifest_path, *(t["path"] for t in tables)}
        for path in paths:
            if path not in named:
                target.delete(path)
    return rewritten


# --- where the store has written cold tiers and exports -----------------------------------


def targets_prefix(database: str) -> str:
    return f"{database}/_history_catalog/targets"


def register_target(objects: ObjectStore, database: str, uri: str) -> None:
    """Remember that ``uri`` holds a cold tier or exports of ``database`` (erasure must reach it)."""
    name = hashlib.sha256(uri.encode()).hexdigest()[:32]
    path = f"{targets_prefix(database)}/{name}.json"
    if not objects.exists(path):
        objects.put(path, json.dumps({"uri": uri}).encode())  # the same name always holds the same body


def known_targets(objects: ObjectStore, database: str) -> list[str]:
    """Every cold tier or export target registered for ``database``."""
    found = []
    for obj in objects.list(f"{targets_prefix(database)}/"):
        if obj.path.endswith(".json"):
            try:
                found.append(json.loads(objects.get(obj.path))["uri"])
            except ObjectNotFoundError:
                continue
    return sorted(set(found))


# --- physical deletion ----------------------------------------------------------------


def purge_erased(store: DatabaseHandle, paths: Sequence[str], table_uuid: str | None = None,
                 keys: Sequence[int] = ()) -> int:
    """Delete the files an erasure replaced now, rather than after the grace period, and every
    other tombstone of ``table_uuid`` that may hold one of the sorted ``keys`` (files an earlier
    merge or interval close replaced still hold them until ``cleanup``).

    The log (and the commit records) are pruned up to the newest state first, so no
    retained transaction can read the deleted files: time travel to a catalog
    transaction before the erasure then fails with ``TransactionNotFoundError``.
    Temporary files that interrupted writes left (an earlier, crashed purge's, which can name
    erased keys) go too, once older than :data:`TEMPORARY_MIN_AGE_S`.
    """
    older_than = now() - TEMPORARY_MIN_AGE_S
    store.objects.sweep_temporaries(f"{store.database}/", older_than)
    sweep_folder(store.wal_dir, older_than)
    log = store.catalog
    state: CatalogState = log.latest()
    log.repair_records()
    log.write_checkpoint(state)
    log.prune(state.txn_id)
    if log.records_prefix is not None:
        write_base(store.objects, log.records_prefix, state)
        prune_records(store.objects, log.records_prefix, state.txn_id)
    stale = [p for p, tomb in state.tombstones.items()
             if tomb.entry.table_uuid == table_uuid and tomb.entry.kind in ERASABLE and may_hold(tomb.entry, keys)]
    gone = [p for p in dict.fromkeys([*paths, *stale]) if p in state.tombstones and p not in state.files]
    for path in gone:
        store.objects.delete(path)
    if gone:
        def forget(current: CatalogState) -> list[ForgetTombstones] | None:
            known = tuple(p for p in gone if p in current.tombstones)
            return [ForgetTombstones(known)] if known else None

        log.commit("cleanup after erasure", forget)
    return len(gone)


# --- the whole erasure ------------------------------------------------------------------


@dataclass(frozen=True)
class ErasureRequest:
    """What to erase and who asked."""

    table_uuid: str
    keys: tuple[int, ...]
    requested_by: str
    reason: str = ""
    targets: tuple[ObjectStore, ...] = field(default=())


def erase(store: DatabaseHandle, request: ErasureRequest, *, spark: Any | None = None, purge_now: bool = False,
          on_step: Any = None, dry_run: bool = False) -> ErasureSummary:
    """Erase ``request.keys`` of one table from the WAL, the warehouse, the cold tier and exports
    (``dry_run``: say what would be removed, and where, changing nothing).

    Keys that nothing holds are a :class:`NothingToEraseWarning` (and in the summary's warnings);
    the erasure is still recorded, with the count of keys found."""
    import warnings

    from history_pipeline.wal.masking import mask_wal

    step = on_step or (lambda s: None)
    check_requester(request.requested_by)
    for target in request.targets:
        # reach every cold tier and export target before anything changes: one found unreachable
        # after the local commit would leave the erasure done here and not there (a typed error)
        target.list(f"{store.database}/")
    keys, table_uuid = request.keys, request.table_uuid
    summary = ErasureSummary(table_uuid, len(keys), keys_digest(table_uuid, keys), dry_run=dry_run)
    found: set[int] = set()
    masked = _mask_wal(store, table_uuid, keys, dry_run, mask_wal)
    summary.wal_files_masked = len(masked)
    summary.wal_events_removed = sum(m.lines_removed for m in masked)
    for m in masked:
        found.update(m.keys_found)
        summary.places.append(Place("wal", m.path, m.lines_removed))
        summary.places += [Place("audit", r, 0) for r in m.records]
    step("wal_masked")
    state = store.catalog.latest()
    tombstones = _tombstones_holding(store, state, table_uuid, keys, found)
    if dry_run or len(found) < len(keys):
        # the record counts the keys found anywhere, but the cold tiers are rewritten after the commit
        summary.places += _other_tiers(store, request, state.txn_id + 1, found, dry_run=True)
    if dry_run:
        outcomes = [o for o in map_tasks(spark, erase_file_task, _planned_tasks(store, state, table_uuid, keys, spark,
                                                                                dry_run=True))
                    if o.removed is not None]
        for o in outcomes:
            found.update(o.keys_found)
        summary.files_rewritten = len(outcomes)
        summary.versions_removed = sum(o.versions_removed for o in outcomes)
        summary.cold_files_rewritten = sum(p.tier == "cold tier" for p in summary.places)
        summary.export_files_rewritten = sum(p.tier == "export" for p in summary.places)
        summary.files_deleted = len(outcomes) + len(tombstones) if purge_now else 0
    else:
        summary.places = [p for p in summary.places if p.tier not in ("cold tier", "export")]
        record = RecordErasure(table_uuid, len(keys), summary.keys_sha256, request.requested_by, request.reason,
                               0.0, 0)
        summary.txn_id, outcomes = _rewrite_and_commit(store, table_uuid, keys, record, spark, step, found)
        summary.files_rewritten = len(outcomes)
        summary.versions_removed = sum(o.versions_removed for o in outcomes)
        step("committed")
        others = _other_tiers(store, request, summary.txn_id, set(), dry_run=False)
        summary.places += others
        summary.cold_files_rewritten = sum(p.tier == "cold tier" for p in others)
        summary.export_files_rewritten = sum(p.tier == "export" for p in others)
        step("cold_tier_written")
        if purge_now:
            summary.files_deleted = purge_erased(store, [o.removed for o in outcomes if o.removed is not None],
                                                 table_uuid, keys)
    summary.places[:0] = [Place("warehouse", o.removed, o.versions_removed) for o in outcomes if o.removed]
    summary.places += tombstones
    summary.keys_found = len(found)
    if len(found) < len(keys):
        missing = len(keys) - len(found)
        message = (f"{missing} of the {len(keys)} key(s) to erase from table {table_uuid} had nothing to erase: "
                   "no version, WAL event, purged or exported row holds them"
                   + ("" if found or dry_run else "; the erasure changed no file (its record is kept)"))
        summary.warnings.append(message)
        warnings.warn(message, NothingToEraseWarning, stacklevel=2)
    return summary


def _mask_wal(store: DatabaseHandle, table_uuid: str, keys: tuple[int, ...], dry_run: bool, mask_wal: Any) -> list:
    """The WAL files masked (``dry_run``: to be masked, read without the writer lock, whose recovery
    may write)."""
    from history_pipeline.wal.writer import WalWriter

    if not store.wal_dir.is_dir():
        return []
    if dry_run:
        return mask_wal(store.wal_dir, table_uuid, keys, dry_run=True)
    with WalWriter(store.wal_dir):  # the writer lock (and recovery): no segment grows while we mask
        return mask_wal(store.wal_dir, table_uuid, keys)


def _other_tiers(store: DatabaseHandle, request: ErasureRequest, txn_hint: int, found: set[int], *,
                 dry_run: bool) -> list[Place]:
    """The purged history and exports in every target rewritten without the keys (or to be)."""
    places: list[Place] = []
    for target in request.targets:
        places += erase_purged(target, store.database, request.table_uuid, request.keys, txn_hint, found,
                               dry_run=dry_run)
        places += erase_exports(target, store.database, request.table_uuid, request.keys, found, dry_run=dry_run)
    return places
