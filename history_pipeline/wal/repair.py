"""An operator's way out of quarantine: repair a segment with corrected events, or skip it.

Both keep the segment's place in the log (its id and its lower and upper ``close`` bounds, so
the next segment still starts where it ends) and re-seal it with a new count and checksum; the
quarantined original, its error and a record of who did what and why are kept for audit under
``<wal_dir>/audit/<segment>-<UTC time>/``. The re-sealed segment is then pending again: the
next compaction (CLI or the Dagster sensor, which sees a new file) applies it, and re-checks
everything that needs the schema history (unknown tables, types, keys), quarantining it again
naming the line if the correction is still wrong.

Order of the steps, so that a crash never loses the original: audit copy first, then the new
segment (written aside and renamed into place), then the quarantined file is removed.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from history_pipeline.errors import InputRecordError, MalformedRecordError, SegmentCorruptedError
from history_pipeline.events import Close, Event, event_to_line, parse_line
from history_pipeline.wal.journal import note_change
from history_pipeline.wal.segments import (
    SegmentRef,
    SegmentState,
    fsync_dir,
    quarantine_reason,
    seal_digest,
    sealing_line,
    segments_dir,
)
from history_pipeline.wal.writer import WalPosition


@dataclass(frozen=True)
class RepairRecord:
    """What an operator did to a quarantined segment (written to ``repair.json`` in the audit folder)."""

    segment: str
    action: str  # "repaired" or "skipped"
    at: str
    by: str
    reason: str
    source: str | None
    lower: int
    upper: int
    original_sha256: str
    original_lines: int
    new_sha256: str
    new_records: int
    quarantine_error: str | None
    audit_dir: str


def audit_root(wal_dir: Path) -> Path:
    """Where originals of repaired and skipped segments are kept."""
    return wal_dir / "audit"


def segment_bounds(ref: SegmentRef) -> tuple[int, int]:
    """The (lower, upper) close bounds of a segment, read leniently from its first and last lines
    (a quarantined segment may not verify, but its bounds must still be readable)."""
    lines = [raw for raw in ref.path.read_bytes().splitlines() if raw.strip()]
    try:
        first, last = parse_line(lines[0]), parse_line(lines[-1])
    except (IndexError, MalformedRecordError):
        raise SegmentCorruptedError(
            ref.name, "its first or last line is unreadable, so its bounds are unknown; it cannot be repaired here"
        ) from None
    if not isinstance(first, Close) or not isinstance(last, Close):
        raise SegmentCorruptedError(ref.name, "does not begin and end with close records; it cannot be repaired here")
    return first.t, last.t


def corrected_events(lines: Iterable[str | bytes], source: str, lower: int, upper: int) -> list[Event]:
    """The corrected events of a segment bounded by ``lower`` and ``upper``, checked as the writer checks.

    The input may be a whole edited copy of the segment or only the events between its bounds:
    a leading ``close`` at ``lower`` and a sealing record are dropped, a final ``close`` at
    ``upper`` is added if missing.
    """
    numbered: list[tuple[int, Event]] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            numbered.append((number, parse_line(raw)))
        except MalformedRecordError as exc:
            raise InputRecordError(source, number, exc.reason) from None
    if numbered and isinstance(numbered[-1][1], Close) and numbered[-1][1].seal is not None:
        numbered.pop()  # the old seal: a new one is computed
    if numbered and isinstance(numbered[0][1], Close) and numbered[0][1].t == lower:
        numbered.pop(0)
    if not numbered or not (isinstance(numbered[-1][1], Close) and numbered[-1][1].t == upper):
        numbered.append((0, Close(upper)))
    position = WalPosition(closed_t=lower)
    for number, event in numbered:
        try:
            if isinstance(event, Close) and event.seal is not None:
                raise MalformedRecordError("a sealing record may only end the segment")
            if event.t > upper:
                raise MalformedRecordError(
                    f"t={event.t} is above the segment's upper bound {upper}; the next segment starts there"
                )
            position = position.admit(event)
        except MalformedRecordError as exc:
            raise InputRecordError(source, number, exc.reason) from None
    return [Close(lower)] + [event for _, event in numbered]


def rewrite_quarantined(
    ref: SegmentRef,
    wal_dir: Path,
    events: list[Event],
    *,
    action: str,
    reason: str,
    source: str | None,
) -> tuple[SegmentRef, RepairRecord]:
    """Re-seal ``ref`` (quarantined) with ``events`` (bounds included), keep the original for audit."""
    assert ref.state is SegmentState.QUARANTINED
    lower, upper = events[0].t, events[-1].t
    original = ref.path.read_bytes()
    why = quarantine_reason(ref) or {}
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    audit = audit_root(wal_dir) / f"{ref.name}-{stamp}"
    audit.mkdir(parents=True)
    shutil.copy2(ref.path, audit / "original.sealed")
    error_file = ref.path.parent / f"{ref.name}.error.json"
    if error_file.exists():
        shutil.copy2(error_file, audit / "error.json")
    body = b"".join(event_to_line(e) for e in events)
    sealed = body + sealing_line(upper, body)
    record = RepairRecord(
        segment=ref.name,
        action=action,
        at=datetime.now(UTC).isoformat(timespec="seconds"),
        by=_operator(),
        reason=reason,
        source=source,
        lower=lower,
        upper=upper,
        original_sha256=seal_digest(original).sha256,
        original_lines=original.count(b"\n"),
        new_sha256=seal_digest(body).sha256,
        new_records=len(events),
        quarantine_error=str(why.get("error")) if why.get("error") is not None else None,
        audit_dir=str(audit),
    )
    (audit / "repair.json").write_text(json.dumps(asdict(record), indent=2))
    fsync_dir(audit)
    target = segments_dir(wal_dir) / f"{ref.name}.sealed"
    tmp = target.with_name(f".{ref.name}.repair.tmp")
    with open(tmp, "wb") as f:
        f.write(sealed)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    fsync_dir(target.parent)
    ref.path.unlink()
    error_file.unlink(missing_ok=True)
    fsync_dir(ref.path.parent)
    note_change(wal_dir)
    return SegmentRef(ref.segment_id, SegmentState.SEALED, target), record


def repair_segment(
    ref: SegmentRef, wal_dir: Path, lines: Iterable[str | bytes], *, source: str, reason: str = ""
) -> tuple[SegmentRef, RepairRecord]:
    """Replace a quarantined segment's events by corrected ones (validated first), re-seal it and release it."""
    lower, upper = segment_bounds(ref)
    events = corrected_events(lines, source, lower, upper)
    return rewrite_quarantined(ref, wal_dir, events, action="repaired", reason=reason, source=source)


def skip_segment(ref: SegmentRef, wal_dir: Path, *, reason: str) -> tuple[SegmentRef, RepairRecord]:
    """Drop a quarantined segment's events (its bounds stay, so the log stays whole) and release it."""
    lower, upper = segment_bounds(ref)
    return rewrite_quarantined(ref, wal_dir, [Close(lower), Close(upper)], action="skipped", reason=reason,
                               source=None)


def repair_records(wal_dir: Path) -> list[RepairRecord]:
    """Every repair and skip recorded under the WAL, oldest first."""
    root = audit_root(wal_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in sorted(root.iterdir()):
        record = entry / "repair.json"
        if record.exists():
            found.append(RepairRecord(**json.loads(record.read_text())))
    return sorted(found, key=lambda r: r.at)


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"
