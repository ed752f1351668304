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
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from history_pipeline.catalog.log import TransactionLog, encode_document
from history_pipeline.catalog.model import (
    Action,
    AddFile,
    AddSchemaHistory,
    AdvanceFrontier,
    ApplySegments,
    CatalogState,
    FileEntry,
    FileKind,
    ForgetTombstones,
    RemoveFile,
    Transaction,
    apply_transaction,
)
from history_pipeline.catalog.records import list_record_ids, prune_records, records_after, write_base
from history_pipeline.errors import CatalogError, HistoryError, ObjectExistsError
from history_pipeline.io.store import TEMPORARY_MIN_AGE_S, ObjectStore, now
from history_pipeline.schema import SchemaHistoryEntry
from history_pipeline.supertable import (
    DELETED,
    KEY,
    LT,
    SUPERSEDED,
    FileMetadata,
    column_chunks,
    read_file_metadata,
)
from history_pipeline.supertable.read import dataset_of
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
    records_pruned: int = 0
    tombstones_deleted: list[str] = field(default_factory=list)
    orphans_deleted: list[str] = field(default_factory=list)
    temporaries_deleted: list[str] = field(default_factory=list)
    bytes_freed: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "transactions_pruned": self.transactions_pruned,
            "records_pruned": self.records_pruned,
            "tombstones_deleted": len(self.tombstones_deleted),
            "orphans_deleted": len(self.orphans_deleted),
            "temporaries_deleted": len(self.temporaries_deleted),
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
    # before anything is pruned or deleted: the records must cover every commit
    mirrored = log.repair_records()
    log.write_checkpoint(state)  # so a later run can prune up to here
    if mirrored and log.records_prefix is not None:
        write_base(store, log.records_prefix, state)  # the records' own checkpoint
    old_checkpoints = []
    for checkpoint in log.checkpoint_ids():
        if log.read_checkpoint(checkpoint).committed_at <= cutoff:
            old_checkpoints.append(checkpoint)
    if old_checkpoints:
        report.transactions_pruned = log.prune(old_checkpoints[-1])
        if log.records_prefix is not None:
            # records are pruned like the log: only behind a base older than the grace period
            report.records_pruned = prune_records(store, log.records_prefix, old_checkpoints[-1])
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
    # what interrupted writes left (a crashed commit's or purge's temporary file can name erased keys)
    report.temporaries_deleted = store.sweep_temporaries(f"{database}/", min(cutoff, at - TEMPORARY_MIN_AGE_S))
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
    index = column_chunks(footer).get(name, -1)
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


def verify(
    state: CatalogState,
    store: ObjectStore,
    wal_dir: Path | None = None,
    snapshot_samples: int = 2,
    seed: int | None = None,
) -> list[Problem]:
    """Every problem between the catalog, its files and the WAL (empty when consistent)."""
    problems: list[Problem] = []
    for entry in state.files.values():
        problems += verify_file(store, entry)
    if any(p.kind in ("missing_file", "unreadable_file") for p in problems):
        return problems  # the data checks below would only fail on the same files
    data_max = max((f.max_t for f in state.files.values() if f.max_t is not None and f.is_versions),
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
    problems += verify_data(state, store, snapshot_samples, seed)
    return problems


_RESERVED_SCHEMA = pa.schema([pa.field(KEY, pa.int64()), pa.field(DELETED, pa.bool_()), pa.field(LT, pa.int64())])


def verify_data(state: CatalogState, store: ObjectStore, snapshot_samples: int = 2,
                seed: int | None = None) -> list[Problem]:
    """What the rows say, checked by DuckDB over the live files of each table.

    * ``(synthetic_key, logical_timestamp)`` is unique among the live version files;
    * the purge point matches the files: no snapshot below it, below it at most one
      version per key and no delete (what retention keeps), and no file written by a
      retention to a later purge point than the catalog says;
    * a sample of snapshots (the newest of each table, and random others up to
      ``snapshot_samples``) hold exactly the newest live version of each key that the
      version files give as of the snapshot;
    * every file marked for a closed interval holds each row's next version (``superseded_at``).
    """
    rng = random.Random(seed)
    problems: list[Problem] = []
    for entry in state.files.values():
        # a table's purge point: the database's, or its own TTL retention's when later
        earliest = state.earliest_of(entry.table_uuid) if entry.table_uuid else state.earliest
        if entry.kind is FileKind.VERSIONS:
            meta, _ = read_file_metadata(store, entry.path)
            if meta is not None and meta.earliest is not None and meta.earliest > earliest:
                problems.append(Problem("purge_point_mismatch", entry.path,
                                        f"written by a retention to {meta.earliest}, "
                                        f"but the catalog's earliest is {earliest}"))
        if entry.kind is FileKind.SNAPSHOT and entry.snapshot_as_of is not None \
                and entry.snapshot_as_of < earliest:
            problems.append(Problem("purge_point_mismatch", entry.path,
                                    f"snapshot as of {entry.snapshot_as_of} is below the earliest {earliest}"))
    con = duckdb.connect(":memory:")
    try:
        for table_uuid in sorted({f.table_uuid for f in state.files.values() if f.table_uuid}):
            try:
                problems += _verify_table_data(con, state, store, table_uuid, snapshot_samples, rng)
            except (OSError, pa.ArrowException, duckdb.IOException, duckdb.InvalidInputException) as exc:
                # a file whose footer reads but whose pages do not: a finding naming it, not a crash
                problems += _unreadable_files(store, state.files_of(table_uuid), exc)
            except duckdb.Error as exc:
                if type(exc) is not duckdb.Error:  # a binder or internal error is not about a file
                    raise
                problems += _unreadable_files(store, state.files_of(table_uuid), exc)
    finally:
        con.close()
    return problems


def _unreadable_files(store: ObjectStore, files: list[FileEntry], cause: BaseException) -> list[Problem]:
    """The files among ``files`` whose rows cannot be read (``cause``: what the table's check met)."""
    fs, _ = store.arrow_filesystem()
    found = []
    for entry in files:
        try:
            with fs.open_input_file(store.full_path(entry.path)) as handle:
                pq.read_table(handle)
        except (OSError, pa.ArrowException) as exc:
            found.append(Problem("unreadable_file", entry.path, " ".join(str(exc).split())))
    return found or [Problem("unreadable_file", None, " ".join(str(cause).split()))]


def _verify_table_data(con: duckdb.DuckDBPyConnection, state: CatalogState, store: ObjectStore, table_uuid: str,
                       snapshot_samples: int, rng: random.Random) -> list[Problem]:
    """:func:`verify_data`'s checks of one table's rows."""
    problems: list[Problem] = []
    versions = state.versions_of(table_uuid)
    if not versions:
        return problems
    con.register("v", dataset_of(store, versions, _RESERVED_SCHEMA))
    duplicates = con.execute(
        f"SELECT {KEY}, {LT}, count(*) FROM v GROUP BY ALL HAVING count(*) > 1 ORDER BY ALL LIMIT 3"
    ).fetchall()
    for key, t, count in duplicates:
        problems.append(Problem("duplicate_version", None,
                                f"table {table_uuid}: key {key} at t {t} is in {count} live rows"))
    earliest = state.earliest_of(table_uuid)
    if earliest > 0:
        below = con.execute(
            f"SELECT {KEY}, count(*), bool_or({DELETED}) FROM v WHERE {LT} < ? GROUP BY ALL "
            f"HAVING count(*) > 1 OR bool_or({DELETED}) ORDER BY ALL LIMIT 3", [earliest]
        ).fetchall()
        for key, count, deleted in below:
            problems.append(Problem("purge_point_mismatch", None,
                                    f"table {table_uuid}: key {key} has {count} version(s) below the "
                                    f"earliest {earliest}{' and a delete' if deleted else ''}"))
    snapshots = state.files_of(table_uuid, FileKind.SNAPSHOT)
    for point in _sample_snapshots(snapshots, snapshot_samples, rng):
        # a snapshot is every file of the table at its point (written in pieces by key range)
        pieces = [f for f in snapshots if f.snapshot_as_of == point.snapshot_as_of]
        con.register("s", dataset_of(store, pieces, _RESERVED_SCHEMA))
        differ = con.execute(
            f"""WITH expected AS (
                  SELECT {KEY}, max({LT}) AS t, arg_max({DELETED}, {LT}) AS gone
                  FROM v WHERE {LT} < ? GROUP BY {KEY})
                SELECT coalesce(e.{KEY}, s.{KEY}) FROM (SELECT * FROM expected WHERE NOT gone) e
                FULL OUTER JOIN s ON e.{KEY} = s.{KEY}
                WHERE e.t IS DISTINCT FROM s.{LT} OR s.{DELETED} ORDER BY 1 LIMIT 3""",
            [point.snapshot_as_of],
        ).fetchall()
        for (key,) in differ:
            holder = next((f for f in pieces if f.min_key is not None and f.max_key is not None
                           and f.min_key <= key <= f.max_key), point)
            problems.append(Problem("snapshot_mismatch", holder.path,
                                    f"key {key} differs from the versions as of {point.snapshot_as_of}"))
        con.unregister("s")
    problems += _check_superseded(con, store, state, table_uuid)
    con.unregister("v")  # (a check that fails leaves it registered: the next table's replaces it)
    return problems


_MARKED_SCHEMA = _RESERVED_SCHEMA.append(pa.field(SUPERSEDED, pa.int64()))


def _check_superseded(con: duckdb.DuckDBPyConnection, store: ObjectStore, state: CatalogState,
                      table_uuid: str) -> list[Problem]:
    """Every file marked closed until U holds, per row, its key's next version below U (a
    snapshot row: its key's first version in [snapshot, U)), from the live versions (view ``v``).

    One query per kind of file, however many are marked: their rows are streamed with their file's
    number and joined with its bounds, so the versions are read twice per table, not once per file."""
    problems: list[Problem] = []
    marked = [f for f in state.files_of(table_uuid) if f.closed_until is not None and f.row_count]
    for kind in (FileKind.VERSIONS, FileKind.SNAPSHOT):
        files = [f for f in marked if f.kind is kind]
        if not files:
            continue
        con.register("m", _rows_with_their_file(store, files))
        con.register("bounds", pa.table({"file": pa.array(range(len(files)), pa.int32()),
                                         "lower": pa.array([f.snapshot_as_of for f in files], pa.int64()),
                                         "upper": pa.array([f.closed_until for f in files], pa.int64())}))
        if kind is FileKind.SNAPSHOT:
            # the key's first version at or after the snapshot: the snapshot's rows placed among the
            # versions at the snapshot's t (before a version at that t), each taking the nearest
            # version after it (a join on the key would pair each row with every version of its key)
            expected = (f"SELECT file, {KEY}, {LT}, {SUPERSEDED}, upper, nxt FROM ("
                        f"SELECT *, min(CASE WHEN file IS NULL THEN from_t END) OVER (PARTITION BY {KEY} "
                        f"ORDER BY from_t, file NULLS LAST ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS nxt "
                        f"FROM ("
                        f"SELECT m.file, m.{KEY}, m.{LT}, m.{SUPERSEDED}, b.upper, b.lower AS from_t "
                        f"FROM m JOIN bounds b USING (file) UNION ALL "
                        f"SELECT NULL, {KEY}, {LT}, NULL, NULL, {LT} FROM v)) WHERE file IS NOT NULL")
        else:
            expected = (f"SELECT m.file, m.{KEY}, m.{LT}, m.{SUPERSEDED}, b.upper, n.nxt "
                        f"FROM m JOIN bounds b USING (file) LEFT JOIN (SELECT {KEY}, {LT}, "
                        f"lead({LT}) OVER (PARTITION BY {KEY} ORDER BY {LT}) AS nxt FROM v) n USING ({KEY}, {LT})")
        wrong = con.execute(
            f"SELECT file, {KEY}, {LT} FROM ({expected}) "
            f"WHERE {SUPERSEDED} IS DISTINCT FROM (CASE WHEN nxt < upper THEN nxt END) "
            f"QUALIFY row_number() OVER (PARTITION BY file ORDER BY {KEY}, {LT}) <= 3 "
            f"ORDER BY file, {KEY}, {LT}").fetchall()
        for number, key, t in wrong:
            entry = files[number]
            problems.append(Problem("superseded_mismatch", entry.path,
                                    f"key {key} at t {t}: superseded_at is not its next version below "
                                    f"{entry.closed_until}"))
        con.unregister("m")
        con.unregister("bounds")
    return problems


def _rows_with_their_file(store: ObjectStore, files: list[FileEntry]) -> pa.RecordBatchReader:
    """(synthetic_key, logical_timestamp, superseded_at, file) of ``files``, streamed file by file;
    ``file`` is the file's position in ``files``."""
    schema = _MARKED_SCHEMA.remove(_MARKED_SCHEMA.get_field_index(DELETED)).append(pa.field("file", pa.int32()))

    def batches() -> Iterator[pa.RecordBatch]:
        for number, entry in enumerate(files):
            for batch in dataset_of(store, [entry], _MARKED_SCHEMA).to_batches(columns=[KEY, LT, SUPERSEDED]):
                yield batch.append_column("file", pa.repeat(pa.scalar(number, pa.int32()), batch.num_rows))

    return pa.RecordBatchReader.from_batches(schema, batches())


def _sample_snapshots(snapshots: list[FileEntry], samples: int, rng: random.Random) -> list[FileEntry]:
    """The newest snapshot point and random others, ``samples`` in all (one file standing for each
    point; a point's pieces are checked together)."""
    if samples <= 0 or not snapshots:
        return []
    points = {f.snapshot_as_of: f for f in sorted(snapshots, key=lambda f: f.path, reverse=True)}
    ordered = sorted(points.values(), key=lambda f: (f.snapshot_as_of or 0, f.path))
    rest = ordered[:-1]
    return [ordered[-1], *rng.sample(rest, min(samples - 1, len(rest)))]


def rebuild(log: TransactionLog, store: ObjectStore, database: str) -> CatalogState:
    """A fresh catalog from what commits made durable (the old log is moved aside first).

    The commit records (one per committed transaction, see ``catalog.records``)
    are replayed from the newest base. Only when they may not cover every commit
    (the old log is gone or unreadable, or a record is missing) are compaction
    commits beyond them recovered from the files: a schema-history file is
    compaction's own record, and it brings the version and snapshot files of its
    attempt. Files of merge, retention or load-back without a record are orphans.
    The rebuilt state continues the transaction numbering (a checkpoint at the
    next id), so records stay ordered across rebuilds.
    """
    if log.records_prefix is None:
        raise CatalogError(f"the catalog at {log.prefix} keeps no commit records, so it cannot be rebuilt")
    old_ids = log.transaction_ids() + log.checkpoint_ids()
    log_complete = log.repair_records() and bool(old_ids)
    base, records = records_after(store, log.records_prefix)
    state = base if base is not None else CatalogState()
    start = state.txn_id + 1
    contiguous = [r.txn_id for r in records] == list(range(start, start + len(records)))
    for txn in records:
        state = _fold_leniently(state, txn)
    if not (log_complete and contiguous):
        state = _adopt_compactions(state, store, database)
    present = list_record_ids(store, log.records_prefix)
    new_id = max([state.txn_id, *old_ids, *present.records, *present.bases]) + 1
    rebuilt = replace(state, txn_id=new_id, txn_uuid=str(uuid.uuid4()), committed_at=now())
    write_base(store, log.records_prefix, rebuilt)  # first: a crash from here on rebuilds the same
    # the new checkpoint before the old log goes aside: it is the newest, so reads take it as their
    # base at once, and a crash in between leaves the rebuilt state, not an empty catalog
    try:
        store.put_if_absent(log.checkpoint_path(new_id), encode_document(rebuilt.to_json()))
    except ObjectExistsError:
        raise CatalogError("the catalog was written to while it was being rebuilt; run rebuild again") from None
    _move_aside(store, log, keep=log.checkpoint_path(new_id))
    if log.transaction_ids():
        raise CatalogError("the catalog was written to while it was being rebuilt; run rebuild again")
    log.forget_cached_state()
    return log.latest()


def _fold_leniently(state: CatalogState, txn: Transaction) -> CatalogState:
    """Apply a recorded transaction, skipping what no longer applies (after a gap in the records)."""
    kept: list[Action] = []
    files, applied = set(state.files), set(state.applied_segments)
    for action in txn.actions:
        if isinstance(action, RemoveFile):
            if action.path not in files:
                continue
            files.discard(action.path)
        elif isinstance(action, AddFile):
            if action.entry.path in files:
                continue
            files.add(action.entry.path)
        elif isinstance(action, ApplySegments):
            action = ApplySegments(tuple(s for s in action.segments if s not in applied))
            applied.update(action.segments)
        elif isinstance(action, AdvanceFrontier) and action.frontier < state.frontier:
            continue
        kept.append(action)
    chained = replace(state, txn_id=txn.txn_id - 1, txn_uuid=txn.previous_uuid)
    return apply_transaction(chained, replace(txn, actions=tuple(kept)))


def _adopt_compactions(state: CatalogState, store: ObjectStore, database: str) -> CatalogState:
    """Add the compaction commits the records do not cover, from the files' own metadata.

    A schema-history file of a segment not yet applied, written for a transaction after
    the last recorded one, is adopted with the version and snapshot files of the same
    attempt (same segments, transaction id and attempt id: a retry under the same transaction id
    overwrites the schema-history file, and its files are told from the crashed attempt's by the
    attempt id); of several attempts of a segment the newest wins. Nothing else is adopted.
    """
    known = set(state.files) | set(state.tombstones)
    found: list[tuple[str, FileMetadata, pq.FileMetaData, int]] = []
    for path, _, size in data_paths(store, database):
        if path in known:
            continue
        meta, footer = read_file_metadata(store, path)
        if meta is not None and meta.database == database:
            found.append((path, meta, footer, size))
    attempts: dict[tuple[int, ...], tuple[str, FileMetadata, pq.FileMetaData, int]] = {}
    for item in found:
        meta = item[1]
        if (meta.kind is FileKind.SCHEMA_HISTORY and meta.txn_id > state.txn_id and meta.segments
                and not set(meta.segments) & state.applied_segments):
            if meta.segments not in attempts or attempts[meta.segments][1].txn_id < meta.txn_id:
                attempts[meta.segments] = item
    for path, meta, footer, size in sorted(attempts.values(), key=lambda item: item[1].txn_id):
        actions: list[Action] = [AddFile(_entry_from_footer(path, meta, footer, size))]
        actions += [
            AddFile(_entry_from_footer(p, m, f, s))
            for p, m, f, s in sorted(found, key=lambda item: item[0])
            if m.kind is not FileKind.SCHEMA_HISTORY and m.segments == meta.segments and m.txn_id == meta.txn_id
            and not m.replaces and m.attempt == meta.attempt
        ]
        table = pq.read_table(store.full_path(path), filesystem=store.arrow_filesystem()[0])
        entries = []
        for row in table.to_pylist():
            descriptor = row["schema_descriptor"]
            entries.append(SchemaHistoryEntry.from_json(
                {**row, "schema_descriptor": None if descriptor is None else json.loads(descriptor)}))
        if entries:
            actions.append(AddSchemaHistory(tuple(entries)))
        if meta.frontier is not None:
            actions.append(AdvanceFrontier(max(meta.frontier, state.frontier)))
        actions.append(ApplySegments(meta.segments))
        txn = Transaction(state.txn_id + 1, str(uuid.uuid4()), state.txn_uuid, now(), "rebuild", tuple(actions))
        state = apply_transaction(state, txn)
    return state


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
        closed_until=meta.closed_until,
        closed_layout=meta.closed_layout,
        holds_versions=meta.holds_versions,
    )


def _move_aside(store: ObjectStore, log: TransactionLog, keep: str) -> None:
    stamp = f"{int(now() * 1000)}"
    for obj in store.list(f"{log.prefix}/"):
        if obj.path == keep:
            continue
        data = store.get(obj.path)
        store.put(f"{log.prefix}_replaced/{stamp}/{obj.path[len(log.prefix) + 1:]}", data)
        store.delete(obj.path)
