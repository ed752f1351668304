"""The catalog: which Parquet files are live for a database, at every past transaction."""

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
    RecordErasure,
    RemoveFile,
    SetEarliest,
    SetTableEarliest,
    SetTableTtl,
    Transaction,
)

__all__ = [
    "AddFile",
    "AddSchemaHistory",
    "AdvanceFrontier",
    "ApplySegments",
    "CatalogState",
    "FileEntry",
    "FileKind",
    "ForgetTombstones",
    "RecordErasure",
    "RemoveFile",
    "SetEarliest",
    "SetTableEarliest",
    "SetTableTtl",
    "Transaction",
    "TransactionLog",
]
