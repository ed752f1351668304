"""HistoryStore: the one object users hold."""

from __future__ import annotations

import contextlib
import itertools
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from history_pipeline.catalog import CatalogState, TransactionLog
from history_pipeline.catalog.ledger import ErasureEntry, read_ledger
from history_pipeline.catalog.upkeep import GcReport, Problem, collect_garbage, rebuild, verify
from history_pipeline.compaction.compactor import AppliedSegment, CompactionSummary
from history_pipeline.errors import (
    DatabaseNotFoundError,
    DataFileError,
    HistoryError,
    InputFileError,
    MaintenanceInputError,
    NegativeTimestampError,
    ObjectNotFoundError,
    ObjectStoreError,
    QueryError,
    SegmentNotFoundError,
    SegmentOrderError,
    SegmentQuarantinedError,
    StorageRootError,
)
from history_pipeline.io.store import TEMPORARY_MIN_AGE_S, ObjectStore, S3Options, now, open_store, sweep_folder
from history_pipeline.lsn import to_timestamp
from history_pipeline.maintenance.erasure import (
    ErasureRequest,
    ErasureSummary,
    check_requester,
    erase,
    known_targets,
    normalize_keys,
    register_target,
)
from history_pipeline.maintenance.export import export_database
from history_pipeline.maintenance.merge import MergeSummary, merge
from history_pipeline.maintenance.retention import RetentionSummary, load_cold_tier, retain
from history_pipeline.maintenance.snapshot_pieces import PIECE_ROWS
from history_pipeline.maintenance.snapshots import (
    INTERVAL_PIECE_ROWS,
    SnapshotSummary,
    due_tables,
    marking_due,
    refresh_snapshots,
)
from history_pipeline.maintenance.ttl import TtlSummary, apply_ttl, set_ttl, ttl_purge_points
from history_pipeline.query.changes import ChangeBatch
from history_pipeline.query.engine import QueryContext
from history_pipeline.schema import TableDescriptor
from history_pipeline.wal import SegmentRef, SegmentState, WalWriter, list_segments
from history_pipeline.wal.repair import RepairRecord, repair_records, repair_segment, skip_segment
from history_pipeline.wal.segments import public_reason, quarantine_reason, read_segment, release_segment, segment_name

_DATABASE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class StoreSettings:
    """Tunables with embedded defaults."""

    max_segment_bytes: int = 64 * 1024 * 1024
    max_segment_age_s: float = 300.0
    checkpoint_interval: int = 20
    #: a table gets a new snapshot once this many versions (and ``snapshot_ratio`` x its live rows)
    #: were written since its last one. Twice the live rows: a snapshot
    #: repeats the rows no version of its interval changed, about e^-ratio of them, so storage falls
    #: from 0.58x to 0.48x Delta's at 10M and 40M versions, while the closed layout's cells by t
    #: keep a read as of any T in the longer interval within 2x of reading its answer (1.1-1.9x)
    snapshot_min_versions: int = 200_000
    snapshot_ratio: float = 2.0
    #: where compaction, merge and retention run when no session is passed: a Spark master (a
    #: local session is created once per process), a Spark Connect URL ``sc://host:port`` (the
    #: process is a client of a long-lived engine), or None to run the same tasks in-process
    spark_master: str | None = "local[*]"
    #: the storage root (when local) and the WAL directory are at the same path on every Spark
    #: executor (a shared mount); without it a non-local master is refused at start-up
    shared_paths: bool = False
    #: how compaction uses a Spark session: "dataframes" (the default: route, decode, validate, fold
    #: and write as Spark/Arrow operations on executors; runs under Spark Connect too) or "tasks"
    #: (per-table tasks running the per-event reference fold on executors)
    compaction_engine: str = "dataframes"
    #: rows a snapshot piece reads at most (its key range's snapshot rows and versions since):
    #: a table's snapshot is written as that many pieces, one Spark task each
    snapshot_piece_rows: int = PIECE_ROWS
    #: rows a task closing an interval reads at most (``close_intervals``): larger than a snapshot
    #: piece, since a closed file's time buckets and cells are cut within the file (a smaller file
    #: has a coarser grid of whole row groups, and a read as of T skips less of it) and closing
    #: overlays nothing. A whole interval at the default spacing (its snapshot, about twice the live
    #: rows of versions) is one piece up to 1.3M live rows
    interval_piece_rows: int = INTERVAL_PIECE_ROWS
    #: the open interval is marked (``superseded_at`` as of the frontier) once its unmarked versions
    #: reach this fraction of the versions that make a snapshot due, or of the snapshot's rows when
    #: snapshots are spaced further apart (``snapshots.marking_share``): a read as of the latest T
    #: then decodes the rows current at the marks and at most that many versions more (0: never)
    mark_open_fraction: float = 0.25


def _quarantined_error(ref: SegmentRef) -> SegmentQuarantinedError:
    """The error a compaction of a quarantined segment raises: its name and recorded reason."""
    reason = quarantine_reason(ref) or {}
    return SegmentQuarantinedError(ref.name, str(reason.get("error", "see its .error.json")))


def default_wal_base(root: str | Path) -> Path:
    """Where WAL segments live for a root: beside the data locally, under ``data/wal`` for S3."""
    if str(root).startswith("s3://"):
        return Path("data") / "wal" / str(root)[len("s3://") :].strip("/")
    return Path(root)


def wal_dir_of(root: str | Path, database: str) -> Path:
    """The WAL directory of one database under ``root``."""
    base = default_wal_base(root)
    return base / database / "wal" if not str(root).startswith("s3://") else base / database


def discover_databases(root: str | Path) -> list[str]:
    """Every database that has a WAL under ``root`` (sorted)."""
    base = default_wal_base(root)
    if not base.is_dir():
        return []
    found = []
    for entry in sorted(base.iterdir()):
        wal = wal_dir_of(root, entry.name)
        if entry.is_dir() and _DATABASE_RE.match(entry.name) and (wal / "segments").is_dir():
            found.append(entry.name)
    return found


@dataclass(frozen=True)
class CommitInfo:
    """One catalog commit as ``history`` shows it."""

    txn_id: int
    committed_at: float  # seconds since the epoch
    operation: str
    files_added: int
    files_removed: int
    rows_added: int
    frontier: int | None  # the frontier this commit set, if it moved it


def discover_all_databases(root: str | Path, objects: ObjectStore | None = None) -> list[str]:
    """Databases with a WAL under ``root`` or (local roots) a catalog in it, sorted."""
    found = set(discover_databases(root))
    local = Path(str(root).removeprefix("file://"))
    if objects is not None and not str(root).startswith("s3://") and local.is_dir():
        found.update(e.name for e in local.iterdir() if _DATABASE_RE.match(e.name) and (e / "_catalog").is_dir())
    return sorted(found)


@dataclass(frozen=True)
class BatchOutcome:
    """What :meth:`HistoryStore.compact_batch` did: each segment it applied with that segment's own
    figures, the ones it found applied already, and the error that stopped it part way (None when
    every segment of the batch is applied)."""

    summary: CompactionSummary
    #: segments of the batch (before where it stopped) that were applied before this call
    already_applied: tuple[int, ...]
    error: Exception | None
    #: the segment the error stopped the batch at (not applied; those after it neither)
    stopped_at: int | None = None

    @property
    def applied(self) -> tuple[AppliedSegment, ...]:
        """The segments applied by this call, in order."""
        return tuple(self.summary.applied)


def _consumer_path(database: str, consumer: str) -> str:
    """Where a named change-feed consumer's cursor lives, under the database's folder."""
    if not _DATABASE_RE.match(consumer):
        raise HistoryError(f"consumer name {consumer!r} is not valid: use letters, digits, '_', '-', '.'")
    return f"{database}/_consumers/{consumer}.json"


def _probe_s3(store: HistoryStore) -> None:
    """One listing up front, so missing credentials or a missing bucket are one clear error."""
    try:
        store.objects.list(f"{store.database}/_catalog/")
    except StorageRootError:
        raise
    except ObjectStoreError as exc:  # access refused: the root cannot be used
        raise StorageRootError(str(exc)) from None


@contextlib.contextmanager
def _reading_files() -> Iterator[None]:
    """Reads of files whose footer is sound but whose pages are not (truncated, overwritten) fail in
    pyarrow or DuckDB, far from knowing which file: a :class:`DataFileError` that says what to do."""
    import duckdb

    try:
        yield
    except HistoryError:
        raise
    except (OSError, pa.ArrowException, duckdb.IOException, duckdb.InvalidInputException) as exc:
        raise DataFileError(None, " ".join(str(exc).split())) from exc
    except duckdb.Error as exc:
        if type(exc) is not duckdb.Error:  # a binder or internal error is not about a file: as it is
            raise
        # DuckDB's plain Error is what a failed read of an Arrow stream over the files surfaces as
        raise DataFileError(None, " ".join(str(exc).split())) from exc


class HistoryStore:
    """The history of one tenant database under a storage root (local path or s3://bucket/prefix)."""

    def __init__(
        self,
        objects: ObjectStore,
        database: str,
        wal_dir: Path,
        settings: StoreSettings,
    ):
        self.objects = objects
        self.database = database
        self.wal_dir = wal_dir
        self.settings = settings
        self.s3: S3Options | None = None
        self.catalog = TransactionLog(
            objects, f"{database}/_catalog", checkpoint_interval=settings.checkpoint_interval
        )

    @classmethod
    def open(
        cls,
        root: str | Path = "data",
        *,
        database: str,
        wal_dir: str | Path | None = None,
        s3: S3Options | None = None,
        settings: StoreSettings | None = None,
        create: bool = True,
    ) -> HistoryStore:
        """Open the history of ``database`` under ``root``.

        With ``create=True`` (writers) the database comes into being on first write; with
        ``create=False`` (readers) a database that does not exist is a
        :class:`DatabaseNotFoundError` naming the databases found under the root, and nothing is
        created. A root that cannot be used (a file, S3 without credentials) is a
        :class:`StorageRootError` either way.
        """
        if not _DATABASE_RE.match(database):
            raise HistoryError(
                f"database name {database!r} is not valid: use letters, digits, '_', '-', '.'"
            )
        root_text = str(root)
        is_s3 = root_text.startswith("s3://")
        if not is_s3:
            local = Path(root_text.removeprefix("file://"))
            if local.exists() and not local.is_dir():
                raise StorageRootError(
                    f"storage root {root_text} is a file, not a folder: pass a folder or s3://bucket/prefix"
                )
            if not create and not local.exists():
                raise DatabaseNotFoundError(
                    f"no database {database!r}: the storage root {root_text} does not exist "
                    "(check --root; `append` creates a database)"
                )
        objects = open_store(root_text, s3)
        wal_dir = Path(wal_dir) if wal_dir is not None else wal_dir_of(root, database)
        store = cls(objects, database, wal_dir, settings or StoreSettings())
        store.s3 = s3
        if is_s3:
            _probe_s3(store)
        if not create and not store.exists():
            found = discover_all_databases(root_text, objects)
            listed = ", ".join(found) if found else "none"
            raise DatabaseNotFoundError(
                f"no database {database!r} under {root_text} (databases found there: {listed}); "
                "check --root and --database (`append` creates a database)"
            )
        return store

    def exists(self) -> bool:
        """True once the database has a WAL or anything in its catalog or warehouse."""
        if (self.wal_dir / "segments").is_dir():
            return True
        if self.objects.list(f"{self.database}/_catalog/"):
            return True
        return bool(self.objects.list(f"{self.database}/"))

    # --- the WAL ---------------------------------------------------------------

    def wal_writer(self, **overrides: Any) -> WalWriter:
        """The database's WAL writer (one at a time); use it as a context manager."""
        return WalWriter(
            self.wal_dir,
            max_segment_bytes=overrides.get("max_segment_bytes", self.settings.max_segment_bytes),
            max_segment_age_s=overrides.get("max_segment_age_s", self.settings.max_segment_age_s),
        )

    def segments(self, state: SegmentState | None = None) -> list[SegmentRef]:
        """The database's WAL segments, optionally only those in one state."""
        return list_segments(self.wal_dir, state)

    def release_segment(self, segment_id: int) -> SegmentRef:
        """Put a quarantined segment back in line for compaction (after an operator fixed it)."""
        for ref in self.segments(SegmentState.QUARANTINED):
            if ref.segment_id == segment_id:
                return release_segment(ref, self.wal_dir)
        raise SegmentNotFoundError(self._not_quarantined(segment_id))

    def _quarantined(self, segment_id: int) -> SegmentRef:
        for ref in self.segments(SegmentState.QUARANTINED):
            if ref.segment_id == segment_id:
                return ref
        raise SegmentNotFoundError(self._not_quarantined(segment_id))

    def repair_segment(self, segment_id: int, events: Path | str, reason: str = "") -> RepairRecord:
        """Replace a quarantined segment's events by the corrected ones in the file ``events``
        (checked first), re-seal it, keep the original for audit, and put it back in line."""
        path = Path(events)
        try:
            lines = path.read_bytes().splitlines()
        except OSError as exc:
            raise InputFileError(f"cannot read the corrected events {path}: {exc.strerror or exc}") from None
        _, record = repair_segment(self._quarantined(segment_id), self.wal_dir, lines, source=str(path),
                                   reason=reason)
        return record

    def skip_segment(self, segment_id: int, reason: str) -> RepairRecord:
        """Drop a quarantined segment's events (its bounds stay), keep the original for audit, release it."""
        if not reason.strip():
            raise HistoryError("skipping a segment needs a reason for the audit record (--reason TEXT)")
        _, record = skip_segment(self._quarantined(segment_id), self.wal_dir, reason=reason)
        return record

    def repairs(self) -> list[RepairRecord]:
        """The audit records of every repaired or skipped segment."""
        return repair_records(self.wal_dir)

    def _not_quarantined(self, segment_id: int) -> str:
        quarantined = [r.segment_id for r in self.segments(SegmentState.QUARANTINED)]
        return (
            f"segment {segment_id} of {self.database} is not quarantined "
            f"(quarantined segments: {', '.join(map(str, quarantined)) or 'none'}; see `history-pipeline segments`)"
        )

    # --- the catalog -------------------------------------------------------------

    def history(self, limit: int | None = None) -> list[CommitInfo]:
        """The catalog's retained commits, newest first (like Delta's ``DESCRIBE HISTORY``)."""
        if limit is not None and limit < 0:
            raise QueryError(f"history limit {limit}: give a number of commits >= 0, or none for all")
        return list(itertools.islice(self.commits(), limit))

    def commits(self) -> Iterator[CommitInfo]:
        """The retained commits, newest first, each read only when asked for."""
        from history_pipeline.catalog.model import AddFile, AdvanceFrontier, RemoveFile

        for txn_id in reversed(self.catalog.transaction_ids()):
            txn = self.catalog.read_transaction(txn_id)
            frontiers = [a.frontier for a in txn.actions if isinstance(a, AdvanceFrontier)]
            yield CommitInfo(
                txn_id=txn.txn_id,
                committed_at=txn.committed_at,
                operation=txn.operation,
                files_added=sum(isinstance(a, AddFile) for a in txn.actions),
                files_removed=sum(isinstance(a, RemoveFile) for a in txn.actions),
                rows_added=sum(a.entry.row_count for a in txn.actions if isinstance(a, AddFile)),
                frontier=frontiers[-1] if frontiers else None,
            )

    def erasures(self) -> list[ErasureEntry]:
        """Every erasure of the database, oldest first, from the erasure ledger (which log pruning
        never removes): who asked, when, why, how many keys and the SHA-256 of the key set."""
        return read_ledger(self.objects, self.catalog.ledger_prefix)

    def catalog_state(self) -> CatalogState:
        """The newest catalog state."""
        return self.catalog.latest()

    @property
    def frontier(self) -> int:
        """The largest t closed by a compacted segment (-1 before anything was compacted)."""
        return self.catalog.latest().frontier

    @property
    def earliest(self) -> int:
        """The smallest answerable as_of (0 until retention purges history)."""
        return self.catalog.latest().earliest

    # --- compaction --------------------------------------------------------------

    def spark(self, spark: Any | None = None) -> Any | None:
        """The SparkSession work runs on: the one given, else the settings' (False: in-process)."""
        if spark is False:
            return None
        if spark is not None:
            return spark
        if self.settings.spark_master is None:
            return None
        from history_pipeline.execution import spark_session

        return spark_session(self.settings.spark_master)

    def compact(
        self, spark: Any | None = None, on_step: Any = None, only_segment: int | None = None
    ) -> CompactionSummary:
        """Spark compaction of every sealed segment (``spark=False`` runs the same tasks in-process).

        ``only_segment`` compacts exactly that segment, refusing while an earlier one of the
        database is pending (:class:`SegmentOrderError`) or when it is quarantined.
        """
        if only_segment is not None:
            return self._compact_one(only_segment, spark, on_step or (lambda step: None))
        from history_pipeline.compaction.compactor import compact_pending

        # a session is started only when there is work for it
        session = self.spark(spark) if self.segments(SegmentState.SEALED) else None
        summary = compact_pending(self, session, on_step or (lambda step: None))
        self._refresh_after(summary, session)
        return summary

    def segment_refs(self, segment_ids: Iterable[int]) -> list[SegmentRef]:
        """The WAL's sealed, quarantined or applied segments of ``segment_ids``, in that order;
        the first one missing (an open one, or none of that id) raises :class:`SegmentNotFoundError`
        before anything is done with the others (segments apply in order)."""
        ids = list(segment_ids)
        refs = {r.segment_id: r for r in self.segments() if r.state is not SegmentState.OPEN}
        missing = [i for i in ids if i not in refs]
        if missing:
            raise SegmentNotFoundError(f"segment {segment_name(missing[0])} of {self.database} is not in "
                                       f"{self.wal_dir} (removed from the WAL?)")
        return [refs[i] for i in ids]

    def _check_can_compact(self, state: CatalogState, ids: list[int]) -> list[SegmentRef]:
        """The refs of ``ids`` (increasing), once the catalog is known not lost and no pending
        segment of the database outside ``ids`` comes before or between them."""
        from history_pipeline.compaction.compactor import check_catalog_not_lost

        check_catalog_not_lost(self, state)
        refs = self.segment_refs(ids)
        self._check_order(state, refs)
        return refs

    def _check_order(self, state: CatalogState, refs: list[SegmentRef]) -> None:
        """Refuse ``refs`` (increasing) when a pending segment of the database outside them comes
        before or between them: segments apply in order."""
        wanted = {r.segment_id for r in refs}
        waiting = [
            r for r in self.segments()
            if r.segment_id < refs[-1].segment_id and r.segment_id not in wanted
            and r.state in (SegmentState.SEALED, SegmentState.QUARANTINED)
            and r.segment_id not in state.applied_segments
        ]
        if waiting:
            first = waiting[0]
            later = next(r for r in refs if r.segment_id > first.segment_id)
            raise SegmentOrderError(
                f"segment {later.name} of {self.database} waits for the earlier segment {first.name} "
                f"({first.state.value}): segments apply in order; compact (or repair) that one first"
            )

    def _refresh_after(self, summary: CompactionSummary, session: Any | None) -> None:
        """Refresh the snapshots that became due when a compaction applied segments; marking the
        open intervals is the maintenance's."""
        if summary.segments_applied:
            self.refresh_snapshots(spark=session if session is not None else False, mark=False)

    def compact_batch(self, segment_ids: Iterable[int], spark: Any | None = None, on_step: Any = None) -> BatchOutcome:
        """Compact exactly these segments, in increasing id order, in one call: on Spark
        consecutive segments share their jobs, each segment still commits on its own (exactly once).

        Refused before any work (raised) when one is not in the WAL, the ids do not increase, or a
        pending segment of the database comes before or between them (:class:`SegmentOrderError`).
        A failure part way is not raised but returned (``BatchOutcome.error``) with the segments
        applied before it: a quarantined segment (one found quarantined, or quarantined now) stops
        the batch there, as does an engine loss; the segments after it stay pending.
        """
        from history_pipeline.compaction.compactor import compact_in_order

        ids = list(segment_ids)
        if not ids or any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
            raise HistoryError(f"a batch of segments is one or more segment ids in increasing order, not {ids}")
        state = self.catalog.latest()
        todo: list[SegmentRef] = []
        stop: Exception | None = None
        for ref in self._check_can_compact(state, ids):
            if ref.state is SegmentState.QUARANTINED:  # the ones before it are applied, then the batch stops
                stop = _quarantined_error(ref)
                break
            if ref.state is SegmentState.SEALED:
                todo.append(ref)
        summary = CompactionSummary(frontier=state.frontier)
        error = stop
        try:
            session = self.spark(spark) if todo else None
            compact_in_order(self, todo, session, summary, on_step or (lambda step: None))
            self._refresh_after(summary, session)
        except Exception as exc:  # returned with what was applied before it
            error = exc
        applied_now = self.catalog.latest().applied_segments
        stopped_at = next((i for i in ids if i not in applied_now), None) if error is not None else None
        reached = ids if stopped_at is None else ids[: ids.index(stopped_at)]
        newly = set(summary.segments_applied)
        return BatchOutcome(summary, tuple(i for i in reached if i not in newly), error, stopped_at)

    def _compact_one(self, segment_id: int, spark: Any | None, on_step: Any) -> CompactionSummary:
        from history_pipeline.compaction.compactor import check_catalog_not_lost, compact_segment

        state = self.catalog.latest()
        check_catalog_not_lost(self, state)
        summary = CompactionSummary(frontier=state.frontier)
        target = self.segment_refs([segment_id])[0]
        if target.state is SegmentState.QUARANTINED:
            raise _quarantined_error(target)
        if target.state is SegmentState.APPLIED:
            return summary
        self._check_order(state, [target])
        session = self.spark(spark)
        compact_segment(self, target, session, summary, on_step)
        self._refresh_after(summary, session)
        return summary

    def refresh_snapshots(self, force: bool = False, spark: Any | None = None, mark: bool = True) -> SnapshotSummary:
        """Snapshot the tables whose history since their last snapshot has grown long, each in
        pieces over key ranges written by Spark tasks (``spark=False``: the same tasks in-process;
        a session is started only when a table is due), then (``mark``) mark the open intervals
        due a marking (``StoreSettings.mark_open_fraction``). Compaction refreshes without
        marking; the maintenance after it (the ``supertables`` asset) marks."""
        settings = self.settings
        fraction = settings.mark_open_fraction if mark else 0.0
        state = self.catalog.latest()
        due = due_tables(state, settings.snapshot_min_versions, settings.snapshot_ratio, force) or marking_due(
            state, settings.snapshot_min_versions, settings.snapshot_ratio, fraction)
        return refresh_snapshots(self, settings.snapshot_min_versions, settings.snapshot_ratio, force,
                                 spark=self.spark(spark) if due else None, piece_rows=settings.snapshot_piece_rows,
                                 interval_rows=settings.interval_piece_rows, mark_fraction=fraction)

    # --- queries -----------------------------------------------------------------

    def query_context(self) -> QueryContext:
        """A frozen view of the newest catalog state (all queries through it agree)."""
        return QueryContext(self.objects, self.database, self.catalog.latest())

    def load_table(self, table: str, as_of: int | str, ordered: bool = False) -> pa.Table:
        """The table as of ``as_of``: synthetic_key then its columns in order, named as then; rows in
        no promised order (as a Delta, Iceberg or DuckLake scan gives them: on a large table where a
        filter alone answers, DuckDB's scan order), or in key order with ``ordered=True``."""
        with _reading_files():
            return self.query_context().load_table(table, to_timestamp(as_of), ordered)

    def load_table_reader(self, table: str, as_of: int | str, batch_size: int = 100_000,
                          ordered: bool = False) -> pa.RecordBatchReader:
        """``load_table`` streamed as record batches (for tables larger than memory), in no promised
        order, or in key order with ``ordered=True``."""
        return self.query_context().load_table_reader(table, to_timestamp(as_of), batch_size, ordered)

    def fetch_row(self, table: str, key: int, as_of: int | str) -> dict[str, Any] | None:
        """One row as of ``as_of`` as {column name: value}, or None."""
        with _reading_files():
            return self.query_context().fetch_row(table, key, to_timestamp(as_of))

    def fetch_row_described(self, table: str, key: int,
                            as_of: int | str) -> tuple[TableDescriptor, dict[str, Any] | None]:
        """``fetch_row`` and the descriptor of the table it was read as (its columns' names, uuids
        and types as of ``as_of``), both from one catalog state: the service's FetchRow answer."""
        with _reading_files():
            context = self.query_context()
            t = to_timestamp(as_of)
            row = context.fetch_row(table, key, t)
            return context.resolve(table, t), row

    def get_catalog(self, as_of: int | str | None = None) -> tuple[TableDescriptor, ...]:
        """The table descriptors in force as of ``as_of`` (omitted: the newest state, frontier + 1)."""
        return self.query_context().get_catalog(self.frontier + 1 if as_of is None else to_timestamp(as_of))

    def sql(self, query: str, as_of: int | str) -> pa.Table:
        """Read-only SQL against the database as of ``as_of``: SELECT, and SHOW TABLES, DESCRIBE <table>,
        EXPLAIN <select> (see :mod:`history_pipeline.query.statements`)."""
        from history_pipeline.query.statements import run_sql

        return run_sql(self.query_context(), query, to_timestamp(as_of))

    def sql_reader(self, query: str, as_of: int | str, batch_size: int = 100_000) -> pa.RecordBatchReader:
        """``sql`` streamed as record batches (for results larger than memory)."""
        return self.query_context().sql_reader(query, to_timestamp(as_of), batch_size)

    def row_history(self, table: str, key: int) -> list[dict[str, Any]]:
        """Every retained version of a key: logical_timestamp, is_deleted, values."""
        with _reading_files():
            return self.query_context().row_history(table, key)

    def diff(self, table: str, from_: int | str, to: int | str) -> dict[str, list[dict[str, Any]]]:
        """Keys inserted, deleted and changed between two states (``from_ <= to``)."""
        from_, to = to_timestamp(from_), to_timestamp(to)
        if from_ > to:
            raise QueryError(f"diff from {from_} to {to}: --from must not be after --to (swap them)")
        with _reading_files():
            return self.query_context().diff(table, from_, to)

    def diff_reader(self, table: str, from_: int | str, to: int | str, batch_size: int = 100_000,
                    as_stored: bool = False) -> pa.RecordBatchReader:
        """``diff`` streamed as Arrow record batches, for diffs larger than memory: ``kind``
        (inserted, deleted, changed: in that order, each in key order), ``key``, and the row
        ``before`` and ``after`` as structs of the columns named and typed as ``load_table`` gives
        them then (NULL where the key is absent), each field's SQL type in its ``data_type`` metadata.
        ``as_stored``: the columns in their stored Arrow types instead (lossless; what
        ``history_pipeline.query.diff.diff_to_dict`` turns into ``diff``'s answer)."""
        from_, to = to_timestamp(from_), to_timestamp(to)
        if from_ > to:
            raise QueryError(f"diff from {from_} to {to}: --from must not be after --to (swap them)")
        with _reading_files():
            return self.query_context().diff_reader(table, from_, to, batch_size, as_stored)

    def changes(self, tables: Iterable[str] | None = None, since: int | str = 0,
                until: int | str | None = None) -> Iterator[ChangeBatch]:
        """Every committed change with t in [since, until) (``until`` defaults to frontier + 1), in
        (t, table, key) order, as batches: row versions with the row before (as of t) and after (as
        of t + 1) and schema changes as records of their own, under the names in force at t. A table
        is followed by uuid across renames. Each batch carries the ``since`` to resume from once it
        is processed (``ChangeBatch.cursor``); read from one catalog state."""
        from history_pipeline.query.changes import changes

        state = self.catalog.latest()
        end = state.frontier + 1 if until is None else to_timestamp(until)
        wanted = None if tables is None else [tables] if isinstance(tables, str) else list(tables)
        feed = changes(self.objects, state, to_timestamp(since), end, wanted)  # checks the window first

        def delivered() -> Iterator[ChangeBatch]:
            with _reading_files():
                yield from feed

        return delivered()

    def follow_changes(self, tables: Iterable[str] | None = None, since: int | str = 0, *,
                       poll_seconds: float = 0.5, max_seconds: float | None = None) -> Iterator[ChangeBatch]:
        """``changes`` from ``since`` on, then each newly answerable window as the frontier moves
        (polled every ``poll_seconds``), until ``max_seconds`` passed (None: until the caller stops).
        A window that delivers nothing ends with a batch of no rows that only moves the cursor."""
        from history_pipeline.query.changes import changes, empty_batch

        cursor = to_timestamp(since)
        if cursor < 0:
            raise NegativeTimestampError(f"since={cursor} is negative: logical timestamps start at 0")
        wanted = None if tables is None else [tables] if isinstance(tables, str) else list(tables)
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        first = True
        while True:
            state = self.catalog.latest()
            end = state.frontier + 1
            # a cursor ahead of the frontier waits for it; each window is read from one state
            if end > cursor or (first and end == cursor):
                feed = changes(self.objects, state, cursor, end, wanted)
                last = None
                with _reading_files():
                    for batch in feed:
                        last = batch.cursor
                        yield batch
                if last != end:
                    yield ChangeBatch(empty_batch(), end)
                cursor = end
            first = False
            if deadline is not None and time.monotonic() >= deadline:
                return
            pause = poll_seconds if deadline is None else min(poll_seconds, deadline - time.monotonic())
            time.sleep(max(0.0, pause))

    def consumer_cursor(self, consumer: str) -> int | None:
        """The cursor a named consumer stored (``save_consumer_cursor``), or None for a new one."""
        import json

        try:
            return int(json.loads(self.objects.get(_consumer_path(self.database, consumer)))["cursor"])
        except ObjectNotFoundError:
            return None

    def save_consumer_cursor(self, consumer: str, cursor: int) -> None:
        """Store a named consumer's cursor in the history root (replaced whole, never half written)."""
        import json

        data = json.dumps({"consumer": consumer, "cursor": int(cursor), "saved_at": time.time()}).encode()
        self.objects.put(_consumer_path(self.database, consumer), data)

    # --- upkeep ------------------------------------------------------------------

    def verify(self) -> list[Problem]:
        """Problems between the catalog, its files and the WAL (empty when consistent)."""
        return verify(self.catalog.latest(), self.objects, self.wal_dir) + self.wal_problems()

    def wal_problems(self) -> list[Problem]:
        """Quarantined segments, and pending segments whose bytes no longer match their seal."""
        problems = []
        for ref in self.segments():
            if ref.state is SegmentState.QUARANTINED:
                # problems end up in Dagster's check metadata, beyond an erasure's reach: no value
                problems.append(Problem("quarantined segment", str(ref.path), (public_reason(ref) or "no reason")
                                        + f"; repair or skip it (history-pipeline repair|skip {ref.segment_id})"))
            elif ref.state is SegmentState.SEALED:
                try:
                    read_segment(ref)
                except (HistoryError, OSError) as exc:
                    problems.append(Problem("unverifiable segment", str(ref.path),
                                            f"{exc}; compaction will quarantine it"))
        return problems

    def rebuild_catalog(self) -> CatalogState:
        """Rebuild the catalog from the Parquet files alone (the old log is kept aside)."""
        return rebuild(self.catalog, self.objects, self.database)

    def cleanup(self, grace: timedelta = timedelta(hours=1)) -> GcReport:
        """Delete tombstoned and orphan files older than ``grace``, and what interrupted writes left (temporary
        files, unfinished uploads) once older than ``grace`` and five minutes; prune the log to match."""
        seconds = grace.total_seconds()
        if seconds < 0:
            # a cutoff in the future would delete the files a running compaction has just written
            raise MaintenanceInputError(f"a cleanup grace period is a duration >= 0, not {grace}")
        at = now()
        report = collect_garbage(self.catalog, self.objects, self.database, seconds, at=at)
        # the WAL's own temporary files (masking, repair, redaction), when the WAL is not under the root
        swept = {str(p) for p in sweep_folder(self.wal_dir, min(at - seconds, at - TEMPORARY_MIN_AGE_S))}
        report.temporaries_deleted = sorted({*report.temporaries_deleted, *swept})
        return report

    # --- maintenance ---------------------------------------------------------------

    def merge(self, spark: Any | None = None, **options: Any) -> MergeSummary:
        """Rewrite small version files into fewer large ones (answers unchanged), on Spark."""
        return merge(self, self.spark(spark), **options)

    def retain(
        self,
        purge_before: int | str,
        cold_tier: str | None = None,
        s3: S3Options | None = None,
        spark: Any | None = None,
    ) -> RetentionSummary:
        """Purge history below ``purge_before``; with ``cold_tier`` the purged files are kept there first.
        Tables with a time-to-live (``set_ttl``) are then purged to their own points too."""
        cold = open_store(cold_tier, s3 or self.s3) if cold_tier else None
        if cold is not None:
            register_target(self.objects, self.database, cold.uri)  # before any file goes there
        summary = retain(self, to_timestamp(purge_before), cold, spark=self.spark(spark))
        summary.ttl_purged = self.apply_ttl(spark).purged  # then each table with a TTL, to its own point
        return summary

    def set_ttl(self, table: str, versions_older_than: int | None) -> None:
        """Set a table's time-to-live in logical-timestamp units (None clears it): ``apply_ttl``
        then drops the versions older than ``frontier + 1 - versions_older_than``, as retention does."""
        set_ttl(self, self.query_context()._resolve_any_time(table).table_uuid, versions_older_than)

    def ttls(self) -> dict[str, int]:
        """Every table's time-to-live, by table uuid."""
        return dict(self.catalog.latest().table_ttl)

    def earliest_of(self, table: str) -> int:
        """The smallest answerable as_of of one table (the database's, or its TTL purge point)."""
        return self.catalog.latest().earliest_of(self.query_context()._resolve_any_time(table).table_uuid)

    def apply_ttl(self, spark: Any | None = None) -> TtlSummary:
        """Retention of every table with a time-to-live to its own purge point (on Spark)."""
        state = self.catalog.latest()
        session = self.spark(spark) if ttl_purge_points(state) else None
        return apply_ttl(self, session)

    def load_cold_tier(self, cold_tier: str, s3: S3Options | None = None) -> int:
        """Bring purged history back from a cold tier; returns the new earliest answerable as_of."""
        return load_cold_tier(self, open_store(cold_tier, s3 or self.s3))

    def export(self, as_of: int | str, to: str, s3: S3Options | None = None) -> dict[str, Any]:
        """Export every table as of ``as_of`` to ``to`` (a path or s3://bucket/prefix)."""
        target = open_store(to, s3 or self.s3)
        register_target(self.objects, self.database, target.uri)  # so an erasure reaches this export
        return export_database(self, to_timestamp(as_of), target)

    def erase(
        self,
        table: str,
        keys: Iterable[int],
        *,
        requested_by: str,
        reason: str = "",
        cold_tiers: Iterable[str] = (),
        s3: S3Options | None = None,
        purge_now: bool = False,
        spark: Any | None = None,
        dry_run: bool = False,
    ) -> ErasureSummary:
        """Forget every version of ``keys`` of ``table`` (name as of the newest state, or uuid).

        The WAL segments on disk (and the quarantine and audit records beside them), every live
        file, and the purged history and exports in every cold tier or export target this store
        wrote to (plus ``cold_tiers``) are rewritten without them; one catalog transaction and the
        erasure ledger (:meth:`erasures`) record who asked, when, why and how many keys were found
        (never the keys or values). Replaced files are deleted by ``cleanup`` after its grace
        period, or at once with ``purge_now`` (which also prunes time travel to before the
        erasure). ``dry_run`` changes nothing and reports what would be removed, and where
        (``summary.places``). Keys nothing holds are a :class:`NothingToEraseWarning`.
        """
        check_requester(requested_by)  # before any Spark session starts
        erased = normalize_keys(keys)
        state = self.catalog.latest()
        descriptor = QueryContext(self.objects, self.database, state)._resolve_any_time(table)
        uris = sorted({*known_targets(self.objects, self.database), *(open_store(u, s3 or self.s3).uri
                                                                      for u in cold_tiers)})
        request = ErasureRequest(descriptor.table_uuid, erased, requested_by, reason,
                                 tuple(open_store(u, s3 or self.s3) for u in uris))
        # a dry run reads key columns only: in-process, unless a session is given
        session = (spark or None) if dry_run else self.spark(spark)
        return erase(self, request, spark=session, purge_now=purge_now, dry_run=dry_run)

    def __repr__(self) -> str:
        return f"HistoryStore({self.objects.uri!r}, database={self.database!r})"
