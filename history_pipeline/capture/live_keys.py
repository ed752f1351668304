"""The keys of a table live in the history just before a point: what a captured TRUNCATE deletes.

The history of a table is its compacted state (as of the store's frontier) and, above the
frontier, the WAL's events not compacted yet (sealed and open segments). The keys live at ``t``
are the compacted state's keys as of ``min(t, frontier)`` with the WAL's inserts and deletes of
that table from above the frontier up to ``t`` applied in order.
"""

from __future__ import annotations

import json
from pathlib import Path

from history_pipeline.capture.model import apply_key_changes
from history_pipeline.store import HistoryStore
from history_pipeline.wal import SegmentState, list_segments


def history_keys(store: HistoryStore, table_uuid: str, up_to: int) -> set[int]:
    """The keys of table ``table_uuid`` live as of ``up_to`` (every event at or below it applied)."""
    frontier = store.frontier
    keys = _compacted_keys(store, table_uuid, min(up_to, frontier)) if frontier >= 0 else set()
    for ref in list_segments(store.wal_dir):
        if ref.state in (SegmentState.OPEN, SegmentState.SEALED):
            _apply(keys, ref.path, table_uuid, frontier, up_to)
    return keys


def _compacted_keys(store: HistoryStore, table_uuid: str, as_of: int) -> set[int]:
    if as_of < store.earliest:
        return set()
    named = [d.table_name for d in store.get_catalog(as_of) if d.table_uuid == table_uuid]
    if not named:
        return set()
    quoted = '"' + named[0].replace('"', '""') + '"'
    return set(store.sql(f"SELECT synthetic_key FROM {quoted}", as_of).column(0).to_pylist())


def _apply(keys: set[int], path: Path, table_uuid: str, above: int, up_to: int) -> None:
    """Apply the inserts and deletes of one segment's events in (above, up_to] to ``keys``."""
    marker = table_uuid.encode()
    # most lines are other tables': those are skipped unparsed
    records = (json.loads(line) for line in path.read_bytes().splitlines() if marker in line)
    apply_key_changes(keys, (r for r in records if above < r["t"] <= up_to), table_uuid)
