"""The change journal: one empty marker file per WAL transition the sensor must see.

``<wal base>/_changes/`` sits beside the WAL folders of every database (the folder that holds one
WAL folder per database). A seal, quarantine, repair, skip or release creates one new empty file
there named ``<time_ns>-<pid>-<seq>-<database>`` (created with ``O_EXCL``, so never overwritten).
The sensor lists this one folder on a steady tick instead of every database's folders, lists the
WALs of the databases named, then deletes exactly the markers it read: a marker created after
that read survives to the next tick. A marker is a hint, never data: a missing one is caught by
the sensor's periodic full scan, a spare one costs one database listing.

Only a journal folder that exists is written to (the sensor creates it): a WAL under no sensor,
or in a layout the writer cannot tell apart, leaves nothing behind.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

#: the journal folder's name under the WAL base (not a database name: those begin with a letter or digit)
JOURNAL = "_changes"

_sequence = itertools.count()


@dataclass(frozen=True)
class Marker:
    """One marker file of the journal."""

    name: str  # the file's name in the journal folder
    database: str  # the database it names ("" when the name is not a marker's)


def journal_dir(wal_base: str | Path) -> str:
    """The journal folder of a WAL base (a string path: the sensor reads it on every tick)."""
    return os.path.join(wal_base, JOURNAL)


def journals_of(wal_dir: str | Path) -> list[tuple[str, str]]:
    """Where a WAL's markers go: ``(journal folder, database)`` for each layout the WAL folder can
    be in. ``<base>/<database>`` (a WAL root, or an S3 root's local WALs) and, for a folder named
    ``wal``, ``<base>/<database>/wal`` (a local root). Only the layout whose journal exists is used."""
    path = os.path.abspath(wal_dir)
    parent, name = os.path.split(path)
    found = [(journal_dir(parent), name)]
    if name == "wal":
        grandparent, database = os.path.split(parent)
        found.insert(0, (journal_dir(grandparent), database))
    return [(journal, db) for journal, db in found if db not in ("", ".", "..")]


def note_change(wal_dir: str | Path) -> list[str]:
    """Leave one marker naming the WAL's database in its journal; returns the marker paths written.

    Never raises: a marker is a hint, and the transition it announces has already happened and is
    durable. Without a journal folder nothing is written (the sensor then scans every WAL)."""
    written = []
    for journal, database in journals_of(wal_dir):
        for _ in range(3):  # a name already taken (same clock tick, pid and sequence) is retried
            path = os.path.join(journal, f"{time.time_ns()}-{os.getpid()}-{next(_sequence)}-{database}")
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except FileExistsError:
                continue
            except OSError:  # no journal folder here (not this layout, or no sensor): nothing to tell
                break
            written.append(path)
            break
    return written


def parse_marker(name: str) -> Marker:
    """The database a marker's file name names (``""`` for a name that is not a marker's)."""
    parts = name.split("-", 3)
    if len(parts) != 4 or not all(p.isdigit() for p in parts[:3]):
        return Marker(name, "")
    return Marker(name, parts[3])


def read_journal(journal: str | Path) -> tuple[Marker, ...] | None:
    """Every marker in the journal folder (one folder read), or None when the folder is missing."""
    try:
        with os.scandir(journal) as entries:
            names = [e.name for e in entries if not e.name.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):
        return None
    return tuple(parse_marker(n) for n in sorted(names))


def ensure_journal(wal_base: str | Path) -> bool:
    """Create the journal folder under an existing WAL base; False when the base does not exist."""
    if not os.path.isdir(wal_base):
        return False
    os.makedirs(journal_dir(wal_base), exist_ok=True)
    return True


def consume(journal: str | Path, markers: tuple[Marker, ...] | list[Marker]) -> None:
    """Delete exactly these markers (read earlier): a marker created since stays for the next read."""
    for marker in markers:
        try:
            os.unlink(os.path.join(journal, marker.name))
        except FileNotFoundError:  # consumed by another evaluation already
            continue


__all__ = ["JOURNAL", "Marker", "consume", "ensure_journal", "journal_dir", "journals_of", "note_change",
           "parse_marker", "read_journal"]
