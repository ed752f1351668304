"""finished_wal_segments_sensor: one compaction run per newly sealed segment.

The decision is a pure function of what the WAL folders hold (:func:`plan_tick`); the sensor
body only gathers that, and turns the plan into Dagster requests.
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass

import dagster as dg

from history_pipeline.orchestration.assets import compacted_batches, wal_segments
from history_pipeline.orchestration.partitions import (
    parse_segment_partition_key,
    segment_partition_key,
    segment_partitions,
)
from history_pipeline.orchestration.resources import HistoryRootResource
from history_pipeline.wal import SegmentState
from history_pipeline.wal.segments import quarantine_reason

compact_segment_job = dg.define_asset_job(
    "compact_segment_job",
    selection=[wal_segments, compacted_batches],
    description="Verify one sealed segment and compact exactly it (earlier segments of its database first).",
)

DATABASE_TAG = "history_pipeline/database"


@dataclass(frozen=True)
class SegmentView:
    """What the sensor needs to know of one WAL segment."""

    database: str
    segment_id: int
    name: str
    state: SegmentState
    changed_ns: int  # the file's change time: a repaired or released segment is a new file
    reason: str | None = None  # why it is quarantined

    @property
    def key(self) -> str:
        return segment_partition_key(self.database, self.name)

    @property
    def version(self) -> str:
        return f"{self.key}@{self.changed_ns}"


@dataclass(frozen=True)
class TickPlan:
    """What one sensor evaluation does."""

    add_partitions: tuple[str, ...]
    delete_partitions: tuple[str, ...]
    runs: tuple[SegmentView, ...]
    report_quarantined: tuple[SegmentView, ...]
    quarantined_versions: tuple[str, ...]  # the new cursor: quarantines already reported
    skip_reason: str | None


def plan_tick(segments: Iterable[SegmentView], known: set[str], reported: set[str]) -> TickPlan:
    """Partitions to add (sealed or quarantined segments) and remove (segments gone from the WAL),
    runs to request (sealed segments in id order, none behind a quarantined one of the same
    database), and quarantines to report on their partition (once each)."""
    views = sorted(segments, key=lambda v: (v.database, v.segment_id))
    existing = {v.key for v in views if v.state is not SegmentState.OPEN}
    add = tuple(v.key for v in views if v.state in (SegmentState.SEALED, SegmentState.QUARANTINED)
                and v.key not in known)
    delete = tuple(sorted(k for k in known if k not in existing))
    runs: list[SegmentView] = []
    blocked: dict[str, SegmentView] = {}
    for v in views:
        if v.state is SegmentState.QUARANTINED:
            blocked.setdefault(v.database, v)
        elif v.state is SegmentState.SEALED and v.database not in blocked:
            runs.append(v)
    quarantined = [v for v in views if v.state is SegmentState.QUARANTINED]
    report = tuple(v for v in quarantined if v.key in known and v.version not in reported)
    skip = None
    if not runs:
        applied = sum(v.state is SegmentState.APPLIED for v in views)
        skip = f"no sealed segment is waiting ({applied} applied"
        waiting = sum(v.state is SegmentState.SEALED for v in views)
        if blocked:
            skip += "; " + "; ".join(
                f"{b.key} is quarantined ({b.reason or 'no reason recorded'})" for b in blocked.values()
            ) + (f"; {waiting} sealed segment(s) wait behind it" if waiting else "") + "; repair or skip it"
        skip += ")"
    return TickPlan(add, delete, tuple(runs), report, tuple(sorted(v.version for v in quarantined)), skip)


def _views(history: HistoryRootResource) -> list[SegmentView]:
    views = []
    for database in history.databases():
        for ref in history.open(database).segments():
            try:
                changed = ref.path.stat().st_ctime_ns
            except FileNotFoundError:  # moved while listing (a run is applying it): next tick
                continue
            reason = None
            if ref.state is SegmentState.QUARANTINED:
                reason = str((quarantine_reason(ref) or {}).get("error", "")) or None
            views.append(SegmentView(database, ref.segment_id, ref.name, ref.state, changed, reason))
    return views


def _already_observed(instance: dg.DagsterInstance, view: SegmentView) -> bool:
    """True when the partition's newest observation already says it is quarantined for this reason."""
    records = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=compacted_batches.key, asset_partitions=[view.key]), limit=1
    ).records
    if not records or records[0].asset_observation is None:
        return False
    metadata = records[0].asset_observation.metadata
    return (
        getattr(metadata.get("state"), "value", None) == "quarantined"
        and getattr(metadata.get("reason"), "value", None) == (view.reason or "no reason recorded")
    )


@dg.sensor(job=compact_segment_job, minimum_interval_seconds=5, default_status=dg.DefaultSensorStatus.RUNNING)
def finished_wal_segments_sensor(context: dg.SensorEvaluationContext, history: HistoryRootResource) -> dg.SensorResult:
    """Register every sealed segment as a partition and request one run per segment, in id order.

    The run key is the partition key plus the segment file's change time, so a re-evaluation never
    launches twice, while a segment an operator repaired, skipped or released (a new file) runs
    again. Partitions of segments no longer in the WAL are removed; a quarantined segment's
    partition gets an observation saying so and why. When nothing runs, the tick says why.
    """
    known = set(context.instance.get_dynamic_partitions(segment_partitions.name))
    reported = set(json.loads(context.cursor)) if context.cursor else set()
    views = _views(history)
    # quarantines the run itself already reported on the partition are not reported twice
    reported |= {v.version for v in views if v.state is SegmentState.QUARANTINED and v.version not in reported
                 and v.key in known and _already_observed(context.instance, v)}
    plan = plan_tick(views, known, reported)
    if plan.skip_reason:
        context.log.info(plan.skip_reason)  # in the tick's logs too, beside the tick's skip reason
    requests = [
        dg.RunRequest(run_key=v.version, partition_key=v.key, tags={DATABASE_TAG: v.database}) for v in plan.runs
    ]
    partition_requests: list = []
    if plan.add_partitions:
        partition_requests.append(segment_partitions.build_add_request(list(plan.add_partitions)))
    if plan.delete_partitions:
        partition_requests.append(segment_partitions.build_delete_request(list(plan.delete_partitions)))
    observations = [
        dg.AssetObservation(
            asset_key=asset,
            partition=v.key,
            metadata={
                "state": "quarantined",
                "reason": dg.MetadataValue.text(v.reason or "no reason recorded"),
                "what to do": dg.MetadataValue.text(
                    f"history-pipeline --database {v.database} repair {v.segment_id} --events FILE, "
                    f"or skip {v.segment_id} --reason TEXT"
                ),
            },
        )
        for v in plan.report_quarantined
        for asset in (wal_segments.key, compacted_batches.key)
    ]
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=partition_requests,
        asset_events=observations,
        cursor=json.dumps(list(plan.quarantined_versions)),
        skip_reason=plan.skip_reason,
    )


__all__ = ["SegmentView", "TickPlan", "compact_segment_job", "finished_wal_segments_sensor", "plan_tick",
           "parse_segment_partition_key"]
