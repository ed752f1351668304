"""The write-ahead log: segments on local disk, one writer per database, verified reading."""

from history_pipeline.wal.segments import (
    SegmentContents,
    SegmentRef,
    SegmentState,
    list_segments,
    read_segment,
)
from history_pipeline.wal.writer import WalPosition, WalWriter

__all__ = [
    "SegmentContents",
    "SegmentRef",
    "SegmentState",
    "WalPosition",
    "WalWriter",
    "list_segments",
    "read_segment",
]
