"""history_pipeline: a time machine for a tenant database.

Every row and schema change goes into a write-ahead log; Spark compacts
sealed segments into Parquet supertables and a schema history; a
transaction-log catalog says which files are live; DuckDB answers read-only
SQL as of any past logical timestamp.
"""

from typing import TYPE_CHECKING, Any

from history_pipeline.errors import (
    CastError,
    CatalogError,
    CommitConflictError,
    CorruptTransactionError,
    DataFileError,
    FutureTimestampError,
    HistoryConflictError,
    HistoryError,
    MaintenanceInputError,
    MalformedRecordError,
    PurgedTimestampError,
    QueryError,
    SandboxViolationError,
    SealError,
    SegmentCorruptedError,
    SegmentQuarantinedError,
    TableNotFoundError,
    TimestampOrderError,
    ValueTypeError,
    WriterLockedError,
)

if TYPE_CHECKING:
    from history_pipeline.store import HistoryStore, StoreSettings


def __getattr__(name: str) -> Any:
    """``HistoryStore`` and ``StoreSettings`` load the store (DuckDB, the query engine ...) on first
    use: a Spark executor unpickling a compaction or maintenance task imports only what it runs,
    and a fresh Python worker starts its first task that much sooner."""
    if name in ("HistoryStore", "StoreSettings"):
        from history_pipeline import store

        return getattr(store, name)
    raise AttributeError(f"module 'history_pipeline' has no attribute {name!r}")


__all__ = [
    "CastError",
    "CatalogError",
    "CommitConflictError",
    "CorruptTransactionError",
    "DataFileError",
    "FutureTimestampError",
    "HistoryConflictError",
    "HistoryError",
    "HistoryStore",
    "MaintenanceInputError",
    "MalformedRecordError",
    "PurgedTimestampError",
    "QueryError",
    "SandboxViolationError",
    "SealError",
    "SegmentCorruptedError",
    "SegmentQuarantinedError",
    "StoreSettings",
    "TableNotFoundError",
    "TimestampOrderError",
    "ValueTypeError",
    "WriterLockedError",
]
