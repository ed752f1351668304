"""Decoded row groups kept for point lookups, within a byte budget: a buffer pool of columns.

A lookup that knows its row (``key_index``) still decodes the columns it returns of that row's
row group: a few hundred microseconds of the lookup's millisecond at 16,384-row groups. A worker
asks the same few hundred row groups of a state again and again (every key of the live set is in
one of them), so the decoded columns are kept, one entry per (file, row group, column), least
recently used dropped first once they take more than the budget; a kept column answers a later
lookup by a take of one row.

Files are immutable and their paths never reused, so a kept column holds as long as any catalog
state lists its file; a new state lists other files and lookups simply ask those. The budget is
per process, for every store and database in it (``set_row_cache_bytes``; 0 keeps nothing: each
lookup then decodes its row group up to its row).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
from cachetools import LRUCache

#: the bytes the decoded columns kept for lookups may take in one process by default (a 1M-row
#: table's row groups of a state, three columns, take about 80 MiB)
ROW_CACHE_BYTES = 256 * 1024 * 1024

#: (store uri, file path, row group, column)
ColumnKey = tuple[str, str, int, str]


@dataclass(frozen=True)
class RowCacheStats:
    """What the cache holds and how it served: bytes against the budget, entries, hits, misses."""

    budget_bytes: int
    held_bytes: int
    columns: int
    hits: int
    misses: int


def _size(column: pa.ChunkedArray) -> int:
    return max(1, column.nbytes)


class _RowCache:
    """The kept columns (an LRU bounded by their Arrow bytes) and its counters, under one lock."""

    def __init__(self, budget: int) -> None:
        self._lock = threading.Lock()
        self._columns: LRUCache[ColumnKey, pa.ChunkedArray] = LRUCache(budget, getsizeof=_size)
        self._hits = self._misses = 0

    @property
    def budget(self) -> int:
        return int(self._columns.maxsize)

    def columns(self, uri: str, path: str, row_group: int, names: Sequence[str],
                read: Callable[[list[str]], pa.Table]) -> dict[str, pa.ChunkedArray]:
        """``names`` of one row group, kept ones from memory, the others by ``read(missing)`` (the
        whole row group's columns) and kept."""
        found: dict[str, pa.ChunkedArray] = {}
        with self._lock:
            for name in names:
                column = self._columns.get((uri, path, row_group, name))
                if column is not None:
                    found[name] = column
            missing = [n for n in names if n not in found]
            if missing:
                self._misses += 1
            else:
                self._hits += 1
        if missing:
            table = read(missing)  # outside the lock: other lookups go on meanwhile
            with self._lock:
                for name in missing:
                    column = found[name] = table.column(name)
                    try:
                        self._columns[(uri, path, row_group, name)] = column
                    except ValueError:  # larger than the whole budget: used once, not kept
                        pass
        return found

    def stats(self) -> RowCacheStats:
        with self._lock:
            return RowCacheStats(self.budget, int(self._columns.currsize), len(self._columns), self._hits,
                                 self._misses)


_cache = _RowCache(ROW_CACHE_BYTES)


def row_cache() -> _RowCache | None:
    """The process's cache of decoded row groups, or None when its budget is 0."""
    cache = _cache
    return cache if cache.budget > 0 else None


def set_row_cache_bytes(budget: int) -> None:
    """Let the decoded columns kept for lookups take at most ``budget`` bytes (0: keep none).
    What is kept now is dropped, and the counters start again."""
    global _cache
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"the row cache budget is a number of bytes >= 0, got {budget!r}")
    _cache = _RowCache(budget)


def row_cache_stats() -> RowCacheStats:
    """The bytes, columns, hits and misses of the decoded columns kept for lookups."""
    return _cache.stats()


def forget_row_groups() -> None:
    """Drop every decoded column kept (they are read again when next asked), keeping the budget."""
    set_row_cache_bytes(_cache.budget)
