"""finished_wal_segments_sensor: one compaction run per newly sealed segment."""


import dagster as dg

from history_pipeline.orchestration.assets import compacted_batches, wal_segments
from history_pipeline.orchestration.partitions import segment_partition_key, segment_partitions
from history_pipeline.orchestration.resources import HistoryRootResource
from history_pipeline.wal import SegmentState

compact_segment_job = dg.define_asset_job(
    "compact_segment_job",
    selection=[wal_segments, compacted_batches],
    description="Verify one sealed segment and compact it (with every earlier pending one of its database).",
)

DATABASE_TAG = "history_pipeline/database"


@dg.sensor(job=compact_segment_job, minimum_interval_seconds=5, default_status=dg.DefaultSensorStatus.RUNNING)
def finished_wal_segments_sensor(context: dg.SensorEvaluationContext, history: HistoryRootResource) -> dg.SensorResult:
    """Register every sealed segment as a partition and request one run per segment, in id order.

    The run key is the partition key plus the segment file's change time, so a re-evaluation never
    launches twice, while a quarantined segment an operator has released (moved back) runs again.
    """
    known = set(context.instance.get_dynamic_partitions(segment_partitions.name))
    new_partitions: list[str] = []
    requests: list[dg.RunRequest] = []
    for database in history.databases():
        store = history.open(database)
        for ref in store.segments(SegmentState.SEALED):  # in id order; quarantined ones are elsewhere
            key = segment_partition_key(database, ref.name)
            if key not in known:
                new_partitions.append(key)
            requests.append(
                dg.RunRequest(
                    run_key=f"{key}@{ref.path.stat().st_ctime_ns}",
                    partition_key=key,
                    tags={DATABASE_TAG: database},
                )
            )
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[segment_partitions.build_add_request(new_partitions)] if new_partitions else [],
        skip_reason=None if requests else "no sealed segment is waiting",
    )
