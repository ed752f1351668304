"""Decoding of PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1), pure.

``pg_logical_slot_peek_binary_changes(slot, NULL, n, 'proto_version', '1', 'publication_names', p)``
returns one message per row; :func:`decode_message` turns its bytes into one of the immutable
message types below. Tuple values stay in their text form (``None`` for NULL, :data:`UNCHANGED`
for an unchanged TOASTed value that the message leaves out).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Union

from history_pipeline.errors import HistoryError


class ProtocolError(HistoryError):
    """A pgoutput message could not be decoded."""


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


#: A TOASTed value that an update left unchanged (pgoutput does not send it again).
UNCHANGED: Any = _Unchanged()


@dataclass(frozen=True)
class Begin:
    final_lsn: int  # the commit record's LSN
    commit_time: int
    xid: int


@dataclass(frozen=True)
class Commit:
    commit_lsn: int  # the commit record's (start) LSN: the transaction's logical timestamp
    end_lsn: int  # just past the commit record: where the slot advances to
    commit_time: int


@dataclass(frozen=True)
class RelationColumn:
    name: str
    type_oid: int
    typmod: int
    is_key: bool


@dataclass(frozen=True)
class Relation:
    relid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]


Tuple = tuple[Any, ...]


@dataclass(frozen=True)
class InsertMessage:
    relid: int
    new: Tuple


@dataclass(frozen=True)
class UpdateMessage:
    relid: int
    old: Tuple | None  # the old key ('K') or old row ('O') when sent
    new: Tuple


@dataclass(frozen=True)
class DeleteMessage:
    relid: int
    old: Tuple


@dataclass(frozen=True)
class TruncateMessage:
    relids: tuple[int, ...]


@dataclass(frozen=True)
class Ignored:
    """Origin, type and logical-decoding messages: nothing to capture."""

    kind: str


Message = Union[Begin, Commit, Relation, InsertMessage, UpdateMessage, DeleteMessage, TruncateMessage, Ignored]


_STRUCTS: dict[str, struct.Struct] = {}


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> Any:
        layout = _STRUCTS.get(fmt) or _STRUCTS.setdefault(fmt, struct.Struct(fmt))
        size = layout.size
        if self.pos + size > len(self.data):
            raise ProtocolError(f"pgoutput message ends early at byte {self.pos} (needs {size} more)")
        (value,) = layout.unpack_from(self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        end = self.data.index(b"\0", self.pos)
        text = self.data[self.pos : end].decode("utf-8")
        self.pos = end + 1
        return text

    def byte(self) -> str:
        return chr(self.take("!B"))

    def tuple_data(self) -> Tuple:
        values, self.pos = _tuple_data(self.data, self.pos)
        return values


_COUNT = struct.Struct("!h")
_LENGTH = struct.Struct("!i")
_RELID = struct.Struct("!I")
_INSERT, _NEW = ord("I"), ord("N")
_TEXT, _NULL, _UNCHANGED_KIND, _BINARY = ord("t"), ord("n"), ord("u"), ord("b")


def _tuple_data(data: bytes, pos: int) -> tuple[Tuple, int]:
    """The values of a TupleData at ``pos`` and the position after it (the hot loop of a capture: one
    pass with local names, no call per field)."""
    size = len(data)
    if pos + 2 > size:
        raise ProtocolError(f"pgoutput message ends early at byte {pos} (needs 2 more)")
    (count,) = _COUNT.unpack_from(data, pos)
    pos += 2
    values: list[Any] = []
    append, length_at = values.append, _LENGTH.unpack_from
    for _ in range(count):
        if pos >= size:
            raise ProtocolError(f"pgoutput message ends early at byte {pos} (needs 1 more)")
        kind = data[pos]
        pos += 1
        if kind == _TEXT:
            if pos + 4 > size:
                raise ProtocolError(f"pgoutput message ends early at byte {pos} (needs 4 more)")
            (length,) = length_at(data, pos)
            pos += 4
            end = pos + length
            if end > size:
                raise ProtocolError(f"pgoutput message ends early at byte {pos} (needs {length} more)")
            append(data[pos:end].decode("utf-8"))
            pos = end
        elif kind == _NULL:
            append(None)
        elif kind == _UNCHANGED_KIND:
            append(UNCHANGED)
        elif kind == _BINARY:
            raise ProtocolError("binary tuple values are not requested and cannot be read")
        else:
            raise ProtocolError(f"unknown tuple value kind {chr(kind)!r}")
    return tuple(values), pos


def decode_message(data: bytes) -> Message:
    """One pgoutput message (protocol version 1) as an immutable value."""
    if not data:
        raise ProtocolError("empty pgoutput message")
    data = bytes(data)
    if data[0] == _INSERT and len(data) >= 6 and data[5] == _NEW:  # most messages: straight to the tuple
        values, end = _tuple_data(data, 6)
        if end != len(data):
            raise ProtocolError(f"pgoutput insert message has {len(data) - end} bytes after its tuple")
        return InsertMessage(_RELID.unpack_from(data, 1)[0], values)
    r = _Reader(data)
    kind = r.byte()
    if kind == "B":
        return Begin(final_lsn=r.take("!Q"), commit_time=r.take("!q"), xid=r.take("!I"))
    if kind == "C":
        r.take("!B")  # flags (unused)
        return Commit(commit_lsn=r.take("!Q"), end_lsn=r.take("!Q"), commit_time=r.take("!q"))
    if kind == "R":
        relid, namespace, name, identity = r.take("!I"), r.string(), r.string(), r.byte()
        columns = []
        for _ in range(r.take("!h")):
            flags = r.take("!B")
            columns.append(RelationColumn(r.string(), r.take("!I"), r.take("!i"), bool(flags & 1)))
        return Relation(relid, namespace, name, identity, tuple(columns))
    if kind == "I":
        relid = r.take("!I")
        if r.byte() != "N":
            raise ProtocolError("insert message without a new tuple")
        return InsertMessage(relid, r.tuple_data())
    if kind == "U":
        relid = r.take("!I")
        marker = r.byte()
        old = None
        if marker in ("K", "O"):
            old = r.tuple_data()
            marker = r.byte()
        if marker != "N":
            raise ProtocolError("update message without a new tuple")
        return UpdateMessage(relid, old, r.tuple_data())
    if kind == "D":
        relid = r.take("!I")
        if r.byte() not in ("K", "O"):
            raise ProtocolError("delete message without an old key")
        return DeleteMessage(relid, r.tuple_data())
    if kind == "T":
        count = r.take("!I")
        r.take("!B")  # options (CASCADE, RESTART IDENTITY)
        return TruncateMessage(tuple(r.take("!I") for _ in range(count)))
    if kind in ("O", "Y", "M"):
        return Ignored(kind)
    raise ProtocolError(f"unknown pgoutput message type {kind!r}")
