"""The sensor's per-database marks, kept out of the Dagster cursor in one SQLite file.

``<wal base>/_sensor/marks.sqlite`` beside the change journal holds, per database, what
:func:`~history_pipeline.orchestration.sensors.finished_wal_segments_sensor` remembers between
ticks (:class:`DatabaseMark`). A tick reads and writes only the rows of the databases it looks
at (those named by journal markers and those pending), so its cost follows what changed; the
Dagster cursor keeps four numbers (:class:`~history_pipeline.orchestration.sensors.SensorCursor`).

The cursor is the commit point. Each row holds two versions: the mark written by the newest tick
and the one before it, each tagged with the generation (tick count) of the tick that wrote it. A
tick whose cursor says generation ``g`` reads a row written at a generation above ``g`` as its
previous version: that write came from a tick whose cursor Dagster never stored, so its run
requests may never have been sent. Such rows are also listed again (:meth:`MarksStore.pending`),
because the failed tick consumed the journal markers that named them. Rows belong to an epoch (a
sensor's cursor lineage): a reset or unreadable cursor starts a new epoch, which drops the others.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: the folder of the sensor's state under the WAL base (not a database name: those begin with a letter or digit)
SENSOR_STATE = "_sensor"
MARKS_FILE = "marks.sqlite"
_SCHEMA_VERSION = 1
_CHUNK = 500  # names per IN (...) query: far below SQLite's variable limit

Stamp = tuple[int, int]  # change times (ns) of a database's segments/ and quarantine/ folders (0: absent)


@dataclass(frozen=True)
class SegmentMark:
    """A sealed or quarantined segment the sensor registered a partition for."""

    segment_id: int
    changed_ns: int
    quarantined: bool
    done: bool  # sealed: its run was requested; quarantined: reported on its partition


@dataclass(frozen=True)
class DatabaseMark:
    """What the sensor remembers of one database between ticks."""

    stamp: Stamp | None  # folder times when last listed; None: list it again on the next tick
    segments: tuple[SegmentMark, ...] = ()  # its sealed and quarantined segments, in id order

    @property
    def first_quarantined(self) -> int | None:
        """The id of its first quarantined segment (None: nothing holds it up)."""
        return next((s.segment_id for s in self.segments if s.quarantined), None)

    @property
    def waiting(self) -> int:
        """Sealed segments whose run was not requested (they wait behind a quarantined one)."""
        return sum(not s.quarantined and not s.done for s in self.segments)

    def to_json(self) -> str:
        """Compact JSON: ``[stamp | null, [[id, changed_ns, quarantined, done], ...]]``."""
        return json.dumps([list(self.stamp) if self.stamp else None,
                           [[s.segment_id, s.changed_ns, int(s.quarantined), int(s.done)] for s in self.segments]],
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> DatabaseMark:
        """The mark :meth:`to_json` wrote."""
        stamp, segments = json.loads(text)
        return cls((int(stamp[0]), int(stamp[1])) if stamp else None,
                   tuple(SegmentMark(int(i), int(ns), bool(q), bool(d)) for i, ns, q, d in segments))


@dataclass(frozen=True)
class BlockedSummary:
    """The databases held up by a quarantined segment, as the skip reason names them."""

    databases: int = 0  # how many
    waiting: int = 0  # sealed segments waiting behind their quarantined ones
    first: tuple[tuple[str, int], ...] = ()  # the first few by name: (database, first quarantined segment id)


def summarize_blocked(marks: Mapping[str, DatabaseMark], limit: int) -> BlockedSummary:
    """:meth:`MarksStore.blocked` computed over marks in memory (the tests' reference)."""
    blocked = sorted((db, first, m.waiting) for db, m in marks.items() if (first := m.first_quarantined) is not None)
    return BlockedSummary(len(blocked), sum(waiting for _, _, waiting in blocked),
                          tuple((db, first) for db, first, _ in blocked[:limit]))


def marks_path(wal_base: str | os.PathLike[str]) -> str:
    """Where the marks of the sensor over this WAL base are kept."""
    return os.path.join(wal_base, SENSOR_STATE, MARKS_FILE)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS epochs (epoch TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS marks (
    epoch TEXT NOT NULL,
    database TEXT NOT NULL,
    gen INTEGER NOT NULL,          -- generation of the tick that wrote mark
    mark TEXT,                     -- DatabaseMark JSON; NULL: the database left the WAL base
    prev_gen INTEGER,              -- the version before it, for a reader whose cursor predates gen
    prev TEXT,
    pending INTEGER NOT NULL,      -- 1: mark.stamp is None (list it again next tick)
    blocked INTEGER NOT NULL,      -- 1: it has a quarantined segment
    waiting INTEGER NOT NULL,      -- sealed segments waiting behind it
    first_q INTEGER,               -- its first quarantined segment
    PRIMARY KEY (epoch, database)
) WITHOUT ROWID;
-- the queries of a steady tick name their index (INDEXED BY): without statistics the planner
-- prefers the primary key's epoch prefix, a scan of every row of the epoch
CREATE INDEX IF NOT EXISTS marks_gen ON marks (epoch, gen);
CREATE INDEX IF NOT EXISTS marks_pending ON marks (epoch, database) WHERE pending = 1;
CREATE INDEX IF NOT EXISTS marks_blocked ON marks (epoch, database) WHERE blocked = 1;
"""


class MarksStore:
    """The per-database marks of one sensor, in one SQLite file (one connection per tick)."""

    def __init__(self, connection: sqlite3.Connection):
        self._db = connection

    @classmethod
    def open(cls, path: str) -> MarksStore:
        """Open (creating it and its folder if needed) the marks file at ``path``."""
        try:
            db = sqlite3.connect(path, timeout=30, isolation_level=None)
        except sqlite3.OperationalError:  # no folder yet (checked only then: a tick stats nothing it need not)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            db = sqlite3.connect(path, timeout=30, isolation_level=None)
        # write-ahead logging: a commit costs no fsync of the whole file; an OS crash can lose the
        # newest writes, which only makes the sensor look at those databases again (run keys dedupe)
        if db.execute("PRAGMA user_version").fetchone()[0] != _SCHEMA_VERSION:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(f"BEGIN; {_SCHEMA} PRAGMA user_version={_SCHEMA_VERSION}; COMMIT;")
        db.execute("PRAGMA synchronous=NORMAL")
        return cls(db)

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def __enter__(self) -> MarksStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def has_epoch(self, epoch: str) -> bool:
        """Whether rows of this epoch are kept (False: the file was reset or another epoch began)."""
        return self._db.execute("SELECT 1 FROM epochs WHERE epoch = ?", (epoch,)).fetchone() is not None

    def start_epoch(self, epoch: str) -> None:
        """Begin an epoch with no marks; the rows of every other epoch are dropped (one sensor per WAL base)."""
        with self._transaction():
            self._db.execute("DELETE FROM marks WHERE epoch != ?", (epoch,))
            self._db.execute("DELETE FROM epochs WHERE epoch != ?", (epoch,))
            self._db.execute("INSERT OR IGNORE INTO epochs VALUES (?)", (epoch,))

    def read(self, epoch: str, committed: int, databases: Iterable[str]) -> dict[str, DatabaseMark]:
        """The marks of these databases as of generation ``committed`` (those without one are absent)."""
        names = sorted(set(databases))
        out: dict[str, DatabaseMark] = {}
        for i in range(0, len(names), _CHUNK):
            chunk = names[i:i + _CHUNK]
            rows = self._db.execute(
                f"SELECT database, gen, mark, prev_gen, prev FROM marks WHERE epoch = ? AND database IN "
                f"({','.join('?' * len(chunk))})", (epoch, *chunk))
            out.update(_resolve(rows, committed))
        return out

    def read_all(self, epoch: str, committed: int) -> dict[str, DatabaseMark]:
        """Every mark of the epoch as of generation ``committed`` (a full scan's read)."""
        rows = self._db.execute("SELECT database, gen, mark, prev_gen, prev FROM marks WHERE epoch = ?", (epoch,))
        return _resolve(rows, committed)

    def pending(self, epoch: str, committed: int) -> list[str]:
        """Databases to look at whatever the journal says: not settled when last listed, or written
        by a tick after generation ``committed`` (its cursor was not stored; its markers are gone)."""
        unsettled = self._db.execute(
            "SELECT database FROM marks INDEXED BY marks_pending WHERE epoch = ? AND pending = 1", (epoch,))
        uncommitted = self._db.execute(
            "SELECT database FROM marks INDEXED BY marks_gen WHERE epoch = ? AND gen > ?", (epoch, committed))
        return sorted({r[0] for r in unsettled} | {r[0] for r in uncommitted})

    def write(self, epoch: str, committed: int, marks: Mapping[str, DatabaseMark], gone: Iterable[str] = ()) -> None:
        """Store the marks of one tick at generation ``committed + 1`` (one transaction), keeping each
        row's version as of ``committed``; ``gone`` databases are marked as having left."""
        committed = int(committed)  # (interpolated below: the upsert's SET clause takes no per-row value)
        gen = committed + 1
        rows = [(epoch, db, gen, m.to_json(), int(m.stamp is None), int(m.first_quarantined is not None),
                 m.waiting, m.first_quarantined) for db, m in marks.items()]
        rows += [(epoch, db, gen, None, 0, 0, 0, None) for db in gone]
        if not rows:
            return
        with self._transaction():
            # the version before is kept only from a committed write: a write at a generation above
            # `committed` came from a tick whose cursor was lost, and is replaced, not kept
            self._db.executemany(
                "INSERT INTO marks (epoch, database, gen, mark, pending, blocked, waiting, first_q) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (epoch, database) DO UPDATE SET "
                f"prev = CASE WHEN gen <= {committed} THEN mark ELSE prev END, "
                f"prev_gen = CASE WHEN gen <= {committed} THEN gen ELSE prev_gen END, "
                "gen = excluded.gen, mark = excluded.mark, pending = excluded.pending, "
                "blocked = excluded.blocked, waiting = excluded.waiting, first_q = excluded.first_q",
                rows)

    def purge_gone(self, epoch: str, committed: int) -> None:
        """Drop rows of databases that left, once the tick that saw them leave is committed."""
        with self._transaction():
            self._db.execute("DELETE FROM marks WHERE epoch = ? AND mark IS NULL AND gen <= ?", (epoch, committed))

    def blocked(self, epoch: str, limit: int) -> BlockedSummary:
        """The databases with a quarantined segment (newest marks): how many, how many sealed
        segments wait behind them, and the first ``limit`` by name. Reads only those rows."""
        count, waiting = self._db.execute(
            "SELECT count(*), coalesce(sum(waiting), 0) FROM marks INDEXED BY marks_blocked "
            "WHERE epoch = ? AND blocked = 1", (epoch,)).fetchone()
        first = self._db.execute(
            "SELECT database, first_q FROM marks INDEXED BY marks_blocked WHERE epoch = ? AND blocked = 1 "
            "ORDER BY database LIMIT ?",
            (epoch, limit)).fetchall()
        return BlockedSummary(int(count), int(waiting), tuple((str(db), int(q)) for db, q in first))

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *rest: object) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")


def _resolve(rows: Iterable[tuple[str, int, str | None, int | None, str | None]],
             committed: int) -> dict[str, DatabaseMark]:
    """Each row's version as of generation ``committed``: the newest if written by then, else the
    one before it (if that was); a database that left has none."""
    out = {}
    for database, gen, mark, prev_gen, prev in rows:
        text = mark if gen <= committed else (prev if prev_gen is not None and prev_gen <= committed else None)
        if text is not None:
            out[database] = DatabaseMark.from_json(text)
    return out


__all__ = ["MARKS_FILE", "SENSOR_STATE", "BlockedSummary", "DatabaseMark", "MarksStore", "SegmentMark",
           "marks_path", "summarize_blocked"]
