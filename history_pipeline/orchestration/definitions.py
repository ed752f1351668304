"""The Dagster code location (first cut: the store resource and the compaction assets).

Bodies stay thin: read the resource, call the core, report metadata.
"""

from __future__ import annotations

import dagster as dg

from history_pipeline.store import HistoryStore
from history_pipeline.wal import SegmentState


class HistoryStoreResource(dg.ConfigurableResource):
    """Where the history lives: a local path (default ``data``) or ``s3://bucket/prefix``."""

    root: str = "data"
    database: str = "tenant_a"

    def open(self) -> HistoryStore:
        return HistoryStore.open(self.root, database=self.database)


@dg.asset(description="Sealed WAL segments of the database, by state.")
def wal_segments(history: HistoryStoreResource) -> dg.MaterializeResult:
    store = history.open()
    refs = store.segments()
    counts = {state.value: sum(1 for r in refs if r.state is state) for state in SegmentState}
    return dg.MaterializeResult(metadata={f"segments_{k}": v for k, v in counts.items()})


@dg.asset(deps=[wal_segments], description="Every sealed segment compacted into supertable batches.")
def compacted_batches(history: HistoryStoreResource) -> dg.MaterializeResult:
    summary = history.open().compact()
    data = summary.as_dict()
    return dg.MaterializeResult(
        metadata={
            "segments_applied": len(data["segments_applied"]),
            "versions_written": data["versions_written"],
            "files_written": data["files_written"],
            "bytes_written": data["bytes_written"],
            "frontier": data["frontier"],
            "tables_touched": ", ".join(data["tables_touched"]),
        }
    )


defs = dg.Definitions(
    assets=[wal_segments, compacted_batches],
    resources={"history": HistoryStoreResource()},
)
