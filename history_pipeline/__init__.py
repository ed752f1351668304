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
    from history_pipeline.maintenance.erasure import NothingToEraseWarning
    from history_pipeline.query.changes import ChangeBatch
    from history_pipeline.store import HistoryStore, StoreSettings

#: names loaded on first use, with the module each comes from
_LAZY = {
    "HistoryStore": "history_pipeline.store",
    "StoreSettings": "history_pipeline.store",
    "ChangeBatch": "history_pipeline.query.changes",
    "NothingToEraseWarning": "history_pipeline.maintenance.erasure",
}


def __getattr__(name: str) -> Any:
    """The store, the change feed and the erasure warning load (DuckDB, the query engine ...) on first
    use: a Spark executor unpickling a compaction or maintenance task imports only what it runs,
    and a fresh Python worker starts its first task that much sooner."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'history_pipeline' has no attribute {name!r}")


__all__ = [
    "CastError",
    "ChangeBatch",
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
    "NothingToEraseWarning",
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
