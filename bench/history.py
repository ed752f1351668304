"""A long supertable history built straight from row versions, for the read benchmarks.

Compaction speed is measured separately (on a WAL workload); here we need histories of 10M and
40M versions quickly, so versions are generated in Arrow and written with the project's own
supertable writer, committed to the catalog batch by batch, and snapshotted by the project's own
snapshot policy, exactly as compaction would leave them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from history_pipeline import HistoryStore
from history_pipeline.catalog import AddFile, AddSchemaHistory, AdvanceFrontier
from history_pipeline.catalog.files import write_parquet
from history_pipeline.catalog.model import FileKind
from history_pipeline.events import CreateTable, parse_event
from history_pipeline.schema import SchemaState, apply_schema_change, replay_schema_history
from history_pipeline.supertable import FileMetadata, new_file_path, supertable_schema

TABLE_UUID = "bench-table"
HOT_KEY = 0  # a key updated in every batch, for row_history


@dataclass(frozen=True)
class History:
    live_rows: int
    versions: int
    batch: int
    frontier: int


def build_history(store: HistoryStore, live_rows: int, versions: int, batch: int, seed: int = 1,
                  hot_versions: int = 5_000) -> History:
    """Write ``versions`` row versions over ``live_rows`` keys (first inserts, then updates)."""
    create = parse_event({
        "op": "create_table", "t": 1, "table_uuid": TABLE_UUID, "table_name": "bench",
        "columns": [
            {"column_uuid": "qty", "column_name": "qty", "data_type": "BIGINT"},
            {"column_uuid": "price", "column_name": "price", "data_type": "DOUBLE PRECISION"},
            {"column_uuid": "name", "column_name": "name", "data_type": "TEXT"},
        ],
    })
    assert isinstance(create, CreateTable)
    schema_state, entries = apply_schema_change(SchemaState(), create)
    supercolumns = schema_state.supercolumns[TABLE_UUID]
    store.catalog.commit("bench schema", lambda s: [AddSchemaHistory(entries), AdvanceFrontier(1)])
    schema = supertable_schema(supercolumns)
    rng = random.Random(seed)
    t = 2
    written = 0
    hot_every = max(1, (versions // batch) and batch // max(1, hot_versions // max(1, versions // batch)))
    while written < versions:
        n = min(batch, versions - written)
        if written < live_rows:
            keys = list(range(written, min(written + n, live_rows)))
        else:
            keys = [rng.randrange(live_rows) for _ in range(n)]
            for i in range(0, n, hot_every):
                keys[i] = HOT_KEY
        t = _write_batch(store, keys, t, rng, schema)
        store.refresh_snapshots(spark=False)  # the builder works in-process; no JVM beside the timed reads
        written += len(keys)
    return History(live_rows, versions, batch, t - 1)


def append_open_versions(store: HistoryStore, history: History, n: int, seed: int = 2) -> History:
    """Commit ``n`` more updates without refreshing snapshots: the open interval a reader sees just
    before the next snapshot is due (compaction refreshes only once a table's history is long)."""
    rng = random.Random(seed)
    schema = supertable_schema(replay_schema_history(store.catalog_state().schema_history).supercolumns[TABLE_UUID])
    keys = [rng.randrange(history.live_rows) for _ in range(n)]
    t = _write_batch(store, keys, history.frontier + 1, rng, schema)
    return History(history.live_rows, history.versions + n, history.batch, t - 1)


def _write_batch(store: HistoryStore, keys: list[int], t: int, rng: random.Random, schema: pa.Schema) -> int:
    """One version file of these keys' updates from timestamp ``t`` on, committed; the next free t."""
    n = len(keys)
    # one timestamp per version, in the order the keys come: updates reach the log in random key
    # order, and compaction writes them key-sorted (below), so t is not correlated with the key
    # (a batch whose t grew with the key would let every closed file's buckets by superseded_at
    # cut the key range too, flattering key lookups, closed reads and the t column's bytes)
    lts = list(range(t, t + n))
    table = pa.table(
        {
            "synthetic_key": pa.array(keys, pa.int64()),
            "is_deleted": pa.array([False] * n),
            "logical_timestamp": pa.array(lts, pa.int64()),
            "qty-1": pa.array([rng.randrange(1000) for _ in range(n)], pa.int64()),
            "price-1": pa.array([rng.random() * 100 for _ in range(n)], pa.float64()),
            "name-1": pa.array([f"name-{k % 1000}" for k in keys], pa.string()),
        },
        schema=schema,
    )
    table = table.sort_by([("synthetic_key", "ascending"), ("logical_timestamp", "ascending")])
    state = store.catalog.latest()
    meta = FileMetadata(store.database, TABLE_UUID, FileKind.VERSIONS, state.txn_id + 1, t, t + n)
    path = new_file_path(store.database, TABLE_UUID, FileKind.VERSIONS, state.txn_id + 1)
    entry = write_parquet(store.objects, path, table, meta)
    frontier = t + n - 1
    store.catalog.commit("bench batch", lambda s, e=entry, f=frontier: [AddFile(e), AdvanceFrontier(f)])
    return t + n


def default_segment_events(work: Path, live_rows: int, versions: int, seed: int = 1) -> int:
    """How many of this history's updates one WAL segment holds under the writer's default size limit.

    Measured, not estimated: update events shaped like the history's (the two changed columns, keys
    below ``live_rows``, timestamps as large as the history's) go through the real WAL writer with
    its default limits until it seals a segment by size; its row events are counted.
    """
    from history_pipeline.wal.segments import SegmentState

    store = HistoryStore.open(work, database="segment_size")
    rng = random.Random(seed)
    t = max(2, versions // 2)
    with store.wal_writer(max_segment_age_s=float("inf")) as wal:
        wal.append({"op": "create_table", "t": 1, "table_uuid": TABLE_UUID, "table_name": "bench",
                    "columns": [{"column_uuid": c, "column_name": c, "data_type": ty} for c, ty in
                                (("qty", "BIGINT"), ("price", "DOUBLE PRECISION"), ("name", "TEXT"))]})
        wal.append({"op": "close", "t": 1})
        while not store.segments(SegmentState.SEALED):
            for _ in range(1_000):  # a close per thousand changes, as a busy capture commits
                t += 1
                wal.append({"op": "update", "t": t, "table_uuid": TABLE_UUID, "key": rng.randrange(live_rows),
                            "values": {"qty": rng.randrange(1000), "price": rng.random() * 100}})
            wal.append({"op": "close", "t": t})
    first = store.segments(SegmentState.SEALED)[0]
    with open(first.path, "rb") as f:
        return sum(1 for line in f if b'"op":"update"' in line or b'"op": "update"' in line)
