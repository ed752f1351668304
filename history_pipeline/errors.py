"""Every error a user of history_pipeline can see.

One flat hierarchy under :class:`HistoryError`; each message says what happened,
where (segment and line, table, column, timestamp, file) and what to do.
"""

from __future__ import annotations


class HistoryError(Exception):
    """Base class of every error raised by history_pipeline."""


# --- the WAL -----------------------------------------------------------------


class WalError(HistoryError):
    """Something is wrong with a write-ahead log."""


class MalformedRecordError(WalError):
    """A WAL record is not valid: bad JSON, a missing field, a value of the wrong type."""

    def __init__(self, message: str, *, segment: str | None = None, line: int | None = None):
        self.segment = segment
        self.line = line
        self.reason = message
        where = _where(segment, line)
        super().__init__(f"{where}{message}" if where else message)


class TimestampOrderError(MalformedRecordError):
    """A record's timestamp goes backwards, or falls at or below a closed timestamp."""


class SegmentCorruptedError(WalError):
    """A sealed segment's bytes do not match its recorded count or checksum."""

    def __init__(self, segment: str, message: str):
        self.segment = segment
        super().__init__(f"segment {segment}: {message}; the segment is not compacted")


class SealError(WalError):
    """A segment cannot be sealed now (for instance its last record is not a close)."""


class WriterLockedError(WalError):
    """Another live writer holds the database's WAL."""


# --- types and values ----------------------------------------------------------


class DataTypeError(HistoryError):
    """A data type string is not one of the contract's SQL types."""


class ValueTypeError(HistoryError):
    """A value does not fit its declared SQL type."""


# --- the history (semantic checks at compaction) -------------------------------


class HistoryConflictError(MalformedRecordError):
    """An event contradicts the history: unknown table or column, missing or live key, ..."""


class CastError(HistoryConflictError):
    """A change of column type meets a value that cannot be cast to the new type."""


class SegmentQuarantinedError(HistoryError):
    """A segment was quarantined; later segments of the database wait behind it."""

    def __init__(self, segment: str, cause: str):
        self.segment = segment
        self.cause = cause
        super().__init__(
            f"segment {segment} is quarantined: {cause}. Later segments of this database wait "
            "behind it; give corrected events with `history-pipeline repair <id> --events FILE` "
            "or drop its events with `history-pipeline skip <id> --reason TEXT`."
        )


# --- object store and catalog ------------------------------------------------------


class ObjectStoreError(HistoryError):
    """The object store failed or cannot offer what is needed."""


class ObjectNotFoundError(ObjectStoreError):
    """No object at this path."""


class ObjectExistsError(ObjectStoreError):
    """put-if-absent found an object already at this path."""


class CatalogError(HistoryError):
    """The catalog is inconsistent or unreadable."""


class CommitConflictError(CatalogError):
    """Another writer committed this transaction id first; refresh and try again."""


class CorruptTransactionError(CatalogError):
    """A transaction or checkpoint file is truncated or corrupted."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(f"catalog file {path}: {message}")


class DataFileError(CatalogError):
    """A file the catalog lists as live is missing or cannot be read (truncated, not Parquet)."""

    def __init__(self, path: str | None, message: str):
        self.path = path
        what = f"data file {path}, which the catalog lists as live," if path else "a data file the catalog lists"
        super().__init__(f"{what} cannot be read: {message}; `history-pipeline verify` lists every damaged file")


class TransactionNotFoundError(CatalogError):
    """The requested catalog transaction does not exist (or was pruned)."""


# --- queries ---------------------------------------------------------------


class QueryError(HistoryError):
    """A time-travel query cannot be answered."""


class FutureTimestampError(QueryError):
    """as_of is beyond what the compacted history can answer (frontier + 1)."""


class PurgedTimestampError(QueryError):
    """as_of is below the earliest answerable timestamp after retention."""


class NegativeTimestampError(QueryError, ValueError):
    """as_of is negative: logical timestamps start at 0."""


class TableNotFoundError(QueryError):
    """No table with this name or uuid exists at the requested time."""


class SandboxViolationError(QueryError):
    """User SQL tried to leave the read-only sandbox."""


def _where(segment: str | None, line: int | None) -> str:
    if segment is None and line is None:
        return ""
    if line is None:
        return f"segment {segment}: "
    if segment is None:
        return f"line {line}: "
    return f"segment {segment}, line {line}: "


# --- opening a store ---------------------------------------------------------------


class StorageRootError(ObjectStoreError):
    """The storage root cannot be used: a file where a folder is expected, S3 unreachable or
    without credentials, a bucket that does not exist."""


class DatabaseNotFoundError(HistoryError):
    """A read was asked of a database that does not exist under the root."""


class SegmentNotFoundError(WalError):
    """No WAL segment with this id (in the state the command needs)."""


class InputFileError(HistoryError):
    """A file named on the command line cannot be read."""


class SegmentOrderError(WalError):
    """A segment cannot be compacted yet: an earlier segment of its database is still pending."""


class InputRecordError(MalformedRecordError):
    """A line of an input file (``append``, ``repair``) is not a valid event; names file and line."""

    def __init__(self, source: str, line: int, reason: str):
        super().__init__(reason, line=line)
        self.source = source
        self.args = (f"{source}, line {line}: {reason}; nothing was written",)

    def __str__(self) -> str:
        return str(self.args[0])


class MaintenanceInputError(HistoryError):
    """An erasure or a time-to-live was asked with unusable arguments (keys, requester, TTL)."""
