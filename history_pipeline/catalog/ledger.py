"""The erasure ledger: the record of every erasure, kept for good.

An erasure's commit records who asked, when, why, how many keys (and how many had anything
to erase) and a SHA-256 of the key set (:class:`RecordErasure`), never the keys or values.
The transaction log and the commit records are pruned (``cleanup``, ``purge_now``); the
ledger is not. One file per erasure commit, named by its transaction id, under
``<database>/_history_catalog/erasures/`` (outside the catalog folder, so a rebuilt catalog
keeps it too), each its JSON body, a newline and the body's SHA-256, as the log's files.

It is written right after the commit, and again from the log before any transaction holding an
erasure is pruned, so a crash between the two never loses an entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from history_pipeline.catalog.model import RecordErasure, Transaction, action_from_json, action_to_json
from history_pipeline.errors import ObjectNotFoundError
from history_pipeline.io.store import ObjectStore

ID_WIDTH = 20


@dataclass(frozen=True)
class ErasureEntry:
    """One erasure as the ledger keeps it (no key, no value: counts and a hash)."""

    txn_id: int
    committed_at: float
    table_uuid: str
    key_count: int
    keys_found: int | None
    keys_sha256: str
    requested_by: str
    reason: str
    files_rewritten: int


def ledger_prefix_for(catalog_prefix: str) -> str:
    """Where the ledger of a catalog at ``<database>/_catalog`` lives (beside it for other layouts)."""
    if catalog_prefix.endswith("/_catalog"):
        return f"{catalog_prefix[: -len('/_catalog')]}/_history_catalog/erasures"
    return f"{catalog_prefix}_erasures"


def entry_path(prefix: str, txn_id: int) -> str:
    return f"{prefix}/{txn_id:0{ID_WIDTH}d}.json"


def erasures_of(txn: Transaction) -> list[RecordErasure]:
    """The erasures a transaction records."""
    return [a for a in txn.actions if isinstance(a, RecordErasure)]


def write_entries(store: ObjectStore, prefix: str, txn: Transaction) -> bool:
    """Keep the erasures of ``txn`` in the ledger (idempotent); False when it records none."""
    from history_pipeline.catalog.log import encode_document

    found = erasures_of(txn)
    if not found:
        return False
    body = {"txn_id": txn.txn_id, "committed_at": txn.committed_at, "operation": txn.operation,
            "erasures": [action_to_json(a) for a in found]}
    store.put(entry_path(prefix, txn.txn_id), encode_document(body))
    return True


def read_ledger(store: ObjectStore, prefix: str) -> list[ErasureEntry]:
    """Every erasure the ledger keeps, oldest first."""
    from history_pipeline.catalog.log import decode_document

    entries = []
    for obj in store.list(f"{prefix}/"):
        name = obj.path.rsplit("/", 1)[-1]
        if not (name.endswith(".json") and name[: -len(".json")].isdigit()):
            continue
        try:
            body = decode_document(obj.path, store.get(obj.path))
        except ObjectNotFoundError:
            continue
        for raw in body["erasures"]:
            record = action_from_json(raw)
            assert isinstance(record, RecordErasure)
            entries.append(ErasureEntry(body["txn_id"], body["committed_at"], record.table_uuid, record.key_count,
                                        record.keys_found, record.keys_sha256, record.requested_by, record.reason,
                                        record.files_rewritten))
    return sorted(entries, key=lambda e: e.txn_id)
