"""The catalog's state space: files, actions, transactions, and the state they fold into.

``apply_transaction`` is the one transition: a pure function from a state and
a transaction to the next state, refusing actions that no longer apply (a
remove of a file that is not live, a segment applied twice).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Union

from history_pipeline.errors import CommitConflictError
from history_pipeline.events import GENESIS_T
from history_pipeline.schema import SchemaHistoryEntry
from history_pipeline.supertable import FileKind  # a file's kind is the file's own (its footer says it)

FORMAT_VERSION = 1


@dataclass(frozen=True)
class FileEntry:
    """A live Parquet file and its statistics."""

    path: str
    kind: FileKind
    table_uuid: str | None
    size_bytes: int
    row_count: int
    min_t: int | None
    max_t: int | None
    min_key: int | None = None
    max_key: int | None = None
    segments: tuple[int, ...] = ()
    snapshot_as_of: int | None = None
    #: the file's rows carry ``superseded_at`` for the closed interval ending at this snapshot t
    closed_until: int | None = None
    #: the row order of a closed file (``supertable.CLOSED_LAYOUT``; None: key-sorted whole)
    closed_layout: int | None = None
    #: a snapshot piece whose rows are also versions: those written in the interval before
    #: ``snapshot_as_of`` and current at it (kept only here; see ``maintenance/snapshots.py``)
    holds_versions: bool = False

    @property
    def is_versions(self) -> bool:
        """Are the file's rows versions (row history, reads inside their interval)?"""
        return self.kind is FileKind.VERSIONS or self.holds_versions

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind.value,
            "table_uuid": self.table_uuid,
            "size_bytes": self.size_bytes,
            "row_count": self.row_count,
            "min_t": self.min_t,
            "max_t": self.max_t,
            "min_key": self.min_key,
            "max_key": self.max_key,
            "segments": list(self.segments),
            "snapshot_as_of": self.snapshot_as_of,
            **({"closed_until": self.closed_until} if self.closed_until is not None else {}),
            **({"closed_layout": self.closed_layout} if self.closed_layout is not None else {}),
            **({"holds_versions": True} if self.holds_versions else {}),
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> FileEntry:
        return FileEntry(
            path=obj["path"],
            kind=FileKind(obj["kind"]),
            table_uuid=obj["table_uuid"],
            size_bytes=obj["size_bytes"],
            row_count=obj["row_count"],
            min_t=obj["min_t"],
            max_t=obj["max_t"],
            min_key=obj.get("min_key"),
            max_key=obj.get("max_key"),
            segments=tuple(obj.get("segments", ())),
            snapshot_as_of=obj.get("snapshot_as_of"),
            closed_until=obj.get("closed_until"),
            closed_layout=obj.get("closed_layout"),
            holds_versions=bool(obj.get("holds_versions", False)),
        )


@dataclass(frozen=True)
class Tombstone:
    """A removed file, kept until its grace period has passed."""

    entry: FileEntry
    removed_at: float


# --- actions --------------------------------------------------------------------


@dataclass(frozen=True)
class Protocol:
    """Upgrade/version marker: readers refuse a catalog newer than they understand."""

    version: int


@dataclass(frozen=True)
class AddFile:
    entry: FileEntry


@dataclass(frozen=True)
class RemoveFile:
    path: str
    removed_at: float


@dataclass(frozen=True)
class AdvanceFrontier:
    frontier: int


@dataclass(frozen=True)
class ApplySegments:
    segments: tuple[int, ...]


@dataclass(frozen=True)
class AddSchemaHistory:
    entries: tuple[SchemaHistoryEntry, ...]


@dataclass(frozen=True)
class SetEarliest:
    """Retention (or a cold-tier load-back): answers exist only for as_of >= earliest."""

    earliest: int


@dataclass(frozen=True)
class ForgetTombstones:
    """The tombstoned files were deleted from storage."""

    paths: tuple[str, ...]


@dataclass(frozen=True)
class RecordErasure:
    """An erasure of keys of one table (the commit's removes and adds rewrite its files).

    It names the table, how many keys and a SHA-256 over them (so an auditor holding the
    request can confirm it), who asked, when and why, never the erased keys or values.
    It changes no state: the files it rewrote are the commit's own actions.
    """

    table_uuid: str
    key_count: int
    keys_sha256: str
    requested_by: str
    reason: str
    erased_at: float
    files_rewritten: int
    #: how many of the keys had anything to erase (a version, a WAL event, a purged or exported
    #: row); None in records written before it was counted
    keys_found: int | None = None


@dataclass(frozen=True)
class SetTableTtl:
    """A table property: versions older than ``ttl`` logical-timestamp units below the frontier
    are dropped by TTL retention (None: no TTL)."""

    table_uuid: str
    ttl: int | None


@dataclass(frozen=True)
class SetTableEarliest:
    """TTL retention of one table: its answers exist only for as_of >= earliest."""

    table_uuid: str
    earliest: int


Action = Union[
    Protocol, AddFile, RemoveFile, AdvanceFrontier, ApplySegments, AddSchemaHistory, SetEarliest, ForgetTombstones,
    RecordErasure, SetTableTtl, SetTableEarliest,
]


def action_to_json(action: Action) -> dict[str, Any]:
    if isinstance(action, Protocol):
        return {"action": "protocol", "version": action.version}
    if isinstance(action, AddFile):
        return {"action": "add_file", "file": action.entry.to_json()}
    if isinstance(action, RemoveFile):
        return {"action": "remove_file", "path": action.path, "removed_at": action.removed_at}
    if isinstance(action, AdvanceFrontier):
        return {"action": "advance_frontier", "frontier": action.frontier}
    if isinstance(action, ApplySegments):
        return {"action": "apply_segments", "segments": list(action.segments)}
    if isinstance(action, AddSchemaHistory):
        return {"action": "schema_history", "entries": [e.to_json() for e in action.entries]}
    if isinstance(action, SetEarliest):
        return {"action": "set_earliest", "earliest": action.earliest}
    if isinstance(action, ForgetTombstones):
        return {"action": "forget_tombstones", "paths": list(action.paths)}
    if isinstance(action, RecordErasure):
        return {"action": "erasure", "table_uuid": action.table_uuid, "key_count": action.key_count,
                "keys_sha256": action.keys_sha256, "requested_by": action.requested_by, "reason": action.reason,
                "erased_at": action.erased_at, "files_rewritten": action.files_rewritten,
                "keys_found": action.keys_found}
    if isinstance(action, SetTableTtl):
        return {"action": "set_table_ttl", "table_uuid": action.table_uuid, "ttl": action.ttl}
    if isinstance(action, SetTableEarliest):
        return {"action": "set_table_earliest", "table_uuid": action.table_uuid, "earliest": action.earliest}
    raise TypeError(f"not an action: {action!r}")


def action_from_json(obj: Mapping[str, Any]) -> Action:
    kind = obj["action"]
    if kind == "protocol":
        return Protocol(obj["version"])
    if kind == "add_file":
        return AddFile(FileEntry.from_json(obj["file"]))
    if kind == "remove_file":
        return RemoveFile(obj["path"], obj["removed_at"])
    if kind == "advance_frontier":
        return AdvanceFrontier(obj["frontier"])
    if kind == "apply_segments":
        return ApplySegments(tuple(obj["segments"]))
    if kind == "schema_history":
        return AddSchemaHistory(tuple(SchemaHistoryEntry.from_json(e) for e in obj["entries"]))
    if kind == "set_earliest":
        return SetEarliest(obj["earliest"])
    if kind == "forget_tombstones":
        return ForgetTombstones(tuple(obj["paths"]))
    if kind == "erasure":
        return RecordErasure(obj["table_uuid"], obj["key_count"], obj["keys_sha256"], obj["requested_by"],
                             obj["reason"], obj["erased_at"], obj["files_rewritten"], obj.get("keys_found"))
    if kind == "set_table_ttl":
        return SetTableTtl(obj["table_uuid"], obj["ttl"])
    if kind == "set_table_earliest":
        return SetTableEarliest(obj["table_uuid"], obj["earliest"])
    raise ValueError(f"unknown catalog action {kind!r}")


@dataclass(frozen=True)
class Transaction:
    """One commit: linear id, its uuid, its predecessor's uuid, and its actions."""

    txn_id: int
    uuid: str
    previous_uuid: str | None
    committed_at: float
    operation: str
    actions: tuple[Action, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "txn_id": self.txn_id,
            "uuid": self.uuid,
            "previous_uuid": self.previous_uuid,
            "committed_at": self.committed_at,
            "operation": self.operation,
            "actions": [action_to_json(a) for a in self.actions],
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> Transaction:
        return Transaction(
            txn_id=obj["txn_id"],
            uuid=obj["uuid"],
            previous_uuid=obj["previous_uuid"],
            committed_at=obj["committed_at"],
            operation=obj["operation"],
            actions=tuple(action_from_json(a) for a in obj["actions"]),
        )


def _frozen(d: dict[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(d)


@dataclass(frozen=True)
class CatalogState:
    """Everything the catalog says at one transaction."""

    txn_id: int = -1
    txn_uuid: str | None = None
    committed_at: float = 0.0
    version: int = FORMAT_VERSION
    files: Mapping[str, FileEntry] = field(default_factory=lambda: _frozen({}))
    tombstones: Mapping[str, Tombstone] = field(default_factory=lambda: _frozen({}))
    frontier: int = GENESIS_T
    applied_segments: frozenset[int] = frozenset()
    schema_history: tuple[SchemaHistoryEntry, ...] = ()
    earliest: int = 0
    #: per-table properties: TTL in logical-timestamp units, and the purge point TTL retention set
    table_ttl: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    table_earliest: Mapping[str, int] = field(default_factory=lambda: _frozen({}))

    def earliest_of(self, table_uuid: str) -> int:
        """The smallest answerable as_of for one table (the database's, or its TTL purge point)."""
        return max(self.earliest, self.table_earliest.get(table_uuid, 0))

    def versions_of(self, table_uuid: str) -> list[FileEntry]:
        """Live files of one table whose rows are versions (``FileEntry.is_versions``), by path."""
        return [f for f in self.files_of(table_uuid) if f.is_versions]

    def files_of(self, table_uuid: str, kind: FileKind | None = None) -> list[FileEntry]:
        """Live files of one table (optionally of one kind), by path."""
        of_table = self._files_by_table.get(table_uuid, ())
        return [f for f in of_table if kind is None or f.kind is kind]

    @functools.cached_property
    def derived(self) -> dict[Any, Any]:
        """Views readers derive from this state and keep with it (a state never changes, so they
        hold as long as it does): e.g. ``catalog.files.select_files``'s selections."""
        return {}

    @functools.cached_property
    def _files_by_table(self) -> Mapping[str | None, tuple[FileEntry, ...]]:
        """Each table's live files by path, computed once per state (a state never changes, and
        every read selects its files from them)."""
        by_table: dict[str | None, list[FileEntry]] = {}
        for f in sorted(self.files.values(), key=lambda f: f.path):
            by_table.setdefault(f.table_uuid, []).append(f)
        return {table: tuple(files) for table, files in by_table.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "txn_id": self.txn_id,
            "txn_uuid": self.txn_uuid,
            "committed_at": self.committed_at,
            "version": self.version,
            "files": [f.to_json() for f in self.files.values()],
            "tombstones": [
                {"file": t.entry.to_json(), "removed_at": t.removed_at} for t in self.tombstones.values()
            ],
            "frontier": self.frontier,
            "applied_segments": sorted(self.applied_segments),
            "schema_history": [e.to_json() for e in self.schema_history],
            "earliest": self.earliest,
            "table_ttl": dict(self.table_ttl),
            "table_earliest": dict(self.table_earliest),
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> CatalogState:
        files = {f["path"]: FileEntry.from_json(f) for f in obj["files"]}
        tombs = {
            t["file"]["path"]: Tombstone(FileEntry.from_json(t["file"]), t["removed_at"])
            for t in obj["tombstones"]
        }
        return CatalogState(
            txn_id=obj["txn_id"],
            txn_uuid=obj["txn_uuid"],
            committed_at=obj["committed_at"],
            version=obj["version"],
            files=_frozen(files),
            tombstones=_frozen(tombs),
            frontier=obj["frontier"],
            applied_segments=frozenset(obj["applied_segments"]),
            schema_history=tuple(SchemaHistoryEntry.from_json(e) for e in obj["schema_history"]),
            earliest=obj["earliest"],
            table_ttl=_frozen(dict(obj.get("table_ttl", {}))),
            table_earliest=_frozen(dict(obj.get("table_earliest", {}))),
        )


def apply_transaction(state: CatalogState, txn: Transaction) -> CatalogState:
    """The state after ``txn``; raises :class:`CommitConflictError` if an action no longer applies."""
    if txn.txn_id != state.txn_id + 1:
        raise CommitConflictError(f"transaction {txn.txn_id} does not follow {state.txn_id}")
    if txn.previous_uuid != state.txn_uuid:
        raise CommitConflictError(
            f"transaction {txn.txn_id} names predecessor {txn.previous_uuid}, but it is {state.txn_uuid}"
        )
    files = dict(state.files)
    tombstones = dict(state.tombstones)
    applied = set(state.applied_segments)
    history = list(state.schema_history)
    frontier, earliest, version = state.frontier, state.earliest, state.version
    ttls, table_earliest = dict(state.table_ttl), dict(state.table_earliest)
    for action in txn.actions:
        if isinstance(action, Protocol):
            version = action.version
        elif isinstance(action, AddFile):
            if action.entry.path in files:
                raise CommitConflictError(f"file {action.entry.path} is already live")
            files[action.entry.path] = action.entry
            tombstones.pop(action.entry.path, None)  # a restored file is live again
        elif isinstance(action, RemoveFile):
            entry = files.pop(action.path, None)
            if entry is None:
                raise CommitConflictError(f"file {action.path} is not live any more (removed by another commit?)")
            tombstones[action.path] = Tombstone(entry, action.removed_at)
        elif isinstance(action, AdvanceFrontier):
            if action.frontier < frontier:
                raise CommitConflictError(f"frontier cannot go back from {frontier} to {action.frontier}")
            frontier = action.frontier
        elif isinstance(action, ApplySegments):
            again = applied.intersection(action.segments)
            if again:
                raise CommitConflictError(f"segment(s) {sorted(again)} already applied")
            applied.update(action.segments)
        elif isinstance(action, AddSchemaHistory):
            history.extend(action.entries)
        elif isinstance(action, SetEarliest):
            earliest = action.earliest
        elif isinstance(action, ForgetTombstones):
            for path in action.paths:
                tombstones.pop(path, None)
        elif isinstance(action, SetTableTtl):
            if action.ttl is None:
                ttls.pop(action.table_uuid, None)
            else:
                ttls[action.table_uuid] = action.ttl
        elif isinstance(action, SetTableEarliest):
            table_earliest[action.table_uuid] = action.earliest
    return replace(
        state,
        txn_id=txn.txn_id,
        txn_uuid=txn.uuid,
        committed_at=txn.committed_at,
        version=version,
        files=_frozen(files),
        tombstones=_frozen(tombstones),
        frontier=frontier,
        applied_segments=frozenset(applied),
        schema_history=tuple(history),
        earliest=earliest,
        table_ttl=_frozen(ttls),
        table_earliest=_frozen(table_earliest),
    )
