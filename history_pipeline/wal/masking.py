"""Masking erased keys in the WAL: segment files rewritten without those keys' row events.

Every segment file still on disk (``segments/`` open and sealed, ``applied/``,
``quarantine/`` and the originals kept under ``audit/``) is searched for row
events (``insert``, ``update``, ``delete``) of the erased keys of one table; a
file that holds any is rewritten without those lines. Every other line keeps its
bytes, so the segment keeps its id and its ``close`` bounds. A file whose seal
verified is re-sealed over its new bytes (new count and checksum, as repair
does); one whose seal did not verify (torn, edited) stays unverifiable, as it
was. The line selection is one DuckDB query over the file's lines; the file is
replaced atomically (written aside, fsynced, renamed).

Records that can quote a value of a masked segment are redacted with it: a quarantined
segment's ``<id>.error.json``, and in an audit folder (a repaired or skipped segment's
``original.sealed``) its ``error.json`` and the ``quarantine_error`` of its ``repair.json``;
the operator's own words there (``reason``) keep everything but the erased values' text.

The caller holds the WAL writer lock, so no open segment grows meanwhile.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from history_pipeline.errors import MalformedRecordError
from history_pipeline.events import Close, parse_line
from history_pipeline.wal.segments import (
    applied_dir,
    fsync_dir,
    quarantine_dir,
    seal_digest,
    sealing_line,
    segments_dir,
)

#: a value shorter than this is not searched for in an operator's free text (it would match words)
MIN_SCRUBBED = 4
REDACTED = "[erased]"


@dataclass(frozen=True)
class MaskedFile:
    """One WAL file rewritten (or, in a dry run, to be rewritten) without erased keys."""

    path: str
    lines_removed: int
    resealed: bool
    keys_found: tuple[int, ...] = ()
    records: tuple[str, ...] = ()  # the quarantine and audit records redacted with it


def wal_files(wal_dir: Path) -> list[Path]:
    """Every segment file under a WAL: pending, applied, quarantined and the audit copies."""
    found: list[Path] = []
    for folder in (segments_dir(wal_dir), applied_dir(wal_dir), quarantine_dir(wal_dir)):
        if folder.is_dir():
            found += [p for p in folder.iterdir() if p.suffix in (".open", ".sealed") and p.stem.isdigit()]
    audit = wal_dir / "audit"
    if audit.is_dir():
        found += [p for p in audit.rglob("*.sealed") if p.is_file()]
    return sorted(found)


_scratch: list[duckdb.DuckDBPyConnection] = []
_scratch_lock = threading.Lock()


def _cursor() -> duckdb.DuckDBPyConnection:
    """A cursor of one process-wide in-memory DuckDB database that reads no file: a new database
    costs 15-50 ms, a cursor microseconds, and an erasure searches every segment file in turn."""
    with _scratch_lock:
        if not _scratch:
            database = duckdb.connect(":memory:")
            database.execute("SET enable_external_access = false")
            _scratch.append(database)
        return _scratch[0].cursor()


def _erased_lines(lines: pa.Array, table_uuid: str, keys: Sequence[int]) -> pa.Table:
    """Per line: ``hit`` (is it a row event of one of ``keys`` of ``table_uuid``?) and its ``key``."""
    con = _cursor()  # its registrations are its own, and go with it
    try:
        con.register("lines", pa.table({"i": pa.array(range(len(lines)), pa.int64()), "line": lines}))
        con.register("erased", pa.table({"k": pa.array(list(keys), pa.int64())}))
        # a torn or malformed line is read as '{}' (no match): DuckDB evaluates every branch of AND/CASE
        result = con.sql(
            """WITH docs AS (SELECT i, CASE WHEN json_valid(line) THEN line ELSE '{}' END AS doc FROM lines)
               SELECT coalesce(
                   json_extract_string(doc, '$.op') IN ('insert', 'update', 'delete')
                   AND json_extract_string(doc, '$.table_uuid') = ?
                   AND TRY_CAST(json_extract(doc, '$.key') AS BIGINT) IN (SELECT k FROM erased), false) AS hit,
                   TRY_CAST(json_extract(doc, '$.key') AS BIGINT) AS key
               FROM docs ORDER BY i""",
            params=[table_uuid],
        ).to_arrow_table()
    finally:
        con.close()
    return result


def _verified_seal(data: bytes) -> tuple[bytes, int] | None:
    """(body, upper bound) when ``data`` ends with a seal that matches its bytes, else None."""
    if not data.endswith(b"\n"):
        return None
    cut = data.rstrip(b"\n").rfind(b"\n") + 1
    body, last = data[:cut], data[cut:]
    try:
        event = parse_line(last)
    except MalformedRecordError:
        return None
    if not isinstance(event, Close) or event.seal is None or seal_digest(body) != event.seal:
        return None
    return body, event.t


def mask_file(path: Path, table_uuid: str, keys: Sequence[int], *, dry_run: bool = False) -> MaskedFile | None:
    """Rewrite one segment file without the row events of ``keys`` (None when it holds none);
    ``dry_run``: only say what would be removed."""
    data = path.read_bytes()
    sealed = _verified_seal(data)
    body = sealed[0] if sealed is not None else data
    raw = body.split(b"\n")
    # matching runs on text (a stray invalid byte becomes U+FFFD, never a newline), output keeps the bytes
    text = body.decode("utf-8", errors="replace").split("\n")
    found = _erased_lines(pa.array(text, pa.string()), table_uuid, keys)
    hits = found.column("hit").combine_chunks()
    removed = pc.sum(hits).as_py() or 0
    if not removed:
        return None
    keys_found = tuple(sorted(set(pc.filter(found.column("key"), hits).to_pylist())))
    records = tuple(str(p) for p in _records_of(path))
    if dry_run:
        return MaskedFile(str(path), int(removed), sealed is not None, keys_found, records)
    kept = pc.filter(pa.array(raw, pa.binary()), pc.invert(hits))
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(kept)], pa.int32()), kept), b"\n")
    new_body = joined[0].as_py()
    new_data = new_body + sealing_line(sealed[1], new_body) if sealed is not None else new_body
    erased_text = _values_of(pc.filter(pa.array(text, pa.string()), hits).to_pylist())
    tmp = path.with_name(f".{path.name}.mask.tmp")
    with open(tmp, "wb") as f:
        f.write(new_data)
        f.flush()
        os.fsync(f.fileno())
    if not path.exists():  # moved meanwhile (applied, released): never recreate it here; the next pass finds it
        tmp.unlink()
        return None
    # the records first: a crash after them leaves the segment unmasked, and the rerun masks it (and
    # redacts again); the other order would leave the records quoting values of a file masked already
    for record in _records_of(path):
        _redact_record(record, int(removed), erased_text)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return MaskedFile(str(path), int(removed), sealed is not None, keys_found, records)


def _records_of(segment: Path) -> list[Path]:
    """The records that may quote a value of ``segment``: a quarantined segment's reason, or beside
    an audit copy (``original.sealed``) the quarantine reason and the repair record."""
    if segment.name == "original.sealed":
        candidates = [segment.with_name("error.json"), segment.with_name("repair.json")]
    else:
        candidates = [segment.with_name(f"{segment.stem}.error.json")]
    return [c for c in candidates if c.exists()]


def _values_of(lines: list[str]) -> tuple[str, ...]:
    """The text of every value of the erased lines (long enough to be searched for in free text)."""
    found: set[str] = set()
    for line in lines:
        try:
            values = json.loads(line).get("values") or {}
        except (ValueError, AttributeError):
            continue
        for value in values.values() if isinstance(values, dict) else ():
            if isinstance(value, str | int | float) and not isinstance(value, bool):
                shown = str(value)
                if len(shown) >= MIN_SCRUBBED:
                    found.add(shown)
    return tuple(sorted(found, key=len, reverse=True))  # longest first: no partial leftovers


def _scrub(text: str, values: Sequence[str]) -> str:
    for value in values:
        text = text.replace(value, REDACTED)
    return text


def _redact_record(path: Path, removed: int, values: Sequence[str]) -> None:
    """A quarantine reason (or a repair record's copy of it) may quote an erased value, and its line
    numbers are stale once lines are gone: keep which segment and who did what, drop the message."""
    record = json.loads(path.read_text())
    message = (f"redacted by an erasure that removed {removed} event(s) from this segment; "
               "release it to compact it again and see what, if anything, is still wrong")
    if "quarantine_error" in record:  # a repair.json
        if record["quarantine_error"] is not None:
            record["quarantine_error"] = message
        for field in ("reason", "source"):
            if isinstance(record.get(field), str):
                record[field] = _scrub(record[field], values)
    else:
        record = {"segment": record.get("segment", path.name.split(".")[0]), "line": None, "error": message}
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(record, indent=2))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def mask_wal(wal_dir: Path, table_uuid: str, keys: Sequence[int], *, dry_run: bool = False) -> list[MaskedFile]:
    """Mask ``keys`` of ``table_uuid`` in every segment file of the WAL (see the module docstring);
    ``dry_run``: only list what would be masked."""
    masked = []
    for _ in range(1 if dry_run else 2):  # a second pass finds a segment that moved (applied, released)
        for path in wal_files(wal_dir):
            try:
                done = mask_file(path, table_uuid, keys, dry_run=dry_run)
            except FileNotFoundError:
                continue
            if done is not None:
                masked.append(done)
    return masked
