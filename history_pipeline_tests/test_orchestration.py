"""The Dagster code location loads, and its assets compact a real WAL in-process."""

import dagster as dg

from history_pipeline.orchestration.definitions import (
    HistoryStoreResource,
    compacted_batches,
    defs,
    wal_segments,
)
from history_pipeline.store import HistoryStore
from history_pipeline_tests.test_compaction import rfc_events, write


def test_definitions_load():
    assert {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()} >= {
        "wal_segments",
        "compacted_batches",
    }


def test_materialize_compacts_the_wal(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    write(store, rfc_events())
    result = dg.materialize(
        [wal_segments, compacted_batches],
        resources={"history": HistoryStoreResource(root=str(tmp_path), database="db")},
    )
    assert result.success
    materialization = result.asset_materializations_for_node("compacted_batches")[0]
    assert materialization.metadata["frontier"].value == 5
    assert store.frontier == 5
