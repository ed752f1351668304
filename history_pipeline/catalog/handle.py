"""What compaction and maintenance use of a history store: one database's name, object store,
transaction log and WAL folder (``HistoryStore`` has them; so can a test's stand-in)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from history_pipeline.catalog.log import TransactionLog
from history_pipeline.io.store import ObjectStore


@runtime_checkable
class DatabaseHandle(Protocol):
    """One database's storage: the narrow part of ``HistoryStore`` the core works on."""

    database: str
    objects: ObjectStore
    catalog: TransactionLog
    wal_dir: Path


@runtime_checkable
class CompactionSettings(Protocol):
    """The settings compaction reads: which engine, and whether executors share local paths."""

    compaction_engine: str
    shared_paths: bool


@runtime_checkable
class CompactionHandle(DatabaseHandle, Protocol):
    """A database handle with the settings compaction reads."""

    settings: CompactionSettings
