"""The catalog's transaction log on an object store, with checkpoints.

Layout under ``<database>/_catalog/``::

    transactions/<txn_id, 20 digits>.json   one per commit, created by put-if-absent
    checkpoints/<txn_id, 20 digits>.json    the full state at that transaction

Each file is its JSON body, a newline, and the SHA-256 of the body, so a
truncated or flipped file is a :class:`CorruptTransactionError` naming it.
A transaction commits exactly when its file is created; two writers racing
for one id cannot both win. Checkpoints are an optimization: the state from a
checkpoint equals the state from replaying the log.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from history_pipeline.catalog.ledger import ledger_prefix_for, write_entries
from history_pipeline.catalog.model import (
    FORMAT_VERSION,
    Action,
    CatalogState,
    Protocol,
    Transaction,
    apply_transaction,
)
from history_pipeline.catalog.records import list_record_ids, records_prefix_for, write_record
from history_pipeline.errors import (
    CatalogError,
    CommitConflictError,
    CorruptTransactionError,
    ObjectExistsError,
    ObjectNotFoundError,
    TransactionNotFoundError,
)
from history_pipeline.io.store import ObjectStore, now

ID_WIDTH = 20
DEFAULT_CHECKPOINT_INTERVAL = 20

Builder = Callable[[CatalogState], Sequence[Action] | None]


def encode_document(body: dict[str, Any]) -> bytes:
    text = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    return text + b"\n" + hashlib.sha256(text).hexdigest().encode() + b"\n"


def decode_document(path: str, data: bytes) -> dict[str, Any]:
    parts = data.split(b"\n")
    if len(parts) != 3 or parts[2] != b"":
        raise CorruptTransactionError(path, "truncated or malformed (expected a body and its checksum)")
    body, digest = parts[0], parts[1]
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise CorruptTransactionError(path, "checksum mismatch: the file is corrupted")
    try:
        return json.loads(body)
    except ValueError as exc:  # pragma: no cover - a matching checksum makes this unlikely
        raise CorruptTransactionError(path, f"unreadable JSON: {exc}") from None


class TransactionLog:
    """Commit, read, time-travel, checkpoint and prune one database's catalog."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        *,
        checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
        records_prefix: str | None = "",
    ):
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.checkpoint_interval = checkpoint_interval
        #: where commit records are written after each commit ("": beside the data of
        #: ``<database>/_catalog``; None: nowhere)
        self.records_prefix = records_prefix_for(self.prefix) if records_prefix == "" else records_prefix
        #: where the erasure ledger is kept (never pruned, see ``catalog.ledger``)
        self.ledger_prefix = ledger_prefix_for(self.prefix)
        self._cached: CatalogState | None = None
        self._lock = threading.Lock()

    # --- paths ------------------------------------------------------------------

    def transaction_path(self, txn_id: int) -> str:
        return f"{self.prefix}/transactions/{txn_id:0{ID_WIDTH}d}.json"

    def checkpoint_path(self, txn_id: int) -> str:
        return f"{self.prefix}/checkpoints/{txn_id:0{ID_WIDTH}d}.json"

    # --- reading ------------------------------------------------------------------

    def read_transaction(self, txn_id: int) -> Transaction:
        """One transaction, verified; :class:`TransactionNotFoundError` if absent."""
        path = self.transaction_path(txn_id)
        try:
            data = self.store.get(path)
        except ObjectNotFoundError:
            raise TransactionNotFoundError(f"catalog transaction {txn_id} does not exist (or was pruned)") from None
        body = decode_document(path, data)
        txn = Transaction.from_json(body)
        if txn.txn_id != txn_id:
            raise CorruptTransactionError(path, f"holds transaction {txn.txn_id}, not {txn_id}")
        if body.get("format_version", 0) > FORMAT_VERSION:
            raise CatalogError(f"{path} uses catalog format {body['format_version']}; upgrade history_pipeline")
        return txn

    def read_checkpoint(self, txn_id: int) -> CatalogState:
        path = self.checkpoint_path(txn_id)
        body = decode_document(path, self.store.get(path))
        return CatalogState.from_json(body)

    def checkpoint_ids(self) -> list[int]:
        return _ids(self.store.list(f"{self.prefix}/checkpoints/"))

    def transaction_ids(self) -> list[int]:
        """Ids of every retained transaction (lists the store: not for hot paths)."""
        return _ids(self.store.list(f"{self.prefix}/transactions/"))

    def _base_for(self, txn_id: int | None) -> CatalogState:
        """The newest checkpoint at or below ``txn_id`` (or the empty state before txn 0)."""
        candidates = [c for c in self.checkpoint_ids() if txn_id is None or c <= txn_id]
        for checkpoint in reversed(candidates):
            try:
                return self.read_checkpoint(checkpoint)
            except ObjectNotFoundError:  # pruned meanwhile
                continue
        return CatalogState()

    def _replay(self, state: CatalogState, until: int | None) -> CatalogState:
        while until is None or state.txn_id < until:
            try:
                txn = self.read_transaction(state.txn_id + 1)
            except TransactionNotFoundError:
                if until is not None:
                    raise
                break
            state = apply_transaction(state, txn)
        return state

    def latest(self) -> CatalogState:
        """The newest committed state (newest checkpoint plus the transactions after it)."""
        with self._lock:
            first = self._cached is None
            base = self._cached if self._cached is not None else self._base_for(None)
            state = self._replay(base, None)
            if first:  # once per log object: one listing, not one per query
                self._check_no_hole(state)
            self._cached = state
            return state

    def _check_no_hole(self, state: CatalogState) -> None:
        """A transaction file deleted from the middle of the log (or the first one, before any
        checkpoint) would end the replay there, silently: the newest state would be an older one,
        or an empty database, and the next commit would write over the hole."""
        missing = state.txn_id + 1
        later = [i for i in self.transaction_ids() if i > missing]
        if later and not self.store.exists(self.transaction_path(missing)):  # (not a commit meanwhile)
            raise CorruptTransactionError(
                self.transaction_path(missing),
                f"missing, but later transactions exist (up to {later[-1]}): the log has a hole, so "
                "its newest state cannot be read; restore the file or run `history-pipeline rebuild-catalog`",
            )

    def state_at(self, txn_id: int) -> CatalogState:
        """The state as of a retained transaction id (time travel)."""
        if txn_id < 0:
            raise TransactionNotFoundError(f"no catalog transaction {txn_id}")
        base = self._base_for(txn_id)
        if base.txn_id < 0 and not self.store.exists(self.transaction_path(0)):
            raise TransactionNotFoundError(
                f"catalog transaction {txn_id} was pruned (no checkpoint covers it)"
            )
        return self._replay(base, txn_id)

    def forget_cached_state(self) -> None:
        """Drop the in-memory newest state (after the log was replaced under this object)."""
        with self._lock:
            self._cached = None

    def transaction_at_timestamp(self, t: int) -> int | None:
        """The newest transaction whose frontier is at or below logical timestamp ``t``."""
        state = self._base_for(0) if self.store.exists(self.transaction_path(0)) else self._base_for(None)
        found = state.txn_id if state.txn_id >= 0 and state.frontier <= t else None
        while True:
            try:
                txn = self.read_transaction(state.txn_id + 1)
            except TransactionNotFoundError:
                return found
            state = apply_transaction(state, txn)
            if state.frontier > t:
                return found
            found = state.txn_id

    # --- writing ------------------------------------------------------------------

    def commit(self, operation: str, build: Builder, *, max_attempts: int = 50) -> CatalogState:
        """Commit the actions ``build`` makes from the newest state, retrying on a lost race.

        ``build`` is called again after each lost race with the refreshed state; it
        returns None when there is nothing to do, and raises (or the actions fail to
        apply with :class:`CommitConflictError`) when its change no longer applies.
        """
        for _ in range(max_attempts):
            state = self.latest()
            actions = build(state)
            if actions is None:
                return state
            if state.txn_id < 0:
                actions = [Protocol(FORMAT_VERSION), *actions]
            txn = Transaction(
                txn_id=state.txn_id + 1,
                uuid=str(uuid.uuid4()),
                previous_uuid=state.txn_uuid,
                committed_at=now(),
                operation=operation,
                actions=tuple(actions),
            )
            new_state = apply_transaction(state, txn)
            try:
                self.store.put_if_absent(self.transaction_path(txn.txn_id), encode_document(txn.to_json()))
            except ObjectExistsError:
                continue  # another writer took this id: refresh and rebuild
            if self.records_prefix is not None:
                # after the commit point, so a record proves its commit; a crash before this
                # line leaves a gap that repair_records() fills from the log
                write_record(self.store, self.records_prefix, txn)
            # an erasure's record outlives the log (a crash before this line: ``prune`` writes it)
            write_entries(self.store, self.ledger_prefix, txn)
            with self._lock:
                if self._cached is None or self._cached.txn_id < new_state.txn_id:
                    self._cached = new_state
            if self.checkpoint_interval and new_state.txn_id > 0 and new_state.txn_id % self.checkpoint_interval == 0:
                self.write_checkpoint(new_state)
            return new_state
        raise CommitConflictError(
            f"gave up committing {operation!r} after {max_attempts} lost races; try again"
        )

    def repair_records(self) -> bool:
        """Write the commit record of every retained transaction that lacks one.

        Returns True when the whole retained log was read (so the records now mirror it).
        """
        if self.records_prefix is None:
            return False
        present = set(list_record_ids(self.store, self.records_prefix).records)
        ids = self.transaction_ids()
        complete = True
        for txn_id in ids:
            if txn_id in present:
                continue
            try:
                write_record(self.store, self.records_prefix, self.read_transaction(txn_id))
            except (CorruptTransactionError, TransactionNotFoundError, CatalogError):
                complete = False  # an unreadable transaction: rebuild falls back to the files
        if ids and ids != list(range(ids[0], ids[-1] + 1)):
            complete = False
        return complete

    def write_checkpoint(self, state: CatalogState) -> None:
        """Write the full state at ``state.txn_id`` beside the log."""
        self.store.put(self.checkpoint_path(state.txn_id), encode_document(state.to_json()))

    def prune(self, keep_from_txn: int) -> int:
        """Remove transactions before ``keep_from_txn`` that a checkpoint covers; returns how many.

        Only the beginning of the timeline is removed, and only up to the newest
        checkpoint at or below ``keep_from_txn``, so every retained id stays readable.
        """
        checkpoints = [c for c in self.checkpoint_ids() if c <= keep_from_txn]
        if not checkpoints:
            return 0
        cover = checkpoints[-1]
        removed = 0
        for txn_id in self.transaction_ids():
            if txn_id >= cover:
                break
            self._keep_erasures(txn_id)
            self.store.delete(self.transaction_path(txn_id))
            removed += 1
        for checkpoint in checkpoints[:-1]:
            self.store.delete(self.checkpoint_path(checkpoint))
        return removed

    def _keep_erasures(self, txn_id: int) -> None:
        """Before a transaction goes: its erasures into the ledger (if its commit did not get to)."""
        try:
            txn = self.read_transaction(txn_id)
        except (CorruptTransactionError, TransactionNotFoundError, CatalogError):
            return  # unreadable or gone: nothing can be taken from it
        write_entries(self.store, self.ledger_prefix, txn)

    def earliest_retained(self) -> int:
        """The oldest transaction id that can still be read."""
        ids = self.transaction_ids()
        checkpoints = self.checkpoint_ids()
        if ids and ids[0] == 0:
            return 0
        if checkpoints:
            return checkpoints[0]
        return ids[0] if ids else -1


def _ids(objects: Sequence[Any]) -> list[int]:
    ids = []
    for obj in objects:
        name = obj.path.rsplit("/", 1)[-1]
        stem = name.split(".", 1)[0]
        if stem.isdigit() and name.endswith(".json"):
            ids.append(int(stem))
    return sorted(ids)
