"""history_pipeline: a time machine for a tenant database.

Every row and schema change goes into a write-ahead log; Spark compacts
sealed segments into Parquet supertables and a schema history; a
transaction-log catalog says which files are live; DuckDB answers read-only
SQL as of any past logical timestamp.
"""

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
from history_pipeline.maintenance.erasure import NothingToEraseWarning
from history_pipeline.query.changes import ChangeBatch
from history_pipeline.store import HistoryStore, StoreSettings

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
