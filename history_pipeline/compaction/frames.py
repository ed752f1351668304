"""Compaction as Spark DataFrame / Arrow operations (``StoreSettings.compaction_engine``, the default).

Per verified segment the driver never holds the segment, nor a list of its rows:

1. *route*: in the same streaming read that verifies the seal (``verify_and_route``), the driver
   finds, with one regular expression over whole byte chunks (Arrow), the row events in the WAL
   writer's form, their tables, keys and byte ranges, and appends them per table to a route
   file beside the segment (``<wal_dir>/routes``), keeping only counts and key ranges; only the
   few other records (schema changes, closes) reach Python, and the driver replays them into
   per-table schema epochs. A segment not in that form is routed by Spark instead:
   executors split it into (line, text) rows, the JVM parses each envelope (``from_json``),
   and one aggregation brings back the non-row records and per touched table its row count
   and largest t (``parsed_lines`` + ``route``).
2. *decode, fold and write* (one action): per table and key part, executors decode each row
   event against its epoch (``vector_decode`` for values in their canonical form, the project's
   own decoders for the rest, so values and messages are those of the contract), read the prior
   image of the part's keys from the table's files (every live key when a backfill needs them),
   fold (``fold.py``, vectorized) and write the versions and snapshot files. Driver-routed,
   several pending segments run as one job (a *group*, ``run_group``): the tasks are the
   partitions of one ``spark.range``, each (table, key part) reads its rows' byte ranges from
   the route files and only those lines of each segment (no shuffle), and carries each key's
   newest image from segment to segment; Spark-routed, the decoded rows are spread by a hash
   of the key and sorted first. Back come the files' statistics, or a part's smallest failing
   line (then the caller discards the files of that segment and of those after it).

The driver then commits exactly as the in-process path does (``compactor.py``).
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from history_pipeline.catalog.files import may_hold_keys, select_files, write_parquet
from history_pipeline.catalog.model import CatalogState, FileEntry, FileKind
from history_pipeline.compaction.carriers import carrier_type, from_carrier, to_carrier
from history_pipeline.compaction.fold import GONE, PRIOR, fold
from history_pipeline.compaction.order import (
    CLOSE,
    NONE,
    ROW,
    SCHEMA,
    UNREADABLE,
    OrderRun,
    RunScanner,
    order_error,
)
from history_pipeline.compaction.plan import Backfill, TablePlan, _apply_schema
from history_pipeline.compaction.vector_decode import Epoch, decode_canonical, row_names
from history_pipeline.errors import (
    CastError,
    HistoryConflictError,
    MalformedRecordError,
    TimestampOrderError,
    ValueTypeError,
)
from history_pipeline.events import ROW_OPS, Close, Delete, Insert, Update, is_schema_change, parse_line
from history_pipeline.execution import open_executor_store, spark_master
from history_pipeline.schema import SchemaHistoryEntry, SchemaState, Supercolumn, TableDescriptor
from history_pipeline.supertable import (
    DELETED,
    KEY,
    LT,
    FileMetadata,
    new_file_path,
    supertable_schema,
)
from history_pipeline.supertable.read import keep_latest
from history_pipeline.types import arrow_native, arrow_type, decode_value, to_arrow_value
from history_pipeline.wal.segments import SealedSegment, SegmentRef, verify_segment

_KINDS = {Insert: "insert", Update: "update", Delete: "delete"}
ERROR_CLASSES: dict[str, type[MalformedRecordError]] = {
    c.__name__: c for c in (MalformedRecordError, HistoryConflictError, CastError, TimestampOrderError)
}
#: bytes of segment per parsing task (a segment is split by byte ranges at line starts)
CHUNK_BYTES = 8 << 20
#: what each fold task returns: a written file's statistics, or its first failing line
OUT_SCHEMA = pa.schema([
    ("path", pa.string()), ("kind", pa.string()), ("table_uuid", pa.string()), ("size_bytes", pa.int64()),
    ("row_count", pa.int64()), ("min_t", pa.int64()), ("max_t", pa.int64()), ("min_key", pa.int64()),
    ("max_key", pa.int64()), ("snapshot_as_of", pa.int64()),
    ("line", pa.int64()), ("key", pa.int64()), ("error_class", pa.string()), ("reason", pa.string()),
])
OUT_DDL = ", ".join(f"{f.name} {'string' if pa.types.is_string(f.type) else 'bigint'}" for f in OUT_SCHEMA)


# --- plans the driver makes ------------------------------------------------------------


@dataclass(frozen=True)
class TableWork:
    """One table's share of a segment: what executors need to decode, fold and write it."""

    table_uuid: str
    epoch_lines: tuple[int, ...]  # epoch i holds for rows with line > epoch_lines[i]
    epochs: tuple[TableDescriptor | None, ...]
    supercolumns_before: tuple[Supercolumn, ...]
    supercolumns_after: tuple[Supercolumn, ...]
    backfills: tuple[Backfill, ...]
    rows: int
    max_t: int | None
    files: tuple[FileEntry, ...]  # the prior image's files (snapshot first, then versions)
    snapshot_as_of: int | None


@dataclass(frozen=True)
class SegmentFramePlan:
    """What the driver learnt from the few non-row records of a segment."""

    segment: SealedSegment
    schema_entries: tuple[SchemaHistoryEntry, ...]
    schema_after: SchemaState
    tables: tuple[TableWork, ...]
    error: MalformedRecordError | None  # the first error found on the driver (schema records)
    #: the first line breaking the ordering rules (``with_order``): it wins over the plan's and the
    #: tasks' errors as in the in-process path, which checks the order before it plans and folds
    order_error: TimestampOrderError | None = None

    def with_order(self, runs: Sequence[OrderRun], frontier: int) -> SegmentFramePlan:
        """This plan with the ordering rules checked from the runs' reports and the frontier the
        segment is compacted onto."""
        found = order_error(runs, self.segment.lower, frontier, self.segment.upper, self.segment.ref.name)
        return self if found is None else replace(self, order_error=found)


@dataclass(frozen=True)
class FrameContext:
    """The narrow handles the DataFrame path needs (all picklable, no secrets)."""

    store_config: dict[str, Any]
    database: str
    prior_as_of: int
    txn_hint: int
    segment_id: int
    attempt: str | None = None


# --- stage 1: split and route ----------------------------------------------------------


def _chunk_lines(path: str, body_bytes: int, chunk: int, chunks: int) -> Iterator[pa.RecordBatch]:
    """(line, text) rows of one byte range of a segment's body (ranges start at line starts)."""
    with open(path, "rb") as f:
        body = f.read(body_bytes)
    begin = _line_start(body, chunk * body_bytes // chunks)
    end = _line_start(body, (chunk + 1) * body_bytes // chunks)
    if begin >= end:
        return
    first = body.count(b"\n", 0, begin) + 1
    lines = body[begin:end].split(b"\n")[:-1]  # the range ends with a newline
    for at in range(0, len(lines), 65_536):
        part = lines[at : at + 65_536]
        yield pa.RecordBatch.from_arrays(
            [pa.array(range(first + at, first + at + len(part)), pa.int64()), pa.array(part, pa.binary())],
            names=["line", "text"],
        )


def _split_lines(body_bytes: int, chunks: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """An Arrow UDF: (path, chunk) rows in, (line, text) rows of that byte range of the file out."""

    def split(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for path, chunk in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
                yield from _chunk_lines(path, body_bytes, chunk, chunks)

    return split


def _line_start(body: bytes, offset: int) -> int:
    """The first line start at or after ``offset``."""
    if offset <= 0:
        return 0
    if offset >= len(body):
        return len(body)
    found = body.find(b"\n", offset - 1)
    return len(body) if found < 0 else found + 1


#: the start of a row event exactly as the WAL writer prints it (its table is read without parsing)
ENVELOPE_RE = (r'^\{"op":"(?:insert|update|delete)","t":(?P<t>0|[1-9][0-9]{0,17}),'
               r'"table_uuid":"(?P<table>[^"\\\x00-\x1f]+)","key":(?P<key>0|-?[1-9][0-9]{0,17})[,}]')
#: the driver routes a segment itself only with at most this many other lines (schema changes ...)
MAX_SCANNED_RECORDS = 10_000
#: ... and at most this many touched tables
MAX_SCANNED_TABLES = 8
#: bytes of segment the driver routes, and a fold task reads, at once
ROUTE_BYTES = 4 << 20
#: a fold task reads its lines in spans; it skips a gap between two of them this long or longer
SKIP_GAP = 64 << 10


def _chunks(segment: SealedSegment) -> int:
    # at least two ranges: parsing and decoding run on both cores of the smallest machine
    return max(2, min(16, segment.body_bytes // CHUNK_BYTES + 1))


def lines_at(data: bytes, starts: np.ndarray, ends: np.ndarray) -> pa.BinaryArray:
    """The byte ranges ``[starts[i], ends[i])`` of ``data`` (ascending, not overlapping) as one
    binary array; only those bytes are copied (no per-line Python)."""
    n = len(starts)
    if not n:
        return pa.array([], pa.binary())
    bounds = np.empty(2 * n, np.int32)  # line, gap, line, gap ... line: the lines are the even items
    bounds[0::2], bounds[1::2] = starts, ends
    spans = pa.Array.from_buffers(pa.binary(), 2 * n - 1, [None, pa.py_buffer(bounds), pa.py_buffer(data)])
    return spans.take(pa.array(np.arange(0, 2 * n - 1, 2)))


@dataclass(frozen=True)
class RowLines:
    """Where one table's row events are in a segment (ascending line numbers, their byte ranges in
    the file without the newline, their keys): what a fold task needs to read only its own lines."""

    lines: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    keys: np.ndarray

    def take(self, picked: np.ndarray) -> RowLines:
        """The lines at positions (or where the mask is true) ``picked``."""
        return RowLines(self.lines[picked], self.starts[picked], self.ends[picked], self.keys[picked])


#: where the driver lists a segment's row events for the fold tasks: ``<wal_dir>/routes``, beside
#: the segments (the WAL is on local disk, or a path shared with the executors)
ROUTES = "routes"


def routes_dir(wal_dir: Path) -> Path:
    """The folder of the route files of a WAL's segments."""
    return wal_dir / ROUTES


@dataclass(frozen=True)
class RouteTable:
    """Where one table's row events in a segment are: a route file beside the segment of int64 rows
    (line number, byte start and end in the segment without the newline, key), in line order, with
    their count, largest t and key range. The driver writes it while it verifies the segment and
    keeps only this; a fold task reads the rows of its own keys."""

    path: str
    rows: int
    max_t: int
    min_key: int
    max_key: int

    def load(self) -> RowLines:
        """The rows of the file (the reader is a fold task, or a test)."""
        data = np.fromfile(self.path, dtype="<i8").reshape(-1, 4)
        return RowLines(*(np.ascontiguousarray(data[:, i]) for i in range(4)))


@dataclass(frozen=True)
class Routed:
    """A segment routed on the driver: the lines that are not row events in the writer's form, per
    touched table (uuid, rows, max t) as ``route`` returns them, and each table's route file."""

    records: tuple[tuple[int, bytes], ...]
    touched: tuple[tuple[str, int, int], ...]
    tables: Mapping[str, RouteTable]
    #: per table, every ``stride``-th of its row events' keys (at most ``SAMPLE_KEYS``), for the driver
    #: only: where to cut the table into parts of equal rows (``balanced_cuts``); not sent to tasks
    samples: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: the ordering check's report on the segment's lines (``order.order_error`` resolves it)
    order: tuple[OrderRun, ...] = ()

    @property
    def rows(self) -> dict[str, RowLines]:
        """Every table's rows, read back from the route files (for tests: the driver never does)."""
        return {uuid: table.load() for uuid, table in self.tables.items()}

    def remove(self) -> None:
        """Delete the route files (once the segment's Spark job is over)."""
        for table in self.tables.values():
            Path(table.path).unlink(missing_ok=True)


#: keys of a table's row events the driver keeps per segment while it routes them (``sample_keys``)
SAMPLE_KEYS = 1024


def sample_keys(sample: np.ndarray, stride: int, seen: int, keys: np.ndarray) -> tuple[np.ndarray, int]:
    """The keys of row events ``0, stride, 2 * stride ...`` of a table in line order, extended by
    ``keys`` (its events ``seen, seen + 1 ...``); the stride doubles (every other sample kept)
    whenever there are more than ``SAMPLE_KEYS``, so the sample stays uniform and bounded."""
    sample = np.concatenate([sample, keys[(-seen) % stride :: stride]])
    while len(sample) > SAMPLE_KEYS:
        sample, stride = sample[::2], stride * 2
    return sample, stride


def balanced_cuts(samples: Sequence[tuple[np.ndarray, int]], parts: int) -> tuple[tuple[int, ...], list[int]] | None:
    """Cuts of a table's keys into at most ``parts`` ranges holding equal shares of its row events,
    from per-segment key samples weighted by the segment's rows ``(sample, rows)``, and each range's
    estimated rows; None without samples. Keys below the first cut go to part 0 (``part_of_keys``);
    a key that alone holds more than a share makes fewer parts."""
    weighted = [(s, rows / len(s)) for s, rows in samples if len(s)]
    if parts < 2 or not weighted:
        return None
    keys = np.concatenate([s for s, _ in weighted])
    weights = np.concatenate([np.full(len(s), w) for s, w in weighted])
    order = np.argsort(keys, kind="stable")
    keys, weights = keys[order], weights[order]
    cumulative = np.cumsum(weights)
    at = np.searchsorted(cumulative, cumulative[-1] * np.arange(1, parts) / parts, side="left")
    # the keys up to the quantile's own go below the cut; no cut above every sampled key (an empty top)
    cuts = np.unique(keys[at][keys[at] < keys[-1]]) + 1
    of = np.searchsorted(cuts, keys, side="right")
    estimate = np.bincount(of, weights=weights, minlength=len(cuts) + 1)
    return tuple(int(c) for c in cuts), [int(round(e)) for e in estimate]


class _Router:
    """Routes a segment's body piece by piece (``verify_segment``'s ``on_body``): one RE2 match of
    the envelope per line (Arrow); per table the rows found are appended to its route file
    ``<prefix>.<n>.rows`` at once, so the driver holds one piece, not the segment's rows.
    ``gave_up`` when the segment is not for the driver (a row event in another form, too many
    other lines or tables, bad UTF-8)."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = prefix
        self.gave_up = False
        self.records: list[tuple[int, bytes]] = []
        self.found: dict[str, list[Any]] = {}  # uuid -> [path, rows, max t, min key, max key]
        self.samples: dict[str, tuple[np.ndarray, int]] = {}  # uuid -> (key sample, its stride)
        self.order: RunScanner | None = None  # the ordering rules, from the seal's upper bound on

    def sealed(self, upper: int) -> None:
        """The segment's upper bound (``verify_segment`` reads the seal before the body)."""
        self.order = RunScanner(upper)

    def _check_order(self, data: bytes, first_line: int, starts: np.ndarray, ends: np.ndarray,
                     row: np.ndarray, row_ts: np.ndarray, other: np.ndarray) -> None:
        """Feed this piece's lines to the ordering check in line order: the row events' t as
        routed, the few other lines parsed (the same read carries the check: no second pass)."""
        if self.order is None or self.order.done:
            return
        ts = np.empty(len(row), np.int64)
        kinds = np.full(len(row), ROW, np.int8)
        ts[row] = row_ts
        for i in other:
            try:
                event = parse_line(data[starts[i]:ends[i]])
            except MalformedRecordError:  # reported as malformed (by the plan): the check ends there
                ts[i], kinds[i] = NONE, UNREADABLE
                continue
            ts[i] = event.t
            kinds[i] = CLOSE if isinstance(event, Close) else SCHEMA if is_schema_change(event) else ROW
        lines = first_line + np.arange(len(row), dtype=np.int64)
        events = lines > 1  # line 1, the opening close, is the starting state
        self.order.feed(lines[events], ts[events], kinds[events])

    def __call__(self, data: bytes, offset: int, first_line: int) -> None:
        if self.gave_up or not data:
            return
        ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
        starts = np.concatenate(([0], ends[:-1] + 1))
        try:
            text = lines_at(data, starts, ends).cast(pa.string())
        except pa.ArrowInvalid:
            self.gave_up = True
            return
        head = pc.extract_regex(text, ENVELOPE_RE)
        row = np.asarray(head.is_valid().to_numpy(zero_copy_only=False), bool)
        other = np.flatnonzero(~row)
        if len(self.records) + len(other) > MAX_SCANNED_RECORDS:
            self.gave_up = True
            return
        self.records += [(first_line + int(i), data[starts[i]:ends[i]]) for i in other]
        mask = pa.array(row)
        ts = np.asarray(head.field("t").filter(mask).cast(pa.int64()).to_numpy())
        self._check_order(data, first_line, starts, ends, row, ts, other)
        if not row.any():
            return
        tables = head.field("table").filter(mask).dictionary_encode()
        codes = np.asarray(tables.indices.to_numpy(zero_copy_only=False))
        keys = np.asarray(head.field("key").filter(mask).cast(pa.int64()).to_numpy())
        at = np.flatnonzero(row)
        for code, uuid in enumerate(tables.dictionary.to_pylist()):
            if uuid not in self.found:
                if len(self.found) >= MAX_SCANNED_TABLES:
                    self.gave_up = True
                    return
                path = f"{self.prefix}.{len(self.found)}.rows"
                self.found[uuid] = [path, 0, -1, None, None]
            entry = self.found[uuid]
            mine, its_keys = at[codes == code], keys[codes == code]
            rows = np.stack([first_line + mine, offset + starts[mine], offset + ends[mine], its_keys], axis=1)
            with open(entry[0], "ab") as f:
                rows.astype("<i8").tofile(f)
            low, high = int(its_keys.min()), int(its_keys.max())
            self.samples[uuid] = sample_keys(*self.samples.get(uuid, (np.zeros(0, np.int64), 1)), entry[1], its_keys)
            entry[1] += len(mine)
            entry[2] = max(entry[2], int(ts[codes == code].max()))
            entry[3] = low if entry[3] is None else min(entry[3], low)
            entry[4] = high if entry[4] is None else max(entry[4], high)

    def discard(self) -> None:
        """Delete the route files written so far."""
        for path, *_ in self.found.values():
            Path(path).unlink(missing_ok=True)

    def routed(self) -> Routed | None:
        """What was found, or None (its files deleted) when the segment is not for the driver."""
        if self.gave_up:
            self.discard()
            return None
        for line, text in self.records:  # a row event in another form: Spark's JSON reader routes it
            try:
                event = parse_line(text, line=line)
            except MalformedRecordError:
                continue
            if type(event) in _KINDS:
                self.discard()
                return None
        tables = {u: RouteTable(*found) for u, found in self.found.items()}
        touched = tuple(sorted((u, r.rows, r.max_t) for u, r in tables.items()))
        run = self.order.run() if self.order is not None else None
        return Routed(tuple(self.records), touched, tables, {u: sample for u, (sample, _) in self.samples.items()},
                      () if run is None else (run,))


def verify_and_route(ref: SegmentRef, routes: Path | None = None) -> tuple[SealedSegment, Routed | None]:
    """Verify a sealed segment and route it on the driver in the same single read (see
    ``verify_segment``), its row events listed in route files in ``routes`` (by default the
    WAL's ``routes`` folder, beside the segments), named by segment and a fresh attempt id; the
    route is None when Spark must route it. A failed read leaves no route file."""
    folder = routes if routes is not None else routes_dir(ref.path.parent.parent)
    folder.mkdir(parents=True, exist_ok=True)
    router = _Router(folder / f"{ref.name}.{uuid4().hex}")
    try:
        sealed = verify_segment(ref, router, ROUTE_BYTES, on_seal=router.sealed)
    except BaseException:
        router.discard()
        raise
    return sealed, router.routed()


def sweep_routes(wal_dir: Path, pending: Sequence[SegmentRef]) -> int:
    """Delete the route files of segments no longer pending (left by a crash during a compaction;
    a live compaction's are of pending segments); returns how many went."""
    folder = routes_dir(wal_dir)
    if not folder.is_dir():
        return 0
    keep = {ref.name for ref in pending}
    gone = 0
    for entry in folder.iterdir():
        if entry.name.partition(".")[0] not in keep:
            entry.unlink(missing_ok=True)
            gone += 1
    return gone


#: a fold task decodes its lines in batches of about this many bytes (fewer, larger batches: each
#: batch costs ~150 Arrow kernel calls whatever its size)
DECODE_BYTES = 32 << 20


def _coalesced(batches: Iterator[pa.RecordBatch], size: int) -> Iterator[pa.RecordBatch]:
    """``(line, text)`` batches joined into batches of about ``size`` bytes of text (in order)."""
    held: list[pa.RecordBatch] = []
    bytes_held = 0
    for batch in batches:
        held.append(batch)
        bytes_held += batch.nbytes
        if bytes_held >= size:
            yield pa.Table.from_batches(held).combine_chunks().to_batches()[0]
            held, bytes_held = [], 0
    if held:
        yield pa.Table.from_batches(held).combine_chunks().to_batches()[0]


def _read_lines(path: str, rows: RowLines) -> Iterator[pa.RecordBatch]:
    """(line, text) batches of exactly the lines ``rows`` names, read from the segment file in
    spans of at most ``ROUTE_BYTES`` that skip gaps of ``SKIP_GAP`` or more."""
    n = len(rows.lines)
    if not n:
        return
    breaks = np.flatnonzero(rows.starts[1:] - rows.ends[:-1] >= SKIP_GAP) + 1
    with open(path, "rb") as f:
        for group_start, group_end in zip(np.r_[0, breaks], np.r_[breaks, n], strict=True):
            i = int(group_start)
            while i < group_end:  # spans of at most ROUTE_BYTES (one line at least)
                j = int(np.searchsorted(rows.ends[i:group_end], rows.starts[i] + ROUTE_BYTES, side="right")) + i
                j = max(j, i + 1)
                base = int(rows.starts[i])
                f.seek(base)
                data = f.read(int(rows.ends[j - 1]) - base)
                text = lines_at(data, rows.starts[i:j] - base, rows.ends[i:j] - base)
                yield pa.RecordBatch.from_arrays([pa.array(rows.lines[i:j]), text], names=["line", "text"])
                i = j


def key_cuts(files: Sequence[FileEntry], parts: int) -> tuple[int, ...] | None:
    """Where to cut the key range of a table's prior files into ``parts`` ranges of equal width
    (keys below the first cut go to part 0, at or above the last to the last part), or None when
    the files say nothing of their keys (then keys are split by modulo)."""
    lows = [f.min_key for f in files if f.min_key is not None]
    highs = [f.max_key for f in files if f.max_key is not None]
    if parts < 2 or not lows or not highs:
        return None
    return equal_cuts(min(lows), max(highs), parts)


def equal_cuts(low: int, high: int, parts: int) -> tuple[int, ...]:
    """Cuts of the key range [low, high] into ``parts`` ranges of equal width."""
    width = high - low + 1
    return tuple(low + width * i // parts for i in range(1, parts))


def part_of_keys(keys: np.ndarray, parts: int, cuts: tuple[int, ...] | None) -> np.ndarray:
    """The part of each key: its range between ``cuts``, or the key modulo ``parts`` without them."""
    if cuts is None:
        return np.mod(keys, parts)
    return np.searchsorted(np.asarray(cuts, dtype=np.int64), keys, side="right")


def local_slots(spark: Any) -> int | None:
    """How many tasks a local master runs at once (``local[N]``, ``local[*]``, ``local``), None
    elsewhere (a cluster's slots are not known without ``sparkContext``)."""
    master = spark_master(spark)
    if master == "local":
        return 1
    found = re.fullmatch(r"local\[(\*|[0-9]+)(?:,[0-9]+)?\]", master)
    if found is None:
        return None
    return (os.cpu_count() or 1) if found.group(1) == "*" else max(1, int(found.group(1)))


def pack_tasks(tasks: Sequence[GroupTask], slots: int | None) -> list[list[int]]:
    """The part tasks (largest first) dealt into at most ``slots`` Spark partitions, each to the one
    with the fewest rows so far: a Python task costs ~0.1 s even with no work, so a local master
    runs one per core; without a known slot count, one partition per task. Among partitions within
    a quarter of the task's rows of the lightest, the one with the fewest parts of the task's table:
    a row costs alike in every part of a table, not across tables (widths and schema epochs differ;
    1.4x between bench-quick's two tables), so each partition is better off with a mix."""
    if slots is None or slots >= len(tasks):
        return [[i] for i in range(len(tasks))]
    bins: list[list[int]] = [[] for _ in range(slots)]
    load = [0] * slots
    for i, task in enumerate(tasks):
        near = [b for b in range(slots) if load[b] <= min(load) + task.weight // 4]
        least = min(near, key=lambda b: (sum(tasks[j].table_uuid == task.table_uuid for j in bins[b]), load[b], b))
        bins[least].append(i)
        load[least] += task.weight + 1
    return [b for b in bins if b]


def parsed_lines(spark: Any, segment: SealedSegment) -> Any:
    """(line, text, op, t, table_uuid) of every event line of a segment, parsed in the JVM."""
    from pyspark.sql import functions as F

    chunks = _chunks(segment)
    tasks = spark.createDataFrame(
        [(str(segment.ref.path.absolute()), i) for i in range(chunks)], "path string, chunk int"
    )
    if chunks > 1:
        tasks = tasks.repartition(chunks)
    lines = tasks.mapInArrow(_split_lines(segment.body_bytes, chunks), "line bigint, text binary")
    envelope = F.from_json(F.col("text").cast("string"), "op string, t bigint, table_uuid string")
    return lines.select("line", "text", envelope.alias("e")).select(
        "line",
        "text",
        F.col("e.op").alias("op"),
        F.col("e.t").alias("t"),
        F.col("e.table_uuid").alias("table_uuid"),
        F.coalesce(F.col("e.op").isin(*ROW_OPS) & F.col("e.table_uuid").isNotNull(), F.lit(False)).alias("is_row"),
    )


def route(spark: Any, parsed: Any) -> tuple[list[tuple[int, bytes]], list[tuple[str, int, int]]]:
    """One action: the non-row records (line, text) and per touched table (uuid, rows, max t).

    One aggregation over one scan of the parsed lines (a union of two branches would let two
    concurrent stages both parse the segment before its cache is filled): row events group by
    table; the few other records gather in the group without a table.
    """
    from pyspark.sql import functions as F

    row = F.col("is_row")
    grouped = parsed.groupBy(F.when(row, F.col("table_uuid")).alias("table_uuid")).agg(
        F.count(F.when(row, F.lit(1))).alias("n"),
        F.max(F.when(row, F.col("t"))).alias("max_t"),
        F.collect_list(F.when(~row, F.struct("line", "text"))).alias("records"),
    )
    records, touched = [], []
    for r in grouped.collect():
        records += [(int(x["line"]), bytes(x["text"])) for x in r["records"]]
        if r["table_uuid"] is not None:
            touched.append((r["table_uuid"], int(r["n"]), r["max_t"]))
    records.sort()
    return records, sorted(touched)


def plan_frames(
    segment: SealedSegment,
    records: Sequence[tuple[int, bytes]],
    touched: Sequence[tuple[str, int, int | None]],
    schema: SchemaState,
    state: CatalogState,
) -> SegmentFramePlan:
    """Replay the schema records into per-table epochs (the driver's only per-record work)."""
    name = segment.ref.name
    entries: list[SchemaHistoryEntry] = []
    backfills: dict[str, TablePlan] = {}
    epoch_lines, states = [0], [schema]
    error: MalformedRecordError | None = None
    current = schema
    for line, text in records:
        try:
            event = parse_line(text, segment=name, line=line)
            if isinstance(event, Close) or not is_schema_change(event):
                if not isinstance(event, Close):  # a row event the JVM could not route (bad envelope)
                    raise MalformedRecordError("row event without a usable table_uuid", segment=name, line=line)
                continue
            current = _apply_schema(current, event, name, line, entries, backfills)
        except MalformedRecordError as exc:
            error = exc
            break
        epoch_lines.append(line)
        states.append(current)
    uuids = sorted({u for u, _, _ in touched} | set(backfills))
    counts = {u: (n, max_t) for u, n, max_t in touched}
    tables = []
    prior_as_of = state.frontier + 1
    for uuid in uuids:
        plan = backfills.get(uuid)
        n, max_t = counts.get(uuid, (0, None))
        selection = select_files(state, uuid, prior_as_of)
        tables.append(
            TableWork(
                table_uuid=uuid,
                epoch_lines=tuple(epoch_lines),
                epochs=tuple(s.tables.get(uuid) for s in states),
                supercolumns_before=tuple(schema.supercolumns.get(uuid, ())),
                supercolumns_after=tuple(current.supercolumns.get(uuid, ())),
                backfills=tuple(plan.backfills) if plan else (),
                rows=n,
                max_t=max_t,
                files=selection.snapshot + selection.versions,
                snapshot_as_of=selection.snapshot_as_of,
            )
        )
    return SegmentFramePlan(segment, tuple(entries), current, tuple(tables), error)


# --- stage 2: decode, prior image, validate -------------------------------------------------


def _value_ddl(supercolumns: Sequence[Supercolumn]) -> list[str]:
    """``v<i> <spark type>`` of each supercolumn's carrier."""
    from pyspark.sql.pandas.types import from_arrow_type

    return [f"v{i} {from_arrow_type(carrier_type(arrow_type(s.data_type))).simpleString()}"
            for i, s in enumerate(supercolumns)]


def _row_schema(supercolumns: Sequence[Supercolumn]) -> pa.Schema:
    """The Arrow schema of decoded rows as the decoders yield them."""
    fields = [("line", pa.int64()), ("t", pa.int64()), ("kind", pa.string()), ("key", pa.int64()),
              ("error_class", pa.string()), ("reason", pa.string())]
    fields += [(f"v{i}", carrier_type(arrow_type(s.data_type))) for i, s in enumerate(supercolumns)]
    fields += [(f"s{i}", pa.bool_()) for i in range(len(supercolumns))]
    return pa.schema(fields)


def _row_ddl(supercolumns: Sequence[Supercolumn]) -> str:
    fields = ["line bigint", "t bigint", "kind string", "key bigint", "error_class string", "reason string"]
    fields += _value_ddl(supercolumns)
    fields += [f"s{i} boolean" for i in range(len(supercolumns))]
    return ", ".join(fields)


def _value_columns(values: list[list[Any]], supercolumns: Sequence[Supercolumn]) -> list[pa.Array]:
    out = []
    for column, s in zip(values, supercolumns, strict=True):
        t = arrow_type(s.data_type)
        items = column if arrow_native(s.data_type) else [to_arrow_value(s.data_type, v) for v in column]
        out.append(to_carrier(pa.array(items, t), t))
    return out


def _epochs(work: TableWork) -> list[Epoch]:
    index = {s.name: i for i, s in enumerate(work.supercolumns_after)}
    out = []
    for table in work.epochs:
        if table is None:
            out.append(Epoch(None, {}, frozenset(), {}))
            continue
        by_uuid = {c.column_uuid: (c, index[c.supercolumn]) for c in table.columns}
        defaults = {index[c.supercolumn]: c.default_value() for c in table.columns if c.default is not None}
        out.append(Epoch(table, by_uuid, frozenset(i for _, i in by_uuid.values()), defaults))
    return out


def _decoder(
    work: TableWork, segment: str, fast: bool = True
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """An Arrow UDF: (line, text) rows of one table in, decoded and checked mutations out.

    Rows in the writer's canonical form are decoded as Arrow kernels (``vector_decode``); the
    others (and every row with ``fast=False``) by the reference decoder, row by row."""
    supercolumns = work.supercolumns_after

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        epochs = _epochs(work)
        for batch in batches:
            if not batch.num_rows:
                continue
            rest = batch
            if fast:
                decoded, left = decode_canonical(
                    batch.column(0), batch.column(1), work.table_uuid, work.epoch_lines, epochs, supercolumns
                )
                if decoded is not None and decoded.num_rows:
                    yield decoded
                if not len(left):
                    continue
                rest = batch.take(pa.array(left))
            yield _reference_batch(rest, epochs, work, segment)

    return decode


def _reference_batch(batch: pa.RecordBatch, epochs: Sequence[Epoch], work: TableWork, segment: str) -> pa.RecordBatch:
    """The reference decoder (``parse_line`` and ``decode_value``, row by row) over one batch."""
    supercolumns = work.supercolumns_after
    width = len(supercolumns)
    lines, texts = batch.column(0).to_pylist(), batch.column(1).to_pylist()
    n = len(lines)
    ts: list[Any] = [None] * n
    kinds: list[Any] = [None] * n
    keys: list[Any] = [None] * n
    classes: list[Any] = [None] * n
    reasons: list[Any] = [None] * n
    values: list[list[Any]] = [[None] * n for _ in range(width)]
    sets: list[list[bool]] = [[False] * n for _ in range(width)]
    for r, (line, text) in enumerate(zip(lines, texts, strict=True)):
        try:
            event = parse_line(text, segment=segment, line=line)
            epoch = epochs[bisect.bisect_left(work.epoch_lines, line) - 1]
            kind = _KINDS[type(event)]
            table = epoch.table
            if table is None:
                raise HistoryConflictError(
                    f"{kind} into unknown table {event.table_uuid}", segment=segment, line=line
                )
            ts[r], kinds[r], keys[r] = event.t, kind, event.key
            if kind == "delete":
                continue
            given = _decode_values(event, epoch, table, segment, line)
            for i in range(width):
                if i in given:
                    values[i][r] = given[i]
                    sets[i][r] = True
                elif i not in epoch.in_force:
                    sets[i][r] = True  # not in force at this event: NULL in its image
                elif kind == "insert":
                    values[i][r] = epoch.defaults.get(i)
                    sets[i][r] = True
            if kind == "insert":
                for c, i in epoch.by_uuid.values():
                    if not c.is_nullable and values[i][r] is None:
                        raise HistoryConflictError(
                            f"insert into {table.table_name} leaves NOT NULL column {c.column_name} empty",
                            segment=segment,
                            line=line,
                        )
        except MalformedRecordError as exc:
            ts[r] = kinds[r] = keys[r] = None
            classes[r], reasons[r] = type(exc).__name__, exc.reason
            for i in range(width):
                values[i][r], sets[i][r] = None, False
    arrays = [
        pa.array(lines, pa.int64()), pa.array(ts, pa.int64()), pa.array(kinds, pa.string()),
        pa.array(keys, pa.int64()), pa.array(classes, pa.string()), pa.array(reasons, pa.string()),
    ]
    arrays += _value_columns(values, supercolumns)
    arrays += [pa.array(s, pa.bool_()) for s in sets]
    return pa.RecordBatch.from_arrays(arrays, names=row_names(width))


def _decode_values(event: Any, epoch: Epoch, table: TableDescriptor, segment: str, line: int) -> dict[int, Any]:
    given: dict[int, Any] = {}
    for column_uuid, raw in event.values.items():
        found = epoch.by_uuid.get(column_uuid)
        if found is None:
            raise HistoryConflictError(
                f"table {table.table_name} has no column {column_uuid} at t={event.t}", segment=segment, line=line
            )
        column, index = found
        try:
            value = decode_value(column.data_type, raw)
        except ValueTypeError as exc:
            raise HistoryConflictError(
                f"column {column.column_name} ({column_uuid}) of table {table.table_name}: {exc}",
                segment=segment,
                line=line,
            ) from None
        if value is None and not column.is_nullable:
            raise HistoryConflictError(
                f"column {column.column_name} of table {table.table_name} is NOT NULL", segment=segment, line=line
            )
        given[index] = value
    return given


def _files_of_keys(files: Sequence[FileEntry], keys: pa.Array | None) -> list[FileEntry]:
    """The files whose key range (catalog statistics) may hold one of ``keys`` (all without keys):
    a snapshot in many pieces is then opened piece by piece only where the part's keys are."""
    if keys is None or not len(keys):
        return list(files)
    bounds = pc.min_max(keys)
    return [f for f in files if may_hold_keys(f, bounds["min"].as_py(), bounds["max"].as_py())]


def _prior_batches(
    work: TableWork, store: Any, as_of: int, files: Sequence[tuple[str, int | None]], keys: pa.Array | None = None
) -> Iterator[pa.RecordBatch]:
    """(key, t, is_deleted, v<i>) of the versions ``files`` hold below ``as_of`` (only ``keys``'
    when given), each file read from ``lower`` on (a snapshot's from its start)."""
    import pyarrow.dataset as ds

    before = work.supercolumns_before
    after = work.supercolumns_after
    before_names = {s.name for s in before}
    fs, _ = store.arrow_filesystem()
    schema = supertable_schema(before)
    for path, lower in files:
        expr = ds.field(LT) < as_of
        if lower is not None:
            expr = expr & (ds.field(LT) >= lower)
        if keys is not None and len(keys):
            # the range first: row groups outside it are skipped by their statistics
            bounds = pc.min_max(keys)
            expr = expr & (ds.field(KEY) >= bounds["min"]) & (ds.field(KEY) <= bounds["max"])
            expr = expr & ds.field(KEY).isin(keys)
        elif keys is not None:
            continue
        dataset = ds.dataset([store.full_path(path)], schema=schema, format="parquet", filesystem=fs)
        for part in dataset.to_batches(filter=expr):
            if part.num_rows == 0:
                continue
            arrays = [part.column(KEY), part.column(LT), part.column(DELETED)]
            for s in after:
                t = arrow_type(s.data_type)
                if s.name in before_names:
                    arrays.append(to_carrier(part.column(s.name), t))
                else:
                    arrays.append(pa.nulls(part.num_rows, carrier_type(t)))
            yield pa.RecordBatch.from_arrays(
                arrays, names=["key", "t", "is_deleted"] + [f"v{i}" for i in range(len(after))]
            )


def _prior_reader(
    work: TableWork, config: dict[str, Any], as_of: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """An Arrow UDF: (path, lower) rows in, the versions those files hold below ``as_of`` out."""

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = open_executor_store(config)
        for batch in batches:
            files = list(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True))
            yield from _prior_batches(work, store, as_of, files)

    return read


def _prior_fold_rows(work: TableWork, prior: pa.RecordBatch) -> pa.RecordBatch:
    """Prior versions as fold rows: line 0, kind ``prior`` (``gone`` for a delete), set where the
    supercolumn existed before the segment (what ``prior_rows`` selects in Spark)."""
    n = prior.num_rows
    before_names = {s.name for s in work.supercolumns_before}
    width = len(work.supercolumns_after)
    kind = pc.if_else(prior.column("is_deleted"), pa.scalar(GONE), pa.scalar(PRIOR))
    arrays = [pa.array(np.zeros(n, np.int64)), prior.column("t"), kind, prior.column("key"),
              pa.nulls(n, pa.string()), pa.nulls(n, pa.string())]
    arrays += [prior.column(f"v{i}") for i in range(width)]
    arrays += [pa.array(np.full(n, s.name in before_names)) for s in work.supercolumns_after]
    return pa.RecordBatch.from_arrays(arrays, names=row_names(width))


def prior_rows(spark: Any, work: TableWork, ctx: FrameContext) -> Any:
    """The table's versions before this segment (snapshot and later versions), as fold rows."""
    from pyspark.sql import functions as F

    after = work.supercolumns_after
    before_names = {s.name for s in work.supercolumns_before}
    ddl = ", ".join(["key bigint", "t bigint", "is_deleted boolean", *_value_ddl(after)])
    rows = [(f.path, None if f.kind is FileKind.SNAPSHOT else work.snapshot_as_of) for f in work.files]
    paths = spark.createDataFrame(rows, "path string, lower bigint")
    if len(rows) > 1:
        paths = paths.repartition(min(len(rows), 8))
    versions = paths.mapInArrow(_prior_reader(work, ctx.store_config, ctx.prior_as_of), ddl)
    return versions.select(
        F.lit(0).cast("bigint").alias("line"), "t",
        F.when(F.col("is_deleted"), F.lit(GONE)).otherwise(F.lit(PRIOR)).alias("kind"), "key",
        F.lit(None).cast("string").alias("error_class"), F.lit(None).cast("string").alias("reason"),
        *[F.col(f"v{i}") for i in range(len(after))],
        *[F.lit(s.name in before_names).alias(f"s{i}") for i, s in enumerate(after)],
    )


# --- stage 3: fold and write ---------------------------------------------------------------


def _stats_row(e: FileEntry) -> dict[str, Any]:
    return {
        "path": e.path, "kind": e.kind.value, "table_uuid": e.table_uuid, "size_bytes": e.size_bytes,
        "row_count": e.row_count, "min_t": e.min_t, "max_t": e.max_t, "min_key": e.min_key,
        "max_key": e.max_key, "snapshot_as_of": e.snapshot_as_of,
        "line": None, "key": None, "error_class": None, "reason": None,
    }


def _write_part(work: TableWork, ctx: FrameContext, upper: int, data: pa.Table, kind: FileKind,
                snapshot_as_of: int | None) -> FileEntry:
    """Write one folded file of a part (versions or a snapshot) through the object-store layer."""
    after = work.supercolumns_after
    schema = supertable_schema(after)
    columns = [data.column("key"), data.column("is_deleted"), data.column("t")]
    columns += [from_carrier(data.column(f"v{i}"), arrow_type(s.data_type)) for i, s in enumerate(after)]
    meta = FileMetadata(
        database=ctx.database, table_uuid=work.table_uuid, kind=kind, txn_id=ctx.txn_hint,
        lower=ctx.prior_as_of, upper=upper, segments=(ctx.segment_id,), snapshot_as_of=snapshot_as_of,
        attempt=ctx.attempt,
    )
    path = new_file_path(ctx.database, work.table_uuid, kind, ctx.txn_hint)
    return write_parquet(open_executor_store(ctx.store_config), path,
                         pa.Table.from_arrays(columns, schema=schema), meta)


def _fold_out(
    work: TableWork, ctx: FrameContext, upper: int, rows: pa.Table, images: bool = False
) -> tuple[list[dict[str, Any]], Any]:
    """Fold one part's rows (prior image included) and write its files: the output rows (files'
    statistics, or its first failing line and nothing written) and the fold itself."""
    after = work.supercolumns_after
    index = {s.name: i for i, s in enumerate(after)}
    backfills = [(b, index[b.target.name], None if b.source is None else index[b.source.name]) for b in work.backfills]
    folded = fold(rows, len(after), backfills, images)
    if folded.failure is not None:
        f = folded.failure
        return [{**{c: None for c in _STATS}, "line": f.line, "key": f.key, "error_class": f.error_class,
                 "reason": f.reason}], folded
    out = []
    if folded.versions.num_rows:
        out.append(_stats_row(_write_part(work, ctx, upper, folded.versions, FileKind.VERSIONS, None)))
    for as_of, snapshot in folded.snapshots:
        if snapshot.num_rows:
            out.append(_stats_row(_write_part(work, ctx, upper, snapshot, FileKind.SNAPSHOT, as_of)))
    return out, folded


def _folder(
    work: TableWork, ctx: FrameContext, upper: int, read_prior: bool = False, all_keys: bool = False
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """An Arrow UDF: one part's rows (whole keys), sorted by (key, t, line), in; the statistics of the
    files written from it out, or its first failing line (then nothing is written). With
    ``read_prior`` it reads the prior image of its own keys from the table's files first (a
    semi-join in Arrow: no Spark job of its own, no persisted frame), or of every key with
    ``all_keys`` (a backfill), then even without rows of its own."""
    after = work.supercolumns_after

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts = [b for b in batches if b.num_rows]
        if not parts and not (read_prior and all_keys):
            return
        rows = pa.Table.from_batches(parts) if parts else _row_schema(after).empty_table()
        if read_prior:
            keys = None if all_keys else pc.unique(pc.drop_null(rows.column("key")).combine_chunks())
            files = [(f.path, None if f.kind is FileKind.SNAPSHOT else work.snapshot_as_of)
                     for f in _files_of_keys(work.files, keys)]
            prior = [_prior_fold_rows(work, b) for b in _prior_batches(
                work, open_executor_store(ctx.store_config), ctx.prior_as_of, files, keys)]
            if prior:  # fold sorts by (key, t, line) itself
                rows = pa.concat_tables([pa.Table.from_batches(prior).cast(rows.schema), rows])
        out, _ = _fold_out(work, ctx, upper, rows)
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=OUT_SCHEMA)

    return run


# --- the segment -------------------------------------------------------------------------


@dataclass(frozen=True)
class FrameOutcome:
    """Files written (with statistics) and, when the segment is bad, its first failing line."""

    entries: tuple[FileEntry, ...]
    versions: int
    error: MalformedRecordError | None


_STATS = ("path", "kind", "table_uuid", "size_bytes", "row_count", "min_t", "max_t", "min_key", "max_key",
          "snapshot_as_of")
_ERRORS = ("line", "key", "error_class", "reason")


def table_frame(
    spark: Any, work: TableWork, parsed: Any, ctx: FrameContext, segment: SealedSegment, parts: int
) -> Any:
    """One table's plan on a segment Spark's JSON reader routed; returns the (statistics, failure)
    rows of its parts: the table's parsed lines are decoded, spread over ``parts`` by a hash of the
    key, sorted, and folded and written per part, the prior image read by the fold tasks too, or
    in Spark for a backfill (every live key)."""
    from pyspark.sql import functions as F

    upper = (work.max_t + 1) if work.max_t is not None else ctx.prior_as_of
    rows = parsed.filter(F.col("is_row") & (F.col("table_uuid") == work.table_uuid)).select("line", "text")
    union = rows.mapInArrow(_decoder(work, segment.ref.name), _row_ddl(work.supercolumns_after))
    if work.files and work.backfills:
        union = prior_rows(spark, work, ctx).unionByName(union)
        parts = 1  # as the task engine: a backfilled table is not split
    # hashed, not by key range: range bounds cost a sampling job that decodes once more (the
    # task engine splits by key modulo too, so its files span the key range alike)
    spread = union.repartition(1) if parts == 1 else union.repartition(parts, "key")
    folder = _folder(work, ctx, upper, read_prior=bool(work.files) and not work.backfills)
    return spread.sortWithinPartitions("key", "t", "line").mapInArrow(folder, OUT_DDL)


def run_segment(
    spark: Any, plan: SegmentFramePlan, parsed: Any, ctx: FrameContext, files_per_table: Callable[[int], int]
) -> FrameOutcome:
    """A segment Spark's JSON reader routed (``parsed``): one action validates, folds and writes
    every touched table (one frame per table, unioned) and returns the files' statistics with the
    smallest failing line, if any (then the caller discards the files). Segments routed on the
    driver run as groups (``run_group``)."""
    frames = [table_frame(spark, w, parsed, ctx, plan.segment, files_per_table(w.rows)) for w in plan.tables]
    rows = _union(frames).collect() if frames else []
    return _outcome(plan, rows, ctx.segment_id)


def _union(frames: Sequence[Any]) -> Any:
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


def _entry(r: Any, segment_id: int) -> FileEntry:
    return FileEntry(
        path=r["path"], kind=FileKind(r["kind"]), table_uuid=r["table_uuid"], size_bytes=int(r["size_bytes"]),
        row_count=int(r["row_count"]), min_t=r["min_t"], max_t=r["max_t"], min_key=r["min_key"],
        max_key=r["max_key"], segments=(segment_id,), snapshot_as_of=r["snapshot_as_of"],
    )


# --- several pending segments in one Spark job ------------------------------------------------

#: pending segments routed on the driver run as one Spark job while a group holds at most this many
#: segments and row events (a job costs ~0.15-0.3 s of fixed cost however little it does)
MAX_GROUP_SEGMENTS = 16
MAX_GROUP_ROWS = 1_000_000
#: the per-task carry names a supercolumn's values this way (apart from key, t, is_deleted)
_CARRY = "c:"


@dataclass(frozen=True)
class GroupMember:
    """One segment of a group: its plan (made from the schema the segments before it leave, and the
    catalog at the group's start), where its row events are, and its own file context."""

    plan: SegmentFramePlan
    routed: Routed
    ctx: FrameContext


@dataclass(frozen=True)
class GroupStep:
    """A (table, key part)'s share of one segment of a group: the table's route file (None when
    the segment has a backfill of the table but no row of it); the task keeps its part's rows."""

    member: int
    work: TableWork
    route: RouteTable | None
    upper: int


@dataclass(frozen=True)
class GroupTask:
    """One (table, key part) through the segments of a group in order: the prior image of all its
    keys is read once from the files at the group's start, then the folded state (each key's
    newest version) is carried from segment to segment inside the task."""

    table_uuid: str
    files: tuple[FileEntry, ...]
    snapshot_as_of: int | None
    supercolumns: tuple[Supercolumn, ...]  # what the files at the group's start may hold
    steps: tuple[GroupStep, ...]
    all_keys: bool  # a backfill in the group: the part carries every live key of its own
    part: int = 0
    parts: int = 1
    cuts: tuple[int, ...] | None = None
    estimate: int | None = None  # its row events as the routed key samples tell, when they do

    @property
    def weight(self) -> int:
        """Its row events in all segments (how ``pack_tasks`` balances partitions; the driver does
        not read the route files): from the key samples, else an equal share of its table's."""
        if self.estimate is not None:
            return self.estimate
        return sum(s.route.rows for s in self.steps if s.route is not None) // self.parts

    def rows(self, step: GroupStep) -> RowLines:
        """This part's rows of one step, read from its route file."""
        if step.route is None:
            return RowLines(*(np.zeros(0, np.int64) for _ in range(4)))
        rows = step.route.load()
        return rows if self.parts == 1 else rows.take(part_of_keys(rows.keys, self.parts, self.cuts) == self.part)


def group_tasks(members: Sequence[GroupMember], files_per_table: Callable[[int], int]) -> list[GroupTask]:
    """The (table, key part) tasks of a group: a table keeps one split for the whole group (parts
    from its largest share; key ranges holding equal shares of the group's row events of the
    table, from the routed key samples (``balanced_cuts``); without samples, equal key ranges of
    its files at the group's start (``key_cuts``), or of the group's own keys when it has no files
    yet), so a task owns the same keys in every segment. A table with a backfill in the group
    carries every live key of its part, and its backfill's snapshot is one piece per part; the
    largest first."""
    tasks = []
    for uuid in sorted({w.table_uuid for m in members for w in m.plan.tables}):
        shares = [(i, w) for i, m in enumerate(members) for w in m.plan.tables if w.table_uuid == uuid]
        first = shares[0][1]
        all_keys = any(w.backfills for _, w in shares)
        parts = files_per_table(max(w.rows for _, w in shares))
        routes = [members[i].routed.tables[uuid] for i, _ in shares if uuid in members[i].routed.tables]
        samples = [(members[i].routed.samples[uuid], members[i].routed.tables[uuid].rows)
                   for i, _ in shares if uuid in members[i].routed.samples]
        # inserts past the files' keys (or keys crowded in a corner) would leave equal widths lopsided
        balanced = balanced_cuts(samples, parts)  # None below two parts
        estimates: list[int | None] = [None] * parts
        if balanced is not None:
            cuts, counts = balanced
            parts = len(cuts) + 1
            estimates = list(counts)
        else:
            cuts = key_cuts(first.files, parts) if parts > 1 else None
        if parts > 1 and not cuts:  # no files yet: ranges of the group's own keys
            if routes:
                cuts = equal_cuts(min(r.min_key for r in routes), max(r.max_key for r in routes), parts)
            else:  # a part's snapshot piece must be a key range
                parts = 1
        steps = []
        for i, work in shares:
            route = members[i].routed.tables.get(uuid)
            if route is not None or work.backfills:
                upper = (work.max_t + 1) if work.max_t is not None else members[i].ctx.prior_as_of
                steps.append(GroupStep(i, work, route, upper))
        if steps:
            tasks += [GroupTask(uuid, first.files, first.snapshot_as_of, first.supercolumns_before, tuple(steps),
                                all_keys, part, parts, cuts or None, estimates[part]) for part in range(parts)]
    return sorted(tasks, key=lambda task: -task.weight)


def _files_of_part(task: GroupTask) -> list[FileEntry]:
    """The prior files whose key range may hold a key of the task's part (all without cuts)."""
    if task.cuts is None:
        return list(task.files)
    low = task.cuts[task.part - 1] if task.part > 0 else -(2**63)
    high = task.cuts[task.part] - 1 if task.part < len(task.cuts) else 2**63 - 1
    return [f for f in task.files if may_hold_keys(f, low, high)]


def _carry_of(table: pa.Table, supercolumns: Sequence[Supercolumn]) -> pa.Table:
    """Versions (``key, is_deleted, t, v<i>``) as carry rows: values named by supercolumn."""
    columns = {"key": table.column("key"), "t": table.column("t"), "is_deleted": table.column("is_deleted")}
    columns |= {_CARRY + s.name: table.column(f"v{i}") for i, s in enumerate(supercolumns)}
    return pa.table(columns)


#: each key's newest carried row (a delete included: the key is then gone)
_newest = partial(keep_latest, include_deleted=True, key="key", t="t", deleted="is_deleted")


def _carried_prior(work: TableWork, carry: pa.Table, keys: pa.Array | None) -> pa.Table | None:
    """The carried newest versions of ``keys`` (every key with None) as prior fold rows in
    ``work``'s layout."""
    mine = carry if keys is None else carry.filter(pc.is_in(carry.column("key"), keys))
    if not mine.num_rows:
        return None
    before = {s.name for s in work.supercolumns_before}
    arrays = [mine.column("key").combine_chunks(), mine.column("t").combine_chunks(),
              mine.column("is_deleted").combine_chunks()]
    for s in work.supercolumns_after:
        name = _CARRY + s.name
        if s.name in before and name in mine.column_names:
            arrays.append(mine.column(name).combine_chunks())
        else:
            arrays.append(pa.nulls(mine.num_rows, carrier_type(arrow_type(s.data_type))))
    names = ["key", "t", "is_deleted"] + [f"v{i}" for i in range(len(work.supercolumns_after))]
    return pa.Table.from_batches([_prior_fold_rows(work, pa.RecordBatch.from_arrays(arrays, names=names))])


def _run_group_task(task: GroupTask, members: Sequence[tuple[str, str, FrameContext]]) -> Iterator[dict[str, Any]]:
    """One group task: per segment in order its lines decoded and folded onto the carried state,
    its files written; output rows name their segment. It stops at its first failing segment:
    what it would fold after that depends on the failing one."""
    store_config = members[0][2].store_config
    lines = [task.rows(step) for step in task.steps]
    keys = None if task.all_keys else pc.unique(pa.chunked_array([pa.array(r.keys) for r in lines]).combine_chunks())
    carry = pa.table({"key": pa.array([], pa.int64()), "t": pa.array([], pa.int64()),
                      "is_deleted": pa.array([], pa.bool_())})
    if task.files:
        reader = replace(task.steps[0].work, supercolumns_before=task.supercolumns,
                         supercolumns_after=task.supercolumns, snapshot_as_of=task.snapshot_as_of)
        chosen = _files_of_keys(task.files, keys) if keys is not None else _files_of_part(task)
        files = [(f.path, None if f.kind is FileKind.SNAPSHOT else task.snapshot_as_of) for f in chosen]
        read = [_carry_of(pa.Table.from_batches([b]), task.supercolumns) for b in _prior_batches(
            reader, open_executor_store(store_config), members[0][2].prior_as_of, files, keys)]
        if read:
            carry = _newest(pa.concat_tables(read))
            if task.parts > 1:  # every live key of this part only
                of = part_of_keys(np.asarray(carry.column("key").combine_chunks()), task.parts, task.cuts)
                carry = carry.filter(pa.array(of == task.part))
    for step, rows_of_step in zip(task.steps, lines, strict=True):
        path, name, ctx = members[step.member]
        work = step.work
        if not len(rows_of_step.lines) and not work.backfills:
            continue
        decoded = list(_decoder(work, name)(_coalesced(_read_lines(path, rows_of_step), DECODE_BYTES)))
        rows = pa.Table.from_batches(decoded) if decoded else _row_schema(work.supercolumns_after).empty_table()
        # a backfill folds every live key; otherwise only the step's own keys' images are needed
        step_keys = None if work.backfills else pc.unique(pc.drop_null(rows.column("key")).combine_chunks())
        prior = _carried_prior(work, carry, step_keys)
        if prior is not None:
            rows = pa.concat_tables([prior.cast(rows.schema), rows])
        out, folded = _fold_out(work, ctx, step.upper, rows, images=bool(work.backfills))
        yield from ({**row, "segment_id": ctx.segment_id} for row in out)
        if folded.failure is not None:
            return
        if folded.images is not None:  # after a backfill the images, not the versions, hold its values
            carry = _carry_of(folded.images, work.supercolumns_after)
        elif folded.versions.num_rows:
            # a step's versions are newer than anything carried: its keys' rows are replaced, no sort
            # of the whole carry (every touched key of the part) per step
            newest = _newest(_carry_of(folded.versions, work.supercolumns_after))
            kept = carry.filter(pc.invert(pc.is_in(carry.column("key"), value_set=newest.column("key"))))
            carry = pa.concat_tables([kept, newest], promote_options="default")


GROUP_OUT_SCHEMA = OUT_SCHEMA.append(pa.field("segment_id", pa.int64()))
GROUP_OUT_DDL = OUT_DDL + ", segment_id bigint"


def _group_runner(
    tasks: Sequence[GroupTask], packed: Sequence[Sequence[int]], members: Sequence[tuple[str, str, FrameContext]]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """An Arrow UDF: partition indexes in; the group tasks of the partition run, their rows out."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in (i for p in batch.column(0).to_pylist() for i in packed[p]):
                out = list(_run_group_task(tasks[index], members))
                if out:
                    yield pa.RecordBatch.from_pylist(out, schema=GROUP_OUT_SCHEMA)

    return run


def run_group(
    spark: Any, members: Sequence[GroupMember], files_per_table: Callable[[int], int]
) -> list[FrameOutcome]:
    """One Spark job folds and writes every segment of a group; per segment, in order, its files'
    statistics and its smallest failing line. Only the outcomes before the first failing segment
    are complete (a task stops at its failing segment); the caller commits those one by one."""
    tasks = group_tasks(members, files_per_table)
    packed = pack_tasks(tasks, local_slots(spark))
    shared = [(str(m.plan.segment.ref.path.absolute()), m.plan.segment.ref.name, m.ctx) for m in members]
    rows = []
    if tasks:
        rows = spark.range(0, len(packed), 1, len(packed)).mapInArrow(
            _group_runner(tasks, packed, shared), GROUP_OUT_DDL).collect()
    return [_outcome(m.plan, [r for r in rows if r["segment_id"] == m.ctx.segment_id], m.ctx.segment_id)
            for m in members]


def _outcome(plan: SegmentFramePlan, rows: Sequence[Any], segment_id: int) -> FrameOutcome:
    """A segment's files and its smallest failing line (a task's or the driver's) from output rows."""
    entries = [_entry(r, segment_id) for r in rows if r["path"] is not None]
    failures = sorted((r for r in rows if r["error_class"] is not None),
                      key=lambda r: (r["line"], -1 if r["key"] is None else r["key"]))
    error = None
    if failures:
        row = failures[0]
        error = ERROR_CLASSES.get(row["error_class"], MalformedRecordError)(
            row["reason"], segment=plan.segment.ref.name, line=int(row["line"])
        )
    if plan.error is not None and (error is None or (plan.error.line or 0) <= (error.line or 0)):
        error = plan.error
    if plan.order_error is not None:
        # as in-process: a line that does not parse (anywhere) is reported before the order, which
        # is checked before everything else; the order check stops at the first unreadable record,
        # the tasks' parse errors are the rows' (exact MalformedRecordError class)
        unreadable = [r for r in failures if r["error_class"] == MalformedRecordError.__name__]
        if plan.error is not None and type(plan.error) is MalformedRecordError:
            error = plan.error
        elif unreadable:
            row = unreadable[0]
            error = MalformedRecordError(row["reason"], segment=plan.segment.ref.name, line=int(row["line"]))
        else:
            error = plan.order_error
    versions = sum(e.row_count for e in entries if e.kind is FileKind.VERSIONS)
    return FrameOutcome(tuple(sorted(entries, key=lambda e: e.path)), versions, error)
