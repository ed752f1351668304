"""The WAL writer: one per database at a time, appending to one open segment.

Ordering rules it enforces at ``append`` (refusing a bad event writes nothing):

* timestamps never go backwards;
* nothing at or below a closed timestamp is accepted;
* a schema change has a timestamp of its own (no other event shares it).

A segment begins with a ``close`` (its lower bound) and is sealed only right
after a ``close`` (its upper bound): size or age rotation waits for the next
``close``; an explicit ``seal()`` when the last record is not a ``close`` is
a :class:`SealError`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from history_pipeline.errors import (
    InputRecordError,
    MalformedRecordError,
    SealError,
    TimestampOrderError,
    WriterLockedError,
)
from history_pipeline.events import (
    GENESIS_T,
    Close,
    Event,
    Insert,
    Update,
    event_to_line,
    is_schema_change,
    parse_event,
    parse_line,
)
from history_pipeline.wal.journal import note_change
from history_pipeline.wal.segments import (
    SegmentRef,
    SegmentState,
    fsync_dir,
    list_segments,
    sealing_line,
    segment_name,
    segments_dir,
)

DEFAULT_MAX_SEGMENT_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_SEGMENT_AGE_S = 300.0


@dataclass(frozen=True)
class WalPosition:
    """What the log has promised so far: the ordering state a new event is checked against."""

    closed_t: int = GENESIS_T
    last_event_t: int | None = None
    last_event_was_schema: bool = False
    last_record_is_close: bool = True

    def admit(self, event: Event) -> WalPosition:
        """The position after ``event``, or a :class:`TimestampOrderError` saying why not."""
        return self.admit_kind(event.t, isinstance(event, Close), is_schema_change(event))

    def admit_kind(self, t: int, close: bool, schema: bool) -> WalPosition:
        """``admit`` for an event known by its timestamp and kind only (a close record, a schema
        change or a row event): the compaction's array check names a line's rule this way."""
        if close:
            if t < self.closed_t:
                raise TimestampOrderError(f"close t={t} is below the closed timestamp {self.closed_t}")
            if self.last_event_t is not None and t < self.last_event_t:
                raise TimestampOrderError(f"close t={t} is below the last event's timestamp {self.last_event_t}")
            return WalPosition(t, self.last_event_t, self.last_event_was_schema, True)
        if t <= self.closed_t:
            raise TimestampOrderError(
                f"t={t} is at or below the closed timestamp {self.closed_t}: no event may follow there"
            )
        if self.last_event_t is not None:
            if t < self.last_event_t:
                raise TimestampOrderError(f"t={t} goes backwards (last event had t={self.last_event_t})")
            if t == self.last_event_t and (schema or self.last_event_was_schema):
                raise TimestampOrderError(
                    f"t={t} is shared with the previous event, but a schema change needs a timestamp of its own"
                )
        return WalPosition(self.closed_t, t, schema, False)


class WalWriter:
    """Appends events to a database's WAL. Use as a context manager."""

    def __init__(
        self,
        wal_dir: Path | str,
        *,
        max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES,
        max_segment_age_s: float = DEFAULT_MAX_SEGMENT_AGE_S,
    ):
        self.wal_dir = Path(wal_dir)
        self.max_segment_bytes = max_segment_bytes
        self.max_segment_age_s = max_segment_age_s
        segments_dir(self.wal_dir).mkdir(parents=True, exist_ok=True)
        self._lock_fd = _acquire_lock(self.wal_dir / "LOCK")
        self._fd: int | None = None
        self._open_id: int | None = None
        self._open_size = 0
        self._open_since = 0.0
        try:
            self._position, self._next_id = self._recover()
        except BaseException:
            self._release()
            raise

    # --- public API ---------------------------------------------------------

    def append(self, event: Event | dict[str, Any]) -> None:
        """Append one event (an event object or a record dict of the WAL contract)."""
        self._check_usable()
        parsed = parse_event(event, segment=self._current_name(), line=None)
        position = self._position.admit(parsed)
        line = event_to_line(parsed)
        if self._fd is None:
            self._start_segment()
        self._write(line)
        self._position = position
        if isinstance(parsed, Close) and self._rotation_due():
            self.seal()

    def append_all(
        self, lines: Iterable[str | bytes], *, source: str, seal: bool = False, require_uuids: bool = False
    ) -> int:
        """Append every JSON line of an input, or none: all are parsed and checked against the
        ordering rules first (an :class:`InputRecordError` names ``source`` and the line), and
        only then written. With ``seal`` the segment is sealed afterwards (checked first too).

        ``lines`` is read twice (check, then write), so no input is held in memory whole: pass a
        re-iterable such as :class:`InputLines` or a list."""
        self._check_usable()
        checked = check_input(lines, source, self._position, require_uuids=require_uuids)
        if seal and checked.events and not checked.position.last_record_is_close:
            raise SealError(
                f"{source}: cannot seal after its last record, which is not a close; "
                "end the input with {\"op\": \"close\", \"t\": ...} or drop --seal; nothing was written"
            )
        if seal and not checked.events and not self._position.last_record_is_close:
            raise SealError("cannot seal: the open segment's last record is not a close; nothing was written")
        written = 0
        for raw in lines:
            if raw.strip():
                self.append(parse_line(raw))
                written += 1
        if written != checked.events:  # the input changed between the two passes
            raise InputRecordError(source, written, f"the input changed while being appended ({written} lines "
                                   f"written, {checked.events} checked)")
        if seal:
            self.seal()
        return written

    def append_line(self, text: str) -> None:
        """Append one JSON line (as read from a file or stdin)."""
        self.append(parse_line(text, segment="<input>"))  # type: ignore[arg-type]

    def flush(self) -> None:
        """Make everything appended so far durable (fsync)."""
        if self._fd is not None:
            os.fsync(self._fd)

    def seal(self) -> SegmentRef | None:
        """Finish the open segment now; returns it, or None if nothing was appended since the last seal."""
        self._check_usable()
        if self._fd is None:
            return None
        if not self._position.last_record_is_close:
            raise SealError(
                f"cannot seal segment {segment_name(self._open_id or 0)}: its last record is not a close; "
                "append {'op': 'close', 't': ...} first"
            )
        path = self._open_path()
        body = path.read_bytes()
        self._write(sealing_line(self._position.closed_t, body))
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        sealed = path.with_suffix(".sealed")
        os.replace(path, sealed)
        fsync_dir(sealed.parent)
        ref = SegmentRef(self._open_id or 0, SegmentState.SEALED, sealed)
        self._open_id = None
        self._write_head()
        note_change(self.wal_dir)  # tells the sensor (after the rename: the marker never runs ahead)
        return ref

    @property
    def closed_t(self) -> int:
        """The largest timestamp closed so far."""
        return self._position.closed_t

    def close(self) -> None:
        """Flush and release the writer (the open segment stays open for the next writer)."""
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
        self._release()

    def __enter__(self) -> WalWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ----------------------------------------------------------

    def _check_usable(self) -> None:
        if self._lock_fd is None:
            raise WriterLockedError("this WAL writer was closed; open a new one")

    def _current_name(self) -> str:
        return segment_name(self._open_id if self._open_id is not None else self._next_id)

    def _open_path(self) -> Path:
        assert self._open_id is not None
        return segments_dir(self.wal_dir) / f"{segment_name(self._open_id)}.open"

    def _start_segment(self) -> None:
        self._open_id = self._next_id
        self._next_id += 1
        path = self._open_path()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        fsync_dir(path.parent)
        self._open_size = 0
        self._open_since = time.time()
        # The lower bound: everything at or below it was closed by an earlier segment.
        self._write(event_to_line(Close(self._position.closed_t)))

    def _write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self._open_size += len(data)

    def _rotation_due(self) -> bool:
        return (
            self._open_size >= self.max_segment_bytes
            or time.time() - self._open_since >= self.max_segment_age_s
        )

    def _write_head(self) -> None:
        head = {"next_segment": self._next_id, "closed_t": self._position.closed_t}
        tmp = self.wal_dir / "head.json.tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(head))
            os.fsync(f.fileno())  # else a power loss can leave the renamed file empty
        os.replace(tmp, self.wal_dir / "head.json")
        fsync_dir(self.wal_dir)

    def _recover(self) -> tuple[WalPosition, int]:
        """Rebuild the ordering state; repair a torn tail of the open segment."""
        refs = list_segments(self.wal_dir)
        head_path = self.wal_dir / "head.json"
        try:
            head = json.loads(head_path.read_text()) if head_path.exists() else {}
        except ValueError:  # torn by a crash: a hint only, the segments (never deleted) say the same
            head = {}
        if not isinstance(head, dict):
            head = {}
        next_id = max([head.get("next_segment", 1)] + [r.segment_id + 1 for r in refs])
        position = WalPosition(closed_t=head.get("closed_t", GENESIS_T))
        finished = [r for r in refs if r.state is not SegmentState.OPEN]
        if finished:
            position = WalPosition(closed_t=max(position.closed_t, _sealed_upper(finished[-1])))
        open_refs = [r for r in refs if r.state is SegmentState.OPEN]
        for ref in open_refs[:-1]:  # never more than one unless a crash mid-rotation
            position = self._adopt_open(ref, position)
        if open_refs:
            position = self._adopt_open(open_refs[-1], position)
        return position, next_id

    def _adopt_open(self, ref: SegmentRef, position: WalPosition) -> WalPosition:
        data = ref.path.read_bytes()
        keep = data[: data.rfind(b"\n") + 1]
        if len(keep) != len(data):
            with open(ref.path, "r+b") as f:  # torn tail: keep every complete line
                f.truncate(len(keep))
                os.fsync(f.fileno())
        lines = keep.splitlines()
        for number, raw in enumerate(lines, start=1):
            event = parse_line(raw, segment=ref.name, line=number)
            if isinstance(event, Close) and event.seal is not None:
                # Crashed between writing the seal and renaming: finish the seal.
                sealed = ref.path.with_suffix(".sealed")
                os.replace(ref.path, sealed)
                note_change(self.wal_dir)
                return WalPosition(closed_t=event.t)
            if number == 1:
                position = WalPosition(closed_t=max(position.closed_t, event.t))
                continue
            position = position.admit(event)
        self._open_id = ref.segment_id
        self._fd = os.open(ref.path, os.O_WRONLY | os.O_APPEND)
        self._open_size = len(keep)
        self._open_since = ref.path.stat().st_mtime if lines else time.time()
        if not lines:  # a crash tore (or never wrote) its opening close: without it the sealed segment is refused
            self._write(event_to_line(Close(position.closed_t)))
        return position

    def _release(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None


_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def check_identifiers(event: Event) -> None:
    """``table_uuid`` and ``column_uuid`` fields must be canonical UUIDs (8-4-4-4-12 hex digits)."""
    found: list[tuple[str, str]] = []
    if hasattr(event, "table_uuid"):
        found.append(("table_uuid", event.table_uuid))
    if hasattr(event, "column_uuid"):
        found.append(("column_uuid", event.column_uuid))
    for column in getattr(event, "columns", ()):
        found.append(("column_uuid", column.column_uuid))
    if hasattr(event, "column"):
        found.append(("column_uuid", event.column.column_uuid))
    if isinstance(event, (Insert, Update)):
        found += [("values key", name) for name in event.values]
    for field, value in found:
        if not _UUID_RE.match(value):
            raise MalformedRecordError(
                f"{field} {value!r} is not a UUID: identifiers are canonical UUIDs such as "
                "'7d6c0c1e-0000-4000-8000-000000000001'"
            )


@dataclass(frozen=True)
class CheckedInput:
    """What checking an input found: how many events, and the log's position after them."""

    events: int
    position: WalPosition


def check_input(
    lines: Iterable[str | bytes], source: str, position: WalPosition, *, require_uuids: bool = False
) -> CheckedInput:
    """Check every event of an input in order from ``position`` (blank lines are skipped) without
    keeping them; the first bad line is an :class:`InputRecordError` naming ``source`` and the line.
    ``require_uuids`` also checks that identifiers are UUIDs (:func:`check_identifiers`)."""
    count = 0
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            event = parse_line(raw)
            if isinstance(event, Close) and event.seal is not None:
                raise MalformedRecordError("a sealing close record cannot be appended; the writer seals")
            if require_uuids:
                check_identifiers(event)
            position = position.admit(event)
            if isinstance(raw, str) or b"\\u" in raw:
                # a lone surrogate (only a \u escape or a Python str can hold one) fails at writing,
                # after the earlier lines are written: refuse it here, with its line
                event_to_line(event)
        except MalformedRecordError as exc:
            raise InputRecordError(source, number, exc.reason) from None
        count += 1
    return CheckedInput(count, position)


class InputLines:
    """The lines of a file, re-readable (each iteration opens it again)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def __iter__(self) -> Iterator[bytes]:
        with open(self.path, "rb") as f:
            yield from f


def _sealed_upper(ref: SegmentRef) -> int:
    data = ref.path.read_bytes().rstrip(b"\n")
    last = data[data.rfind(b"\n") + 1 :]
    try:
        event = parse_line(last, segment=ref.name)
    except MalformedRecordError:
        return GENESIS_T
    return event.t if isinstance(event, Close) else GENESIS_T


def _acquire_lock(path: Path) -> int:
    """An exclusive flock: the kernel drops it when a crashed writer's process ends."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another writer"
        os.close(fd)
        raise WriterLockedError(
            f"the WAL at {path.parent} is being written by {holder}; only one writer per database"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
    return fd
