"""WAL segments on local disk: their names, their states, and verified reading.

A segment's life is ``open -> sealed -> applied | quarantined``; the state is
the folder (and suffix) the file sits in::

    <wal_dir>/segments/<id>.open        the one segment the writer appends to
    <wal_dir>/segments/<id>.sealed      finished, waiting for compaction
    <wal_dir>/applied/<id>.sealed       compacted (the catalog says so first)
    <wal_dir>/quarantine/<id>.sealed    refused; <id>.error.json says why

A sealed segment ends with a sealing ``close`` record carrying the count of
the records before it and the SHA-256 of their bytes, so a torn or flipped
byte is found before compaction.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from history_pipeline.errors import MalformedRecordError, SegmentCorruptedError
from history_pipeline.events import Close, Event, SealDigest, event_to_line, parse_line
from history_pipeline.wal.journal import note_change

ID_WIDTH = 20


class SegmentState(enum.Enum):
    OPEN = "open"
    SEALED = "sealed"
    APPLIED = "applied"
    QUARANTINED = "quarantined"


@dataclass(frozen=True)
class SegmentRef:
    """Where one segment is and what state it is in."""

    segment_id: int
    state: SegmentState
    path: Path

    @property
    def name(self) -> str:
        return segment_name(self.segment_id)


@dataclass(frozen=True)
class SegmentContents:
    """The verified events of a sealed segment with their 1-based line numbers."""

    ref: SegmentRef
    events: tuple[tuple[int, Event], ...]
    lower: int
    upper: int
    size_bytes: int


def segment_name(segment_id: int) -> str:
    """The zero-padded name of a segment id."""
    return f"{segment_id:0{ID_WIDTH}d}"


def segments_dir(wal_dir: Path) -> Path:
    return wal_dir / "segments"


def applied_dir(wal_dir: Path) -> Path:
    return wal_dir / "applied"


def quarantine_dir(wal_dir: Path) -> Path:
    return wal_dir / "quarantine"


def list_segments(wal_dir: Path, state: SegmentState | None = None) -> list[SegmentRef]:
    """Every segment of a WAL in id order, optionally only those in one state."""
    found: list[SegmentRef] = []
    places = (
        (segments_dir(wal_dir), ".open", SegmentState.OPEN),
        (segments_dir(wal_dir), ".sealed", SegmentState.SEALED),
        (applied_dir(wal_dir), ".sealed", SegmentState.APPLIED),
        (quarantine_dir(wal_dir), ".sealed", SegmentState.QUARANTINED),
    )
    for folder, suffix, seg_state in places:
        if state is not None and seg_state is not state:
            continue
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            stem, _, ext = entry.name.partition(".")
            if "." + ext == suffix and stem.isdigit():
                found.append(SegmentRef(int(stem), seg_state, entry))
    return sorted(found, key=lambda r: (r.segment_id, r.state.value))


def seal_digest(data: bytes) -> SealDigest:
    """Count and checksum of a segment's bytes before its sealing record."""
    return SealDigest(records=data.count(b"\n"), sha256=hashlib.sha256(data).hexdigest())


def sealing_line(t: int, body: bytes) -> bytes:
    """The sealing close record for a segment whose bytes so far are ``body``."""
    return event_to_line(Close(t, seal_digest(body)))


def read_segment(ref: SegmentRef) -> SegmentContents:
    """Read a sealed (or applied/quarantined) segment, verifying count and checksum first.

    Raises :class:`SegmentCorruptedError` if the bytes do not match the seal and
    :class:`MalformedRecordError` (naming segment and line) for a bad record.
    """
    data = ref.path.read_bytes()
    name = ref.name
    if not data.endswith(b"\n"):
        raise SegmentCorruptedError(name, "does not end with a complete sealing record (torn write?)")
    cut = data.rstrip(b"\n").rfind(b"\n") + 1
    body, last = data[:cut], data[cut:]
    try:
        seal_event = parse_line(last, segment=name, line=body.count(b"\n") + 1)
    except MalformedRecordError as exc:
        raise SegmentCorruptedError(name, f"sealing record unreadable ({exc.reason})") from None
    if not isinstance(seal_event, Close) or seal_event.seal is None:
        raise SegmentCorruptedError(name, "last record is not a sealing close record")
    actual = seal_digest(body)
    if actual.records != seal_event.seal.records:
        raise SegmentCorruptedError(
            name, f"holds {actual.records} records before its seal, the seal says {seal_event.seal.records}"
        )
    if actual.sha256 != seal_event.seal.sha256:
        raise SegmentCorruptedError(name, "checksum mismatch: its bytes changed after sealing")
    events: list[tuple[int, Event]] = []
    for number, raw in enumerate(body.splitlines(), start=1):
        events.append((number, parse_line(raw, segment=name, line=number)))
    if not events or not isinstance(events[0][1], Close):
        raise SegmentCorruptedError(name, "does not begin with a close record")
    return SegmentContents(
        ref=ref,
        events=tuple(events),
        lower=events[0][1].t,
        upper=seal_event.t,
        size_bytes=len(data),
    )


@dataclass(frozen=True)
class SealedSegment:
    """A sealed segment whose seal was verified, read without holding its bytes."""

    ref: SegmentRef
    lower: int  # t of its opening close record
    upper: int  # t of its sealing close record
    records: int  # lines before the seal (lines 1..records are the events)
    body_bytes: int  # bytes before the sealing record
    size_bytes: int


_CHUNK = 1 << 20

#: what :func:`verify_segment` hands each whole-line piece of a body to: (bytes, file offset, first line)
BodyReader = Callable[[bytes, int, int], None]


def verify_segment(
    ref: SegmentRef,
    on_body: BodyReader | None = None,
    chunk_bytes: int = _CHUNK,
    on_seal: Callable[[int], None] | None = None,
) -> SealedSegment:
    """Check count and checksum of a sealed segment streaming (constant memory); read its bounds.

    ``on_body`` sees the body (the lines before the seal) once, in pieces of whole lines of about
    ``chunk_bytes``, during the same read that checks it (so a caller that routes the lines reads
    the segment once); it must not keep the result it derives from a segment that then fails.
    ``on_seal`` is told the sealing record's t (the upper bound) before ``on_body`` sees the body.
    Raises the same errors as :func:`read_segment` for a bad seal or a bad first record.
    """
    name = ref.name
    size = ref.path.stat().st_size
    with open(ref.path, "rb") as f:
        tail, start = b"", size
        while True:  # the sealing record is the last line; read backwards until it is whole
            step = min(start, max(_CHUNK, len(tail)))
            start -= step
            f.seek(start)
            tail = f.read(step) + tail
            cut = tail.rstrip(b"\n").rfind(b"\n")
            if cut >= 0 or start == 0:
                break
        if not tail.endswith(b"\n"):
            raise SegmentCorruptedError(name, "does not end with a complete sealing record (torn write?)")
        body_bytes = start + cut + 1
        last = tail[cut + 1 :]
        # the seal is read first (the body's line count, its line number, is not known yet: no
        # message names it): the body's reader may need the upper bound
        try:
            seal_event = parse_line(last, segment=name)
        except MalformedRecordError as exc:
            raise SegmentCorruptedError(name, f"sealing record unreadable ({exc.reason})") from None
        if not isinstance(seal_event, Close) or seal_event.seal is None:
            raise SegmentCorruptedError(name, "last record is not a sealing close record")
        if on_seal is not None:
            on_seal(seal_event.t)
        digest, records = hashlib.sha256(), 0
        f.seek(0)
        remaining, carry, offset = body_bytes, b"", 0
        while remaining:
            chunk = f.read(min(chunk_bytes, remaining))
            remaining -= len(chunk)
            digest.update(chunk)
            if on_body is not None:  # whole lines only: a line cut by the read waits for its end
                data = carry + chunk
                end = data.rfind(b"\n") + 1 if remaining else len(data)
                if end:
                    on_body(data[:end], offset, records + 1)
                    offset += end
                carry = data[end:]
            records += chunk.count(b"\n")
        f.seek(0)
        first = f.readline() if body_bytes else b""
    if records != seal_event.seal.records:
        raise SegmentCorruptedError(
            name, f"holds {records} records before its seal, the seal says {seal_event.seal.records}"
        )
    if digest.hexdigest() != seal_event.seal.sha256:
        raise SegmentCorruptedError(name, "checksum mismatch: its bytes changed after sealing")
    opening = parse_line(first, segment=name, line=1) if first else None
    if not isinstance(opening, Close):
        raise SegmentCorruptedError(name, "does not begin with a close record")
    return SealedSegment(ref, opening.t, seal_event.t, records, body_bytes, size)


def move_segment(ref: SegmentRef, state: SegmentState, wal_dir: Path) -> SegmentRef:
    """Move a sealed segment to the folder of ``state`` (applied or quarantined)."""
    target_dir = applied_dir(wal_dir) if state is SegmentState.APPLIED else quarantine_dir(wal_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / f"{ref.name}.sealed"
    try:
        os.replace(ref.path, target)
    except FileNotFoundError:
        if not target.exists():
            raise
        return SegmentRef(ref.segment_id, state, target)  # a concurrent run moved it there already
    fsync_dir(target_dir)
    fsync_dir(ref.path.parent)
    return SegmentRef(ref.segment_id, state, target)


def quarantine_segment(ref: SegmentRef, wal_dir: Path, error: str, line: int | None) -> SegmentRef:
    """Quarantine a sealed segment, recording why beside it."""
    moved = move_segment(ref, SegmentState.QUARANTINED, wal_dir)
    reason = {"segment": ref.name, "line": line, "error": error}
    (quarantine_dir(wal_dir) / f"{ref.name}.error.json").write_text(json.dumps(reason, indent=2))
    note_change(wal_dir)  # after the reason is written: the sensor reports it
    return moved


def quarantine_reason(ref: SegmentRef) -> dict[str, object] | None:
    """Why a quarantined segment was refused (None if no reason was recorded)."""
    path = ref.path.parent / f"{ref.name}.error.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


#: what stands for a value in a reason shown outside the WAL
WITHHELD = "<value>"


def without_values(error: str, line: bytes | None) -> str:
    """``error`` with the text of every value of the failing event (``line``, its raw bytes) withheld,
    for records that erasure cannot reach (Dagster's event log, a check's metadata): the table, the
    key, the column and the line stay. A line that is not a JSON object may be quoted in any form:
    the whole message is withheld then."""
    try:
        event = json.loads(line) if line is not None else None
    except ValueError:
        event = None
    if not isinstance(event, dict):
        return "the reason quotes an unreadable event; see it in the WAL (history-pipeline segments)"
    values = event.get("values") if isinstance(event.get("values"), dict) else {}
    found = set()
    for value in [*values.values(), event.get("default")]:
        if value is None or isinstance(value, bool):
            continue
        found.update({json.dumps(value), repr(value), str(value)})
    for text in sorted(found, key=len, reverse=True):  # longest first: no piece of a value is left
        error = re.sub(rf"(?<![\w.]){re.escape(text)}(?![\w.])", WITHHELD, error)
    return error


def public_reason(ref: SegmentRef) -> str | None:
    """Why a quarantined segment was refused, without any value of its events (see
    :func:`without_values`), with the line when known; None if no reason was recorded."""
    reason = quarantine_reason(ref)
    if reason is None:
        return None
    error, number = str(reason.get("error", "")), reason.get("line")
    if not isinstance(number, int) or number < 1:
        # a reason about the whole file (torn, checksum, bounds) quotes no event; one that looks as if
        # it might is withheld rather than guessed at
        if "'" in error or '"' in error or "value" in error:
            return "the reason may quote a value; see it in the WAL (history-pipeline segments)"
        return error
    try:
        with open(ref.path, "rb") as f:
            line = next((raw for i, raw in enumerate(f, start=1) if i == number), None)
    except OSError:
        line = None
    return without_values(error, line)


def release_segment(ref: SegmentRef, wal_dir: Path) -> SegmentRef:
    """An operator's act: put a quarantined segment back in line for compaction."""
    target = segments_dir(wal_dir) / f"{ref.name}.sealed"
    os.replace(ref.path, target)
    (ref.path.parent / f"{ref.name}.error.json").unlink(missing_ok=True)
    note_change(wal_dir)
    return SegmentRef(ref.segment_id, SegmentState.SEALED, target)


def fsync_dir(path: Path) -> None:
    """Make a rename or create in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def verify_or_quarantine(ref: SegmentRef, wal_dir: Path) -> SegmentContents:
    """Read a sealed segment; one that does not verify (torn, edited, a malformed line) is
    quarantined with its reason, exactly as compaction does, and :class:`SegmentQuarantinedError`
    is raised. Every path that reads a pending segment uses this rule."""
    from history_pipeline.errors import SegmentQuarantinedError

    try:
        return read_segment(ref)
    except (SegmentCorruptedError, MalformedRecordError) as exc:
        if ref.state is SegmentState.SEALED:
            quarantine_segment(ref, wal_dir, str(exc), getattr(exc, "line", None))
        raise SegmentQuarantinedError(ref.name, str(exc)) from exc
