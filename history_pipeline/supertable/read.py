"""Reading supertable files back: Arrow datasets over files, one key's versions through cached
footers, and the newest version per key (the Reconstruction Invariant on Arrow tables).

Files are whatever has a path and a key range (:class:`StoredFile`): the catalog's entries fit,
and this layer never imports the catalog.
"""

from __future__ import annotations

import bisect
import functools
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from history_pipeline.errors import DataFileError
from history_pipeline.io.store import LocalStore, ObjectStore
from history_pipeline.supertable import DELETED, KEY, LT, SUPERSEDED, column_chunks
from history_pipeline.supertable.bloom import BLOCK_BYTES, bitset_bytes, hashed_key

Result = TypeVar("Result")


class StoredFile(Protocol):
    """What reading needs of a file: its path and, when known, its key range."""

    @property
    def path(self) -> str: ...

    @property
    def min_key(self) -> int | None: ...

    @property
    def max_key(self) -> int | None: ...


def dataset_of(store: ObjectStore, files: Iterable[StoredFile], schema: pa.Schema,
               dictionaries: Sequence[str] = ()) -> ds.Dataset:
    """One Arrow dataset over files, with columns missing from older files read as nulls (and
    the string columns ``dictionaries`` read as dictionaries, see ``as_dictionaries``)."""
    fs, _ = store.arrow_filesystem()
    paths = [store.full_path(f.path) for f in files]
    if not dictionaries:
        return ds.dataset(paths, schema=schema, format="parquet", filesystem=fs)
    parquet = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=list(dictionaries)))
    return ds.dataset(paths, schema=as_dictionaries(schema, dictionaries), format=parquet, filesystem=fs)


def as_dictionaries(schema: pa.Schema, names: Sequence[str]) -> pa.Schema:
    """``schema`` with the columns ``names`` as dictionaries of their type: strings every file
    stores with a dictionary are read that way, gathered as indices and decoded after (``gather``
    with the plain schema), which costs less than taking from every row's own string."""
    return pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), f.type), f.nullable) if f.name in names else f
                      for f in schema])


@dataclass(frozen=True)
class RowGroupTimes:
    """What a row group's statistics say of its rows' times (None: not known)."""

    min_t: int | None
    #: of ``superseded_at`` (files of a closed interval): the largest value and the NULL count
    max_superseded: int | None
    superseded_nulls: int | None
    max_t: int | None = None
    #: does the row group hold a delete? (None: not known)
    any_deleted: bool | None = None
    #: its rows (None: not known)
    rows: int | None = None

    @property
    def never_superseded(self) -> bool:
        """Is every row's ``superseded_at`` NULL (no row of it superseded below its marks)?"""
        return self.rows is not None and self.superseded_nulls == self.rows

    def may_be_current(self, as_of: int) -> bool:
        """Can a row of this group be current as of ``as_of`` (``t < as_of`` and ``superseded_at``
        NULL or ``>= as_of``)? False only when the statistics rule it out."""
        if self.min_t is not None and self.min_t >= as_of:
            return False
        return not (self.superseded_nulls == 0 and self.max_superseded is not None
                    and self.max_superseded < as_of)


@dataclass(frozen=True)
class Footer:
    """What a point lookup needs from a file: its footer, its columns, each row group's key range
    and times."""

    meta: pq.FileMetaData
    columns: frozenset[str]
    key_ranges: tuple[tuple[int, int] | None, ...]
    times: tuple[RowGroupTimes, ...] = ()
    #: string and binary columns stored with a dictionary: a lookup reads them as dictionaries and
    #: decodes only the rows it keeps
    dictionary_strings: frozenset[str] = frozenset()
    #: the file's Arrow schema without its metadata (files of one schema are read without union by name)
    schema: pa.Schema | None = None
    #: the Bloom filters on the key column, where the file has them (``supertable.time_cut``)
    blooms: KeyBlooms | None = None

    def row_groups_holding(self, key: int) -> list[int]:
        return self.row_groups_overlapping(key, key)

    def row_groups_overlapping(self, low: int, high: int) -> list[int]:
        """The row groups that may hold a key in [low, high] (all where their statistics are
        missing); for one key, by their Bloom filters too."""
        lows, highs = self._key_bounds
        overlapping = np.flatnonzero((lows <= high) & (highs >= low))
        if low == high and len(overlapping) and self.blooms is not None:
            return self.blooms.may_hold(overlapping, low)
        return overlapping.tolist()

    def row_groups_spanning(self, key: int, lower: int | None = None, upper: int | None = None,
                            current_at: int | None = None) -> list[int]:
        """The row groups whose statistics alone allow a row of ``key`` with ``lower <= t < upper``
        (bounds None: any), current as of ``current_at`` when given (``RowGroupTimes.may_be_current``)."""
        lows, highs = self._key_bounds
        chosen = (lows <= key) & (highs >= key)
        if lower is not None or upper is not None or current_at is not None:
            chosen &= self._times_allowing(lower, upper, current_at)
        return chosen.nonzero()[0].tolist()

    def _times_allowing(self, lower: int | None, upper: int | None, current_at: int | None) -> np.ndarray:
        """Which row groups' times allow a row with ``lower <= t < upper``, current as of
        ``current_at``: kept for the last few bounds asked, as a worker's lookups ask the same T
        again and again (each a few NumPy operations less, per file a lookup asks)."""
        bounds = (lower, upper, current_at)
        masks = self._time_masks
        mask = masks.get(bounds)
        if mask is None:
            min_t, max_t, max_superseded, settled = self._time_bounds
            mask = np.ones(len(min_t), dtype=bool)
            if upper is not None:
                mask &= min_t < upper
            if lower is not None:
                mask &= max_t >= lower
            if current_at is not None:
                mask &= (min_t < current_at) & ~(settled & (max_superseded < current_at))
            if len(masks) >= TIME_MASKS:
                masks.clear()
            masks[bounds] = mask
        return mask

    @functools.cached_property
    def _time_masks(self) -> dict[tuple[int | None, int | None, int | None], np.ndarray]:
        return {}

    @functools.cached_property
    def _time_bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each row group's least and greatest t and greatest ``superseded_at`` (the int64 extremes
        where statistics are missing, so that they rule nothing out), and whether every row of it
        has a ``superseded_at`` (no NULL: its greatest is then every row's bound)."""
        low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
        min_t = np.array([low if g.min_t is None else g.min_t for g in self.times], dtype=np.int64)
        max_t = np.array([high if g.max_t is None else g.max_t for g in self.times], dtype=np.int64)
        superseded = np.array([high if g.max_superseded is None else g.max_superseded for g in self.times],
                              dtype=np.int64)
        settled = np.array([g.superseded_nulls == 0 for g in self.times], dtype=bool)
        return min_t, max_t, superseded, settled

    @functools.cached_property
    def _key_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Each row group's key range as two arrays (the int64 extremes where statistics are missing)."""
        lows = np.array([b[0] if b is not None else np.iinfo(np.int64).min for b in self.key_ranges], dtype=np.int64)
        highs = np.array([b[1] if b is not None else np.iinfo(np.int64).max for b in self.key_ranges], dtype=np.int64)
        return lows, highs

    def row_groups_current(self, as_of: int) -> list[int]:
        """The row groups that may hold a row current as of ``as_of`` (see ``RowGroupTimes``)."""
        return [rg for rg, times in enumerate(self.times) if times.may_be_current(as_of)]


#: the time bounds a file's footer keeps the row groups allowed by (``Footer.row_groups_spanning``)
TIME_MASKS = 16


@dataclass(frozen=True)
class KeyBlooms:
    """Where a file's Bloom filters on the key column are: (offset, length) per row group, None
    where a row group has none. Their bytes are read once, on a file's first lookup."""

    store: ObjectStore
    path: str
    filters: tuple[tuple[int, int] | None, ...]

    def may_hold(self, groups: Sequence[int] | np.ndarray, key: int) -> list[int]:
        """Those of ``groups`` whose filter does not rule ``key`` out (all filters tested at once)."""
        chosen = np.asarray(groups, dtype=np.int64)
        if not len(chosen):
            return []
        words = _filter_words(self)
        first, blocks = self._layout
        high, bits = hashed_key(key)
        # the block each filter maps the key to (Parquet's: the hash's high half scaled to the
        # blocks); a row group without a filter has no blocks and points at a block of all ones,
        # which rules nothing out. The filters' words are kept aligned, one block a row: a test
        # is a gather and a compare (measured: 16 against 39 us for 42 row groups)
        spots = first[chosen] + ((high * blocks[chosen]) >> 32)
        kept = ((words[spots] & bits) == bits).all(axis=1)
        return chosen[kept].tolist()

    @functools.cached_property
    def _layout(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row group: the row of ``_filter_words`` its bitset's first block is (0, a block of
        all ones, where it has no filter), and its blocks (0: no filter)."""
        blocks = np.array([0 if spot is None else bitset_bytes(spot[1]) // BLOCK_BYTES for spot in self.filters],
                          dtype=np.int64)
        first = np.where(blocks > 0, 1 + np.cumsum(blocks) - blocks, 0)
        return first, blocks


@dataclass(frozen=True)
class _FilterWords:
    """A file's Bloom filter bitsets, read for ``filters``: a block of all ones, then each row
    group's blocks in row-group order, as rows of eight little-endian 32-bit words."""

    filters: tuple[tuple[int, int] | None, ...]
    words: np.ndarray


#: the Bloom filter words of the files lookups touched, newest use last, within a byte budget
_BLOOMS: OrderedDict[tuple[str, str], _FilterWords] = OrderedDict()
_BLOOM_CACHE_BYTES = 256 * 1024 * 1024
_bloom_lock = threading.Lock()
_bloom_held = [0]  # the bytes in ``_BLOOMS``, kept as files come and go


def _filter_words(blooms: KeyBlooms) -> np.ndarray:
    """The file's filter bitsets as ``_FilterWords.words``, read in one request (they are written
    together) on the file's first test and kept."""
    cache_key = (blooms.store.uri, blooms.path)
    with _bloom_lock:
        cached = _BLOOMS.get(cache_key)
        if cached is not None and (cached.filters is blooms.filters or cached.filters == blooms.filters):
            _BLOOMS.move_to_end(cache_key)
            return cached.words
    spots = [spot for spot in blooms.filters if spot is not None]
    start, end = min(o for o, _ in spots), max(o + n for o, n in spots)
    fs, _ = blooms.store.arrow_filesystem()
    with fs.open_input_file(blooms.store.full_path(blooms.path)) as handle:
        data = handle.read_at(end - start, start)
    rows = [b"\xff" * BLOCK_BYTES]
    for offset, length in spots:  # a filter's bitset is its last bytes, after its header
        size = bitset_bytes(length)
        rows.append(data[offset + length - size - start:offset + length - start])
    words = np.frombuffer(b"".join(rows), dtype="<u4").reshape(-1, BLOCK_BYTES // 4)
    kept = _FilterWords(blooms.filters, words)
    with _bloom_lock:
        replaced = _BLOOMS.pop(cache_key, None)
        if replaced is not None:
            _bloom_held[0] -= replaced.words.nbytes
        _BLOOMS[cache_key] = kept
        _bloom_held[0] += words.nbytes
        while _bloom_held[0] > _BLOOM_CACHE_BYTES and len(_BLOOMS) > 1:
            _bloom_held[0] -= _BLOOMS.popitem(last=False)[1].words.nbytes
    return words


_FOOTERS: OrderedDict[tuple[str, str], Footer] = OrderedDict()
_FOOTER_CACHE_SIZE = 4096


def footer(store: ObjectStore, path: str) -> Footer:
    """A file's footer, cached: files are immutable, so a path's footer never changes."""
    cache_key = (store.uri, path)
    cached = _FOOTERS.get(cache_key)
    if cached is None:
        fs, _ = store.arrow_filesystem()
        try:
            with fs.open_input_file(store.full_path(path)) as handle:
                meta = pq.read_metadata(handle)
        except (OSError, pa.ArrowException) as exc:  # every read of a file starts here: name the file
            raise DataFileError(path, " ".join(str(exc).split())) from exc
        arrow_schema = meta.schema.to_arrow_schema()
        chunks = column_chunks(meta)  # once per footer: wide tables have hundreds of columns
        index, t_index, s_index, d_index = (chunks.get(name, -1) for name in (KEY, LT, SUPERSEDED, DELETED))
        ranges: list[tuple[int, int] | None] = []
        times: list[RowGroupTimes] = []
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            stats = group.column(index).statistics
            ranges.append((stats.min, stats.max) if stats is not None and stats.has_min_max else None)
            t_stats = group.column(t_index).statistics if t_index >= 0 else None
            s_stats = group.column(s_index).statistics if s_index >= 0 else None
            d_stats = group.column(d_index).statistics if d_index >= 0 else None
            times.append(RowGroupTimes(
                t_stats.min if t_stats is not None and t_stats.has_min_max else None,
                s_stats.max if s_stats is not None and s_stats.has_min_max else None,
                s_stats.null_count if s_stats is not None and s_stats.has_null_count else None,
                t_stats.max if t_stats is not None and t_stats.has_min_max else None,
                bool(d_stats.max) if d_stats is not None and d_stats.has_min_max else None,
                group.num_rows))
        first = meta.row_group(0) if meta.num_row_groups else None
        strings = frozenset(
            field.name for field in arrow_schema
            if first is not None and _plain_string(field.type)
            and field.name in chunks and first.column(chunks[field.name]).has_dictionary_page)
        filters = [_bloom_spot(meta.row_group(rg).column(index)) if index >= 0 else None
                   for rg in range(meta.num_row_groups)]
        blooms = KeyBlooms(store, path, tuple(filters)) if any(filters) else None
        cached = Footer(meta, frozenset(arrow_schema.names), tuple(ranges), tuple(times), strings,
                        arrow_schema.remove_metadata(), blooms)
        _FOOTERS[cache_key] = cached
        if len(_FOOTERS) > _FOOTER_CACHE_SIZE:
            _FOOTERS.popitem(last=False)
    return cached


def _bloom_spot(column: pq.ColumnChunkMetaData) -> tuple[int, int] | None:
    offset, length = column.bloom_filter_offset, column.bloom_filter_length
    return (offset, length) if offset is not None and length else None


def _plain_string(kind: pa.DataType) -> bool:
    return (not isinstance(kind, pa.BaseExtensionType)
            and (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
                 or pa.types.is_large_binary(kind)))


_READERS: dict[int, ThreadPoolExecutor] = {}


def _readers() -> ThreadPoolExecutor:
    """Threads reading one key's row groups from many files at once (decoding releases the GIL, and
    on an object store each file is a request whose latency overlaps the others'). One pool per
    process: a forked child has none of its parent's threads."""
    pid = os.getpid()
    pool = _READERS.get(pid)
    if pool is None:
        _READERS.clear()
        pool = _READERS[pid] = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2),
                                                  thread_name_prefix="read-key")
    return pool


#: reading a row group's key column alone, as a share of reading the columns a lookup returns
#: (measured: 0.2 ms a row group of 16,384 rows against 1.2-1.7 ms for seven columns; rounded up)
KEY_READ_SHARE = 0.3


def reads_key_first(groups: Sequence[tuple[tuple[int, int] | None, int]]) -> bool:
    """Should a lookup read the key column of these candidate row groups (each: its key range,
    its rows) first, and then whole only those that hold the key? Yes when that is expected to
    decode less: a row group holding n rows over a key range of s keys holds a given key with
    probability about n / s (keys are mostly dense), so a snapshot piece holding every key of its
    range is read whole at once, while a piece holding a subset of them (a snapshot's own rows,
    or its rows holding versions) or an interval's time buckets (each spanning the whole range)
    is asked first."""
    expected_hits = sum(1.0 if bounds is None else min(1.0, rows / (bounds[1] - bounds[0] + 1))
                        for bounds, rows in groups)
    return len(groups) * KEY_READ_SHARE + expected_hits < len(groups)


def read_key(
    store: ObjectStore,
    files: Sequence[StoredFile],
    schema: pa.Schema,
    wanted: Sequence[str],
    key: int,
    lower: int | None,
    upper: int,
    current_at: int | None = None,
) -> pa.Table:
    """Every version of one key with ``lower <= t < upper`` in ``files``, reading only its row groups.

    Files whose key range (catalog entry, then each row group's statistics in the cached footer)
    excludes the key are not opened; the others' row groups are read in parallel, filtered to the
    key's rows (dictionary-encoded strings decoded for those rows only) and brought to one schema.
    With ``current_at`` (files of one closed interval holding it), row
    groups whose statistics say no row is current then are skipped too: the key's newest version
    below it is kept, older ones may not be. Where a file's candidate row groups likely lack the
    key (``reads_key_first``: a closed file's time buckets, a snapshot piece holding a subset of
    its range), their key column is read first and only those holding it are read whole.
    """
    target = pa.schema([schema.field(c) for c in wanted])
    reads = []
    for f in files:
        if f.min_key is not None and f.max_key is not None and not f.min_key <= key <= f.max_key:
            continue
        cached = footer(store, f.path)
        groups = [rg for rg in cached.row_groups_holding(key) if cached.times[rg].min_t is None
                  or cached.times[rg].min_t < upper]
        if current_at is not None and SUPERSEDED in cached.columns:
            groups = [rg for rg in groups if cached.times[rg].may_be_current(current_at)]
        if groups:
            reads.append((f.path, cached, groups))
    if not reads:
        return target.empty_table()
    fs, _ = store.arrow_filesystem()

    def read(path: str, cached: Footer, groups: list[int]) -> pa.Table:
        with fs.open_input_file(store.full_path(path)) as handle:
            parquet = pq.ParquetFile(handle, metadata=cached.meta,
                                     read_dictionary=[c for c in wanted if c in cached.dictionary_strings] or None)
            if reads_key_first([(cached.key_ranges[rg], cached.meta.row_group(rg).num_rows) for rg in groups]):
                # the candidates' key column alone first (one read), then whole row groups only
                # where the key is
                keys = parquet.read_row_groups(groups, columns=[KEY], use_threads=False).column(0)
                offsets = [0]
                for rg in groups:
                    offsets.append(offsets[-1] + cached.meta.row_group(rg).num_rows)
                hits = pc.indices_nonzero(pc.equal(keys, key)).to_pylist()
                groups = sorted({groups[bisect.bisect_right(offsets, i) - 1] for i in hits})
            if not groups:
                return target.empty_table()
            table = parquet.read_row_groups(groups, columns=[c for c in wanted if c in cached.columns],
                                            use_threads=False)
        # the key's rows first, so that only they are decoded from dictionaries and cast
        mine = pc.and_(pc.equal(table.column(KEY), key), pc.less(table.column(LT), upper))
        if lower is not None:
            mine = pc.and_(mine, pc.greater_equal(table.column(LT), lower))
        return conform(table.filter(mine), target)

    return pa.concat_tables(_each_here_and_on_readers(read, reads)).combine_chunks()


def _each_here_and_on_readers(fn: Callable[..., Result], args: Sequence[tuple]) -> list[Result]:
    """``fn(*a)`` of each of ``args``, in order: the first on this thread while the reader threads
    run the others (a lookup reads a file or two: handing every one to a thread and waiting costs
    a wake-up more than the read of a small row group)."""
    if len(args) == 1:
        return [fn(*args[0])]
    pending = [_readers().submit(fn, *a) for a in args[1:]]
    try:
        first = fn(*args[0])
    except BaseException:
        for future in pending:
            future.cancel()
        raise
    return [first, *(future.result() for future in pending)]


def conform(table: pa.Table, target: pa.Schema) -> pa.Table:
    """``table`` with ``target``'s columns and types: an older file lacks later supercolumns (read
    as nulls), or stores a type Arrow reads back differently (cast)."""
    if table.schema.equals(target):
        return table
    return pa.Table.from_arrays(
        [_as(table.column(f.name), f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
         for f in target],
        schema=target,
    )


def _as(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    return column if column.type == kind else column.cast(kind)


def read_row_groups(store: ObjectStore, chosen: Sequence[tuple[StoredFile, Sequence[int]]],
                    target: pa.Schema) -> pa.Table:
    """The row groups ``chosen`` of each file, ``target``'s columns (its dictionary columns read as
    dictionaries, see ``as_dictionaries``), in file and row-group order.

    Each file is opened with its cached footer and the files are read in parallel (the first on
    the calling thread, the others on the reader threads): Arrow's dataset scanner reads every
    footer again and costs about a third more for the same row groups. On an object store the
    column chunks are fetched together (``pre_buffer``), as the scanner does: a request per chunk
    would pay the latency of each."""
    return read_row_groups_each(store, chosen, target, lambda _: None)[0]


def read_row_groups_each(store: ObjectStore, chosen: Sequence[tuple[StoredFile, Sequence[int]]],
                         target: pa.Schema, each: Callable[[pa.Table], Result]) -> tuple[pa.Table, list[Result]]:
    """``read_row_groups`` and ``each`` of every file's rows as read, computed on the thread that
    read them (so that work on the rows, a mask, runs on both cores while the other files are read)."""
    fs, _ = store.arrow_filesystem()
    dictionaries = [f.name for f in target if pa.types.is_dictionary(f.type)]
    remote = not isinstance(store, LocalStore)

    def read(f: StoredFile, groups: Sequence[int]) -> tuple[pa.Table, Result]:
        cached = footer(store, f.path)
        with fs.open_input_file(store.full_path(f.path)) as handle:
            parquet = pq.ParquetFile(handle, metadata=cached.meta, pre_buffer=remote,
                                     read_dictionary=[c for c in dictionaries if c in cached.columns] or None)
            table = parquet.read_row_groups(list(groups), columns=[c for c in target.names if c in cached.columns])
        table = conform(table, target)
        return table, each(table)

    if not chosen:
        return target.empty_table(), []
    parts = _each_here_and_on_readers(read, chosen)
    tables = [table for table, _ in parts]
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables), [found for _, found in parts]


def keep_latest(candidates: pa.Table, *, include_deleted: bool = False, key: str = KEY, t: str = LT,
                deleted: str = DELETED) -> pa.Table:
    """The newest version of each key, without deleted keys (the Reconstruction Invariant); with
    ``include_deleted``, a key whose newest version is a delete keeps that row.

    One sort by (key, timestamp) and one pass keeping each key's last row; Arrow
    types (UUID, JSON extensions) survive untouched. ``key``, ``t`` and ``deleted`` name the
    columns (compaction's carried rows use short names).
    """
    if candidates.num_rows == 0:
        return candidates
    ordered = candidates if _in_key_and_t_order(as_numpy(candidates.column(key)), as_numpy(candidates.column(t))) \
        else candidates.sort_by([(key, "ascending"), (t, "ascending")])
    keys = ordered.column(key).combine_chunks()
    if len(keys) > 1:
        last = pc.not_equal(keys.slice(0, len(keys) - 1), keys.slice(1))
        last = pa.concat_arrays([last, pa.array([True])])
    else:
        last = pa.array([True])
    latest = ordered.filter(last)
    if not include_deleted:
        latest = latest.filter(pc.invert(latest.column(deleted)))
    return latest


def _in_key_and_t_order(keys: np.ndarray, times: np.ndarray) -> bool:
    """Are (keys, times) ascending by key, then by time?"""
    if len(keys) < 2:
        return True
    return bool(((keys[1:] > keys[:-1]) | ((keys[1:] == keys[:-1]) & (times[1:] > times[:-1]))).all())


def overlay(base: pa.Table, changes: pa.Table, keep: Sequence[str] | None = None,
            schema: pa.Schema | None = None, current: np.ndarray | None = None,
            current_keys: np.ndarray | None = None) -> pa.Table:
    """Snapshot rows overridden by the newest later version of their key (deletes drop the key);
    with ``keep``, only those columns of them; with ``schema``, columns read as dictionaries are
    decoded to its types (after the gather); with ``current``, only those rows of ``base`` (in any
    order, none deleted, keys unique) are its live rows, and ``current_keys``, when given, their keys.

    Works on key and timestamp arrays, not rows: the changes are ordered by (key, t) (one pass
    when they already are, as one version file is), the changes' newest rows shadow the base's
    rows of their keys (``shadowed_in_key_order``), and the rows are gathered once, in key order.
    The cost is the live rows plus the changes, not the history.
    """
    columns = list(keep) if keep is not None else base.column_names
    decoded = None if schema is None else _fields_of(schema, columns)
    if current is not None and current_keys is None:
        current_keys = np.take(as_numpy(base.column(KEY)), current)
    if changes.num_rows == 0 and current is not None:
        none = np.empty(0, dtype=np.int64)
        rows, keys = survivors_in_key_order(current_keys, None, none, np.empty(0, dtype=bool), none, current)
        return gather_with_keys(base.select(columns), rows, keys, decoded)
    if changes.num_rows == 0:
        # a snapshot holds no deleted rows: filtering would only copy them
        deleted = base.column(DELETED)
        live = base.filter(pc.invert(deleted)) if base.num_rows and pc.any(deleted).as_py() else base
        # a snapshot of several files (pieces by key range) is read in file order
        live = live if _in_key_order(live) else live.sort_by([(KEY, "ascending")])
        live = live.select(columns)
        return live if decoded is None else live.cast(decoded)
    changed_keys = as_numpy(changes.column(KEY))
    order = _by_key_then_t(changed_keys, as_numpy(changes.column(LT)))
    in_order = order is None
    changed_keys = changed_keys if in_order else changed_keys[order]
    last = np.empty(len(changed_keys), dtype=bool)
    last[:-1] = changed_keys[:-1] != changed_keys[1:]
    last[-1] = True
    newest = np.flatnonzero(last) if in_order else order[last]
    in_base = base.num_rows
    base_keys = as_numpy(base.column(KEY)) if in_base else changed_keys[:0]
    if current is not None:
        # every row read current (as the rows current at an open interval's marks are): no indirection
        current = None if len(current) == in_base else current
        base_keys, base_deleted = current_keys if current is not None else base_keys, None
    else:
        # a snapshot holds no deleted row: its flags are converted only when one is there
        base_deleted = as_numpy(base.column(DELETED)) if in_base and pc.any(base.column(DELETED)).as_py() else None
    rows, keys = survivors_in_key_order(base_keys, base_deleted, changed_keys[last],
                                        as_numpy(changes.column(DELETED))[newest], newest + in_base,
                                        current if in_base else None)
    combined = changes.select(columns)
    if in_base:
        kept = base.select(columns)
        combined = pa.concat_tables([kept, combined.cast(kept.schema)])
    return gather_with_keys(combined, rows, keys, decoded)


def _fields_of(schema: pa.Schema, names: Sequence[str]) -> pa.Schema:
    return pa.schema([schema.field(name) for name in names])


#: direct addressing orders keys spanning at most this many slots per key; sparser keys are sorted
DENSE_SPAN = 4


def shadowed_in_key_order(first_keys: np.ndarray, first_deleted: np.ndarray | None, later_keys: np.ndarray,
                          later_deleted: np.ndarray, later_rows: np.ndarray,
                          first_rows: np.ndarray | None = None) -> np.ndarray:
    """Row numbers of the surviving rows in key order: the first rows (row ``first_rows[i]``, by
    default ``i``, for ``first_keys[i]``; ``first_deleted``: None when none is) overridden by the
    later rows of the same key (``later_rows``), a later delete dropping its key. Keys are unique
    within each side, in any order."""
    return survivors_in_key_order(first_keys, first_deleted, later_keys, later_deleted, later_rows, first_rows)[0]


def survivors_in_key_order(first_keys: np.ndarray, first_deleted: np.ndarray | None, later_keys: np.ndarray,
                           later_deleted: np.ndarray, later_rows: np.ndarray,
                           first_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``shadowed_in_key_order`` and the surviving rows' keys (so the key column need not be gathered).

    Keys of one table are mostly dense (assigned in sequence), so a slot per key in their span
    orders them in a few linear passes (slots of 32 bits while row numbers fit: half the memory to
    touch); sparse keys are merged by one stable sort instead (a first row lands just before its
    key's later row, which shadows it)."""
    n = len(first_keys) + len(later_keys)
    if n == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    present = [k for k in (first_keys, later_keys) if len(k)]
    low, high = min(int(k.min()) for k in present), max(int(k.max()) for k in present)
    if high - low < DENSE_SPAN * n:
        most = max([len(first_keys)] + [int(r.max()) for r in (first_rows, later_rows) if r is not None and len(r)])
        kind = np.int32 if most < 2**31 - 1 else np.int64
        first = np.arange(len(first_keys), dtype=kind) if first_rows is None else first_rows
        if first_deleted is None and len(first_keys) == high - low + 1 and not later_deleted.any():
            # the first keys fill the whole span and nothing deletes (a table without deletes):
            # every slot is written, so none needs clearing or finding
            slot = np.empty(high - low + 1, dtype=kind)
            slot[first_keys - low if low else first_keys] = first
            slot[later_keys - low if low else later_keys] = later_rows
            return slot, np.arange(low, high + 1, dtype=np.int64)
        slot = np.full(high - low + 1, -1, dtype=kind)
        # keys from 0 (as a table's are) index the slots as they are, without a shifted copy
        slot[first_keys - low if low else first_keys] = first if first_deleted is None else \
            np.where(first_deleted, -1, first)
        slot[later_keys - low if low else later_keys] = np.where(later_deleted, -1, later_rows.astype(kind, copy=False))
        filled = np.flatnonzero(slot >= 0)
        return slot[filled], filled + low
    keys = np.concatenate([first_keys, later_keys])
    deleted = np.concatenate([np.zeros(len(first_keys), dtype=bool) if first_deleted is None else first_deleted,
                              later_deleted])
    rows = np.concatenate([np.arange(len(first_keys), dtype=np.int64) if first_rows is None else first_rows,
                           later_rows])
    merged = np.argsort(keys, kind="stable")
    merged_keys = keys[merged]
    kept = ~deleted[merged]
    kept[:-1] &= merged_keys[:-1] != merged_keys[1:]
    return rows[merged[kept]], merged_keys[kept]


def gather_with_keys(table: pa.Table, indices: np.ndarray, keys: np.ndarray,
                     schema: pa.Schema | None = None) -> pa.Table:
    """``gather`` of every column but the key, whose values in the gathered order are ``keys``
    (known from ordering them: taking it again would cost a column's gather); a table without
    the key column is gathered whole."""
    if KEY not in table.column_names:
        return gather(table, pa.array(indices), schema)
    others = [name for name in table.column_names if name != KEY]
    taken = gather(table.select(others), pa.array(indices),
                   None if schema is None else pa.schema([schema.field(name) for name in others]))
    key_type = (schema or table.schema).field(KEY).type
    columns = {name: taken.column(name) for name in others}
    columns[KEY] = pa.chunked_array([pa.array(keys, key_type)])
    target = schema or table.schema
    return pa.Table.from_arrays([columns[name] for name in table.column_names],
                                schema=pa.schema([target.field(name) for name in table.column_names]))


def gather(table: pa.Table, indices: pa.Array, schema: pa.Schema | None = None) -> pa.Table:
    """``table.take(indices)``, on the reader threads (Arrow's take runs one column at a time and
    releases the GIL), each column made contiguous first in its thread (taking from many chunks
    costs about twice as much). With ``schema``, columns read as dictionaries are decoded to its
    types after the take (decoding the rows kept from a small dictionary costs less than taking
    from every row's own string), in two halves: the decode is the longest job, and split it keeps
    both threads busy."""
    target = schema or table.schema
    if table.num_columns < 2 or len(indices) < 100_000:
        taken = table.take(indices)
        return taken if schema is None else taken.cast(schema)
    # a decoded column made contiguous once (its row groups' dictionaries unified), here
    decoded = {i: _contiguous(table.column(i)) for i in range(table.num_columns)
               if pa.types.is_dictionary(table.column(i).type) and not pa.types.is_dictionary(target.field(i).type)}
    half = len(indices) // 2
    # the decodes first: they take longest
    jobs = [(i, start, stop) for i in decoded for start, stop in ((0, half), (half, len(indices)))]
    jobs += [(i, 0, len(indices)) for i in range(table.num_columns) if i not in decoded]

    def one(job: tuple[int, int, int]) -> pa.Array:
        i, start, stop = job
        part = indices if stop - start == len(indices) else indices.slice(start, stop - start)
        kind = target.field(i).type
        taken = (decoded[i] if i in decoded else _contiguous(table.column(i))).take(part)
        return taken if taken.type == kind else taken.cast(kind)

    parts: dict[int, list[pa.Array]] = {}
    for (i, _, _), taken in zip(jobs, _readers().map(one, jobs), strict=True):
        parts.setdefault(i, []).append(taken)
    return pa.Table.from_arrays([pa.chunked_array(parts[i], target.field(i).type) for i in range(table.num_columns)],
                                schema=target)


def _by_key_then_t(keys: np.ndarray, times: np.ndarray) -> np.ndarray | None:
    """Indices ordering versions by (key, t) (None: they are in that order already, as one
    version file is): a stable sort by key, checked (a key's versions read from several files in
    t order keep that order), else a sort by both."""
    if _in_key_and_t_order(keys, times):
        return None
    order = np.argsort(keys, kind="stable")
    if _in_key_and_t_order(keys[order], times[order]):
        return order
    return np.lexsort((times, keys))


def as_numpy(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """One contiguous NumPy array of an Arrow column (copied where it must be)."""
    return _contiguous(values).to_numpy(zero_copy_only=False)


def _in_key_order(rows: pa.Table) -> bool:
    keys = rows.column(KEY)
    if len(keys) < 2:
        return True
    return bool(pc.all(pc.less(keys.slice(0, len(keys) - 1), keys.slice(1))).as_py())


def _contiguous(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
