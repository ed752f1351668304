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

The caller holds the WAL writer lock, so no open segment grows meanwhile.
"""

from __future__ import annotations

import json
import os
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


@dataclass(frozen=True)
class MaskedFile:
    """One WAL file rewritten without erased keys."""

    path: str
    lines_removed: int
    resealed: bool


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


def _erased_lines(lines: pa.Array, table_uuid: str, keys: Sequence[int]) -> pa.Array:
    """A boolean per line: is it a row event of one of ``keys`` of ``table_uuid``?"""
    con = duckdb.connect(":memory:")
    try:
        con.register("lines", pa.table({"i": pa.array(range(len(lines)), pa.int64()), "line": lines}))
        con.register("erased", pa.table({"k": pa.array(list(keys), pa.int64())}))
        # a torn or malformed line is read as '{}' (no match): DuckDB evaluates every branch of AND/CASE
        result = con.sql(
            """WITH docs AS (SELECT i, CASE WHEN json_valid(line) THEN line ELSE '{}' END AS doc FROM lines)
               SELECT coalesce(
                   json_extract_string(doc, '$.op') IN ('insert', 'update', 'delete')
                   AND json_extract_string(doc, '$.table_uuid') = ?
                   AND TRY_CAST(json_extract(doc, '$.key') AS BIGINT) IN (SELECT k FROM erased), false) AS hit
               FROM docs ORDER BY i""",
            params=[table_uuid],
        ).to_arrow_table()
    finally:
        con.close()
    return result.column("hit").combine_chunks()


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


def mask_file(path: Path, table_uuid: str, keys: Sequence[int]) -> MaskedFile | None:
    """Rewrite one segment file without the row events of ``keys`` (None when it holds none)."""
    data = path.read_bytes()
    sealed = _verified_seal(data)
    body = sealed[0] if sealed is not None else data
    raw = body.split(b"\n")
    # matching runs on text (a stray invalid byte becomes U+FFFD, never a newline), output keeps the bytes
    text = body.decode("utf-8", errors="replace").split("\n")
    hits = _erased_lines(pa.array(text, pa.string()), table_uuid, keys)
    removed = pc.sum(hits).as_py() or 0
    if not removed:
        return None
    kept = pc.filter(pa.array(raw, pa.binary()), pc.invert(hits))
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(kept)], pa.int32()), kept), b"\n")
    new_body = joined[0].as_py()
    new_data = new_body + sealing_line(sealed[1], new_body) if sealed is not None else new_body
    tmp = path.with_name(f".{path.name}.mask.tmp")
    with open(tmp, "wb") as f:
        f.write(new_data)
        f.flush()
        os.fsync(f.fileno())
    if not path.exists():  # moved meanwhile (applied, released): never recreate it here; the next pass finds it
        tmp.unlink()
        return None
    os.replace(tmp, path)
    _redact_reason(path, int(removed))
    fsync_dir(path.parent)
    return MaskedFile(str(path), int(removed), sealed is not None)


def _redact_reason(segment: Path, removed: int) -> None:
    """A quarantined segment's (or its audit copy's) reason may quote an erased value, and its line
    numbers are stale once lines are gone: keep which segment, drop the message."""
    reason_path = segment.with_name(f"{segment.stem}.error.json")
    if not reason_path.exists():
        return
    reason = json.loads(reason_path.read_text())
    redacted = {
        "segment": reason.get("segment", segment.stem),
        "line": None,
        "error": f"redacted by an erasure that removed {removed} event(s) from this segment; "
                 "release it to compact it again and see what, if anything, is still wrong",
    }
    tmp = reason_path.with_name(f".{reason_path.name}.tmp")
    tmp.write_text(json.dumps(redacted, indent=2))
    os.replace(tmp, reason_path)


def mask_wal(wal_dir: Path, table_uuid: str, keys: Sequence[int]) -> list[MaskedFile]:
    """Mask ``keys`` of ``table_uuid`` in every segment file of the WAL (see the module docstring)."""
    masked = []
    for _ in range(2):  # a second pass finds a segment that moved (applied, released) while we looked
        for path in wal_files(wal_dir):
            try:
                done = mask_file(path, table_uuid, keys)
            except FileNotFoundError:
                continue
            if done is not None:
                masked.append(done)
    return masked
