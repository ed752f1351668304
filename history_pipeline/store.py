"""HistoryStore: the one object users hold (DESIGN.md section 5)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from history_pipeline.catalog import CatalogState, TransactionLog
from history_pipeline.catalog.upkeep import GcReport, Problem, collect_garbage, rebuild, verify
from history_pipeline.compaction.compactor import CompactionSummary
from history_pipeline.errors import HistoryError
from history_pipeline.io.store import ObjectStore, S3Options, open_store
from history_pipeline.maintenance.export import export_database
from history_pipeline.maintenance.merge import MergeSummary, merge
from history_pipeline.maintenance.retention import RetentionSummary, load_cold_tier, retain
from history_pipeline.maintenance.snapshots import SnapshotSummary, refresh_snapshots
from history_pipeline.query.engine import QueryContext
from history_pipeline.schema import TableDescriptor
from history_pipeline.wal import SegmentRef, SegmentState, WalWriter, list_segments
from history_pipeline.wal.segments import release_segment

_DATABASE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class StoreSettings:
    """Tunables with embedded defaults."""

    max_segment_bytes: int = 64 * 1024 * 1024
    max_segment_age_s: float = 300.0
    checkpoint_interval: int = 20
    #: a table gets a new snapshot once this many versions (and ``snapshot_ratio`` x its live rows)
    #: were written since its last one
    snapshot_min_versions: int = 200_000
    snapshot_ratio: float = 1.0
    #: where compaction, merge and retention run when no session is passed: a Spark master
    #: (a local session is created once per process), or None to run the same tasks in-process
    spark_master: str | None = "local[*]"
    #: the storage root (when local) and the WAL directory are at the same path on every Spark
    #: executor (a shared mount); without it a non-local master is refused at start-up
    shared_paths: bool = False


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
    ) -> HistoryStore:
        """Open (creating if needed) the history of ``database`` under ``root``."""
        if not _DATABASE_RE.match(database):
            raise HistoryError(
                f"database name {database!r} is not valid: use letters, digits, '_', '-', '.'"
            )
        objects = open_store(str(root), s3)
        wal_dir = Path(wal_dir) if wal_dir is not None else wal_dir_of(root, database)
        store = cls(objects, database, wal_dir, settings or StoreSettings())
        store.s3 = s3
        return store

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
        raise HistoryError(f"segment {segment_id} of {self.database} is not quarantined")

    # --- the catalog -------------------------------------------------------------

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
        from history_pipeline.compaction.spark_session import local_spark

        return local_spark(self.settings.spark_master)

    def compact(self, spark: Any | None = None, on_step: Any = None) -> CompactionSummary:
        """Spark compaction of every sealed segment (``spark=False`` runs the same tasks in-process)."""
        from history_pipeline.compaction.compactor import compact_pending

        # a session is started only when there is work for it
        session = self.spark(spark) if self.segments(SegmentState.SEALED) else None
        summary = compact_pending(self, session, on_step or (lambda step: None))
        if summary.segments_applied:
            self.refresh_snapshots()
        return summary

    def refresh_snapshots(self, force: bool = False) -> SnapshotSummary:
        """Snapshot the tables whose history since their last snapshot has grown long."""
        return refresh_snapshots(self, self.settings.snapshot_min_versions, self.settings.snapshot_ratio, force)

    # --- queries -----------------------------------------------------------------

    def query_context(self) -> QueryContext:
        """A frozen view of the newest catalog state (all queries through it agree)."""
        return QueryContext(self.objects, self.database, self.catalog.latest())

    def load_table(self, table: str, as_of: int) -> pa.Table:
        """The table as of ``as_of``: synthetic_key then its columns in order, named as then."""
        return self.query_context().load_table(table, as_of)

    def fetch_row(self, table: str, key: int, as_of: int) -> dict[str, Any] | None:
        """One row as of ``as_of`` as {column name: value}, or None."""
        return self.query_context().fetch_row(table, key, as_of)

    def get_catalog(self, as_of: int) -> tuple[TableDescriptor, ...]:
        """The table descriptors in force as of ``as_of``."""
        return self.query_context().get_catalog(as_of)

    def sql(self, query: str, as_of: int) -> pa.Table:
        """Read-only SQL against the database as of ``as_of``."""
        return self.query_context().sql(query, as_of)

    def row_history(self, table: str, key: int) -> list[dict[str, Any]]:
        """Every retained version of a key: logical_timestamp, is_deleted, values."""
        return self.query_context().row_history(table, key)

    def diff(self, table: str, from_: int, to: int) -> dict[str, list[dict[str, Any]]]:
        """Keys inserted, deleted and changed between two states."""
        return self.query_context().diff(table, from_, to)

    # --- upkeep ------------------------------------------------------------------

    def verify(self) -> list[Problem]:
        """Problems between the catalog, its files and the WAL (empty when consistent)."""
        return verify(self.catalog.latest(), self.objects, self.wal_dir)

    def rebuild_catalog(self) -> CatalogState:
        """Rebuild the catalog from the Parquet files alone (the old log is kept aside)."""
        return rebuild(self.catalog, self.objects, self.database)

    def cleanup(self, grace: timedelta = timedelta(hours=1)) -> GcReport:
        """Delete tombstoned and orphan files older than ``grace``; prune the log to match."""
        return collect_garbage(self.catalog, self.objects, self.database, grace.total_seconds())

    # --- maintenance ---------------------------------------------------------------

    def merge(self, spark: Any | None = None, **options: Any) -> MergeSummary:
        """Rewrite small version files into fewer large ones (answers unchanged), on Spark."""
        return merge(self, self.spark(spark), **options)

    def retain(
        self,
        purge_before: int,
        cold_tier: str | None = None,
        s3: S3Options | None = None,
        spark: Any | None = None,
    ) -> RetentionSummary:
        """Purge history below ``purge_before``; with ``cold_tier`` the purged files are kept there first."""
        cold = open_store(cold_tier, s3 or self.s3) if cold_tier else None
        return retain(self, purge_before, cold, spark=self.spark(spark))

    def load_cold_tier(self, cold_tier: str, s3: S3Options | None = None) -> int:
        """Bring purged history back from a cold tier; returns the new earliest answerable as_of."""
        return load_cold_tier(self, open_store(cold_tier, s3 or self.s3))

    def export(self, as_of: int, to: str, s3: S3Options | None = None) -> dict[str, Any]:
        """Export every table as of ``as_of`` to ``to`` (a path or s3://bucket/prefix)."""
        return export_database(self, as_of, open_store(to, s3 or self.s3))

    def __repr__(self) -> str:
        return f"HistoryStore({self.objects.uri!r}, database={self.database!r})"
