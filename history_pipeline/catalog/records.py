"""Commit records: a durable copy of every committed transaction beside the data it names.

A record is written only after its transaction's file was created (the commit
point), so a record proves its commit. Records live under
``<database>/_history_catalog/commits/`` (outside the catalog folder, so they
survive a lost or replaced catalog) and are named by transaction id, which
never repeats: a rebuilt catalog continues the numbering. A *base* record holds
a full state (written by ``rebuild``); replay starts from the newest base.

A crash between a commit and its record leaves a gap that ``repair`` fills from
the transaction log (rebuild and garbage collection call it first).
"""

from __future__ import annotations

from dataclasses import dataclass

from history_pipeline.catalog.model import CatalogState, Transaction
from history_pipeline.errors import CorruptTransactionError, ObjectNotFoundError
from history_pipeline.io.store import ObjectStore

ID_WIDTH = 20
BASE_SUFFIX = ".base.json"
RECORD_SUFFIX = ".txn.json"


def records_prefix_for(catalog_prefix: str) -> str | None:
    """Where the records of a catalog at ``<database>/_catalog`` live (None for other layouts)."""
    if not catalog_prefix.endswith("/_catalog"):
        return None
    return f"{catalog_prefix[: -len('/_catalog')]}/_history_catalog/commits"


def record_path(prefix: str, txn_id: int) -> str:
    return f"{prefix}/{txn_id:0{ID_WIDTH}d}{RECORD_SUFFIX}"


def base_path(prefix: str, txn_id: int) -> str:
    return f"{prefix}/{txn_id:0{ID_WIDTH}d}{BASE_SUFFIX}"


def write_record(store: ObjectStore, prefix: str, txn: Transaction) -> None:
    """Record a committed transaction (idempotent: the same id always holds the same body)."""
    from history_pipeline.catalog.log import encode_document

    store.put(record_path(prefix, txn.txn_id), encode_document(txn.to_json()))


def write_base(store: ObjectStore, prefix: str, state: CatalogState) -> None:
    """Record a full state (a rebuilt catalog's starting point)."""
    from history_pipeline.catalog.log import encode_document

    store.put(base_path(prefix, state.txn_id), encode_document(state.to_json()))


@dataclass(frozen=True)
class RecordIds:
    """The ids of the records and bases present under a prefix."""

    records: tuple[int, ...]
    bases: tuple[int, ...]


def list_record_ids(store: ObjectStore, prefix: str) -> RecordIds:
    records, bases = [], []
    for obj in store.list(f"{prefix}/"):
        name = obj.path.rsplit("/", 1)[-1]
        stem = name.split(".", 1)[0]
        if not stem.isdigit():
            continue
        if name.endswith(RECORD_SUFFIX):
            records.append(int(stem))
        elif name.endswith(BASE_SUFFIX):
            bases.append(int(stem))
    return RecordIds(tuple(sorted(records)), tuple(sorted(bases)))


def read_record(store: ObjectStore, prefix: str, txn_id: int) -> Transaction:
    from history_pipeline.catalog.log import decode_document

    path = record_path(prefix, txn_id)
    txn = Transaction.from_json(decode_document(path, store.get(path)))
    if txn.txn_id != txn_id:
        raise CorruptTransactionError(path, f"holds transaction {txn.txn_id}, not {txn_id}")
    return txn


def read_base(store: ObjectStore, prefix: str, txn_id: int) -> CatalogState:
    from history_pipeline.catalog.log import decode_document

    path = base_path(prefix, txn_id)
    return CatalogState.from_json(decode_document(path, store.get(path)))


def records_after(store: ObjectStore, prefix: str) -> tuple[CatalogState | None, list[Transaction]]:
    """The newest base (if any) and every record after it, in transaction order."""
    ids = list_record_ids(store, prefix)
    base = None
    for base_id in reversed(ids.bases):
        try:
            base = read_base(store, prefix, base_id)
            break
        except (ObjectNotFoundError, CorruptTransactionError):
            continue  # an unreadable base: fall back to an older one (its records are kept)
    start = base.txn_id if base is not None else -1
    return base, [read_record(store, prefix, i) for i in ids.records if i > start]


def prune_records(store: ObjectStore, prefix: str, upto: int) -> int:
    """Delete the records that the newest base at or below ``upto`` supersedes (and older bases).

    Returns how many records went; the base itself is kept, so replay starts from it.
    """
    ids = list_record_ids(store, prefix)
    covers = [b for b in ids.bases if b <= upto]
    if not covers:
        return 0
    cover = covers[-1]
    removed = 0
    for txn_id in ids.records:
        if txn_id <= cover:
            store.delete(record_path(prefix, txn_id))
            removed += 1
    for txn_id in ids.bases:
        if txn_id < cover:
            store.delete(base_path(prefix, txn_id))
    return removed
