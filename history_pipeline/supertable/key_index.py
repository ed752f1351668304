"""Where a key's versions are in a supertable file: a point lookup's index.

A lookup as of T wants one row: the key's newest version below T. Reading the candidate row
groups whole to find it decodes tens of thousands of rows per file. Instead each row group's keys,
times and delete flags (three small integer columns) are read once, kept in key order, and asked
by binary search: a lookup then knows the file, row group and row of its answer before it reads
anything, and reads only the columns it returns of that one row group.

Files are immutable and their paths never reused, so a row group's index holds as long as any
catalog state lists its file; which files a lookup asks is the caller's (the catalog state's)
choice. The indexes of the row groups lookups touched are kept, newest use last, within a byte
budget (``KEY_INDEX_BYTES``); the others are read again when next asked.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from history_pipeline.errors import DataFileError
from history_pipeline.io.store import LocalStore, ObjectStore
from history_pipeline.supertable import DELETED, KEY, LT, SUPERSEDED
from history_pipeline.supertable.read import Footer, StoredFile, as_numpy, conform, footer
from history_pipeline.supertable.row_cache import forget_row_groups, row_cache

#: a lookup tests a file's Bloom filters on all its candidate row groups (not only on those not
#: indexed yet) when more than this many span its key
BLOOM_FIRST = 4

#: the bytes the kept row-group indexes may take in one process (about 17 bytes a row: the
#: indexes of every file of a 10M-version history fit)
KEY_INDEX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class RowGroupKeys:
    """One row group's keys in ascending order, with each one's row, time and delete flag."""

    keys: np.ndarray
    times: np.ndarray
    deleted: np.ndarray
    #: the row (within the row group) of each key in order; None when the rows are in key order
    rows: np.ndarray | None

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.times.nbytes + self.deleted.nbytes + (0 if self.rows is None else
                                                                                 self.rows.nbytes)

    def newest(self, key: int, lower: int | None, upper: int) -> tuple[int, bool, int] | None:
        """(time, deleted, row) of ``key``'s newest version with ``lower <= t < upper``, or None."""
        keys = self.keys
        start = int(keys.searchsorted(key))
        if start == len(keys) or keys[start] != key:
            return None
        if start + 1 == len(keys) or keys[start + 1] != key:  # one version here (the usual case): no arrays
            t = int(self.times[start])
            if t >= upper or (lower is not None and t < lower):
                return None
            return t, bool(self.deleted[start]), start if self.rows is None else int(self.rows[start])
        stop = int(keys.searchsorted(key, "right"))
        times = self.times[start:stop]
        eligible = times < upper
        if lower is not None:
            eligible &= times >= lower
        if not eligible.any():
            return None
        i = start + int(np.argmax(np.where(eligible, times, np.iinfo(np.int64).min)))
        return int(self.times[i]), bool(self.deleted[i]), i if self.rows is None else int(self.rows[i])


def row_group_keys(columns: pa.Table) -> RowGroupKeys:
    """The index of one row group from its key, time and delete columns."""
    keys = as_numpy(columns.column(KEY)).astype(np.int64, copy=False)
    times = as_numpy(columns.column(LT)).astype(np.int64, copy=False)
    deleted = as_numpy(columns.column(DELETED)).astype(bool, copy=False)
    if len(keys) < 2 or bool((keys[1:] >= keys[:-1]).all()):
        return RowGroupKeys(keys, times, deleted, None)
    order = np.argsort(keys, kind="stable")
    rows = order.astype(np.int32) if len(order) < 2**31 else order
    return RowGroupKeys(keys[order], times[order], deleted[order], rows)


@dataclass(frozen=True)
class Version:
    """Where one version of a key is: its file, row group and row, its time and delete flag."""

    path: str
    row_group: int
    row: int
    t: int
    deleted: bool


_INDEXES: OrderedDict[tuple[str, str, int], RowGroupKeys] = OrderedDict()
_index_lock = threading.Lock()
_index_held = [0]  # the bytes in ``_INDEXES``


def _cached(cache_key: tuple[str, str, int]) -> RowGroupKeys | None:
    with _index_lock:
        found = _INDEXES.get(cache_key)
        if found is not None:
            _INDEXES.move_to_end(cache_key)
        return found


def _keep(cache_key: tuple[str, str, int], index: RowGroupKeys) -> None:
    with _index_lock:
        if cache_key in _INDEXES:  # (another thread built it meanwhile)
            return
        _INDEXES[cache_key] = index
        _index_held[0] += index.nbytes
        while _index_held[0] > KEY_INDEX_BYTES and len(_INDEXES) > 1:
            _index_held[0] -= _INDEXES.popitem(last=False)[1].nbytes


def indexed_bytes() -> int:
    """The bytes the kept row-group indexes take now (at most ``KEY_INDEX_BYTES`` and one index)."""
    return _index_held[0]


def forget_indexes() -> None:
    """Drop every kept row-group index and decoded row group (they are read again when next asked)
    and close the files kept open for reading rows."""
    with _index_lock:
        _INDEXES.clear()
        _index_held[0] = 0
    forget_row_groups()
    _open_readers.close_all()


def newest_version(store: ObjectStore, f: StoredFile, key: int, lower: int | None, upper: int,
                   current_at: int | None = None) -> Version | None:
    """``key``'s newest version in ``f`` with ``lower <= t < upper``, or None.

    Only row groups whose statistics (cached footer: key range, times; for one key, the Bloom
    filters) allow such a version are asked; with ``current_at`` (a file marked as of some U >=
    ``current_at``, holding ``superseded_at``), only those holding a row current then, as
    ``read_key`` skips them. A row group asked for the first time has its index read (all such
    row groups of the file in one read); later lookups read nothing to find their row."""
    cached = footer(store, f.path)
    if SUPERSEDED not in cached.columns:
        current_at = None
    candidates = cached.row_groups_spanning(key, lower, upper, current_at)
    tested = len(candidates) > BLOOM_FIRST and cached.blooms is not None
    if tested:
        # row groups not in key order (a marked file laid out by time) all span the key: one
        # vectorized filter test leaves a few of dozens (measured: 42 -> 3 in 22 us, against
        # about 4 us a row group to search each kept index)
        candidates = cached.blooms.may_hold(candidates, key)  # type: ignore[union-attr]
    if not candidates:
        return None
    indexes: dict[int, RowGroupKeys] = {}
    missing = []
    for rg in candidates:
        found = _cached((store.uri, f.path, rg))
        if found is None:
            missing.append(rg)
        else:
            indexes[rg] = found
    if missing:
        if cached.blooms is not None and not tested:  # a row group its filter rules out need not be indexed yet
            missing = cached.blooms.may_hold(missing, key)
        if missing:
            indexes.update(_build(store, f.path, cached, missing))
    best: Version | None = None
    for rg, index in indexes.items():
        hit = index.newest(key, lower, upper)
        if hit is not None and (best is None or hit[0] > best.t):
            best = Version(f.path, rg, hit[2], hit[0], hit[1])
    return best


def _build(store: ObjectStore, path: str, cached: Footer, groups: Sequence[int]) -> dict[int, RowGroupKeys]:
    """The indexes of ``groups`` of one file, read in one go and kept."""
    fs, _ = store.arrow_filesystem()
    with fs.open_input_file(store.full_path(path)) as handle:
        parquet = pq.ParquetFile(handle, metadata=cached.meta, pre_buffer=not isinstance(store, LocalStore))
        columns = parquet.read_row_groups(list(groups), columns=[KEY, LT, DELETED], use_threads=False)
    built = {}
    offset = 0
    for rg in groups:
        rows = cached.meta.row_group(rg).num_rows
        index = row_group_keys(columns.slice(offset, rows))
        offset += rows
        _keep((store.uri, path, rg), index)
        built[rg] = index
    return built


def read_version(store: ObjectStore, version: Version, target: pa.Schema) -> pa.Table:
    """The one row ``version`` points at, ``target``'s columns (those its file lacks as nulls, the
    others cast to ``target``'s types, as every read conforms them): one row group's columns of
    ``target`` are read, nothing else."""
    cached = footer(store, version.path)
    stored = [name for name in target.names if name in cached.columns]
    if not stored:  # every column is newer than the file: the row holds none of them
        return pa.Table.from_arrays([pa.nulls(1, f.type) for f in target], schema=target)
    dictionaries = tuple(c for c in stored if c in cached.dictionary_strings)
    kept = row_cache()
    if kept is not None:
        columns = kept.columns(store.uri, version.path, version.row_group, stored,
                               lambda missing: _read_row_group(store, version, cached, missing))
        if version.row >= len(columns[stored[0]]):
            raise DataFileError(version.path, f"row group {version.row_group} holds no row {version.row}: the file "
                                              "changed under its index")
        # one row of each kept column: no page decoded again
        return conform(pa.Table.from_arrays([columns[c].slice(version.row, 1) for c in stored], names=stored),
                       target)
    with _kept_reader(store, version.path, cached, dictionaries) as reader:
        # one batch of the row group's rows up to the row: the pages after it are neither
        # decompressed nor decoded, and no row past it is (measured at 10M versions, 16,384-row
        # groups: 0.46 against 0.56 ms a row read in batches of 4,096, the last one decoded whole)
        batch = next(reader.parquet.iter_batches(batch_size=version.row + 1, row_groups=[version.row_group],
                                                 columns=stored, use_threads=False), None)
    if batch is None or batch.num_rows <= version.row:
        raise DataFileError(version.path, f"row group {version.row_group} holds no row {version.row}: the file "
                                          "changed under its index")
    # only the row is decoded from dictionaries (a take of one value: measured 39 against 69 us
    # for a cast of the one-row table) and cast where its file stores another type
    row = batch.slice(version.row, 1)
    for name in dictionaries:
        at = row.schema.get_field_index(name)
        row = row.set_column(at, row.schema.field(at).with_type(row.column(at).type.value_type),
                             row.column(at).dictionary_decode())
    return conform(pa.Table.from_batches([row]), target)


def _read_row_group(store: ObjectStore, version: Version, cached: Footer, columns: list[str]) -> pa.Table:
    """``columns`` of the row group ``version`` is in, whole (to be kept decoded): strings as
    strings, not dictionaries, so that a row taken from them needs no cast."""
    with _kept_reader(store, version.path, cached, ()) as reader:
        return reader.parquet.read_row_groups([version.row_group], columns=columns, use_threads=False)


@contextmanager
def _kept_reader(store: ObjectStore, path: str, cached: Footer, dictionaries: tuple[str, ...]) -> Iterator[_Reader]:
    """A reader of ``path`` taken from the kept ones (or opened) and given back after use, unless
    its use failed: then it is closed."""
    spot = (store.uri, path, dictionaries)
    reader = _open_readers.take(spot) or _open(store, path, cached, dictionaries)
    try:
        yield reader
    except BaseException:
        reader.close()  # a reader that failed is not kept
        raise
    finally:
        if not reader.closed:
            _open_readers.give_back(spot, reader)


@dataclass(frozen=True)
class _Reader:
    """An open file and its Parquet reader (built on the cached footer)."""

    handle: pa.NativeFile
    parquet: pq.ParquetFile

    @property
    def closed(self) -> bool:
        return self.handle.closed

    def close(self) -> None:
        self.handle.close()


def _open(store: ObjectStore, path: str, cached: Footer, dictionaries: tuple[str, ...]) -> _Reader:
    fs, _ = store.arrow_filesystem()
    handle = fs.open_input_file(store.full_path(path))
    try:
        parquet = pq.ParquetFile(handle, metadata=cached.meta, pre_buffer=not isinstance(store, LocalStore),
                                 read_dictionary=list(dictionaries) or None)
        return _Reader(handle, parquet)
    except BaseException:
        handle.close()
        raise


class _IdleReaders:
    """Open readers of the files lookups read rows from, idle between lookups, newest use last.

    Opening a file and building its Parquet reader cost about a sixth of a row's read (measured
    at 10M versions: 100-250 us of CPU a lookup). A lookup takes a reader out while it reads
    (threads never share one: a second lookup of the same file meanwhile opens another) and gives
    it back after; past ``IDLE_READERS`` the oldest is closed. Files never change under a path,
    so a kept reader reads what a fresh one would. Per process: a forked child opens its own."""

    def __init__(self) -> None:
        self._idle: OrderedDict[tuple[str, str, tuple[str, ...]], list[_Reader]] = OrderedDict()
        self._count = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def take(self, spot: tuple[str, str, tuple[str, ...]]) -> _Reader | None:
        with self._lock:
            self._forget_if_forked()
            kept = self._idle.get(spot)
            if not kept:
                return None
            self._count -= 1
            reader = kept.pop()
            if not kept:
                del self._idle[spot]
            return reader

    def give_back(self, spot: tuple[str, str, tuple[str, ...]], reader: _Reader) -> None:
        closing = []
        with self._lock:
            self._forget_if_forked()
            self._idle.setdefault(spot, []).append(reader)
            self._idle.move_to_end(spot)
            self._count += 1
            while self._count > IDLE_READERS:
                _, oldest = next(iter(self._idle.items()))
                closing.append(oldest.pop(0))
                self._count -= 1
                if not oldest:
                    self._idle.popitem(last=False)
        for old in closing:
            old.close()

    def close_all(self) -> None:
        with self._lock:
            readers = [r for kept in self._idle.values() for r in kept]
            self._idle.clear()
            self._count = 0
        for reader in readers:
            reader.close()

    def _forget_if_forked(self) -> None:
        if self._pid != os.getpid():  # the parent's handles are the parent's to close
            self._idle.clear()
            self._count = 0
            self._pid = os.getpid()


#: open readers kept idle between lookups, in one process (each holds a file open)
IDLE_READERS = 64

_open_readers = _IdleReaders()
