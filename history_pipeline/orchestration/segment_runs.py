"""One compaction run for several ready segments of one database, in segment order, each segment's
partitions (``wal_segments`` and ``compacted_batches``) recording its own work and outcome.

The sensor requests ``compact_segments_job`` with the partition keys of a batch in its run config
(:func:`batch_run_config`). The op verifies them, then compacts them in one call
(:meth:`HistoryStore.compact_batch`: on Spark, one set of jobs; each segment still its own catalog
transaction) and logs one materialization per partition with that segment's own figures, so the
UI shows the same per-segment history as a run of one partition. A quarantined segment stops the
batch there, the segments before it applied and materialized (its partitions
get an observation saying why); an engine loss stops it too. In both cases the segments after it
are handed back to the sensor (their files touched, their database named in the change journal):
they wait behind the quarantine, or for the engine, and a later run compacts them.
"""

import threading
from dataclasses import dataclass

import dagster as dg

from history_pipeline.errors import HistoryError, SegmentQuarantinedError
from history_pipeline.execution import engine_failure, raise_engine_failure
from history_pipeline.orchestration.assets import (
    applied_metadata,
    compacted_batches,
    report_quarantine,
    retry_when_engine_is_back,
    value_free,
    verified_metadata,
    wal_segments,
)
from history_pipeline.orchestration.partitions import parse_segment_partition_key
from history_pipeline.orchestration.resources import HistoryRootResource, SparkResource
from history_pipeline.query.sandbox import reader_cursor
from history_pipeline.store import HistoryStore
from history_pipeline.wal.segments import SegmentRef

OP_NAME = "compact_segments"


@dataclass(frozen=True)
class SegmentBatch:
    """Segments of one database to compact in one run, in id order."""

    database: str
    segment_ids: tuple[int, ...]


def parse_batch(partition_keys: list[str]) -> SegmentBatch:
    """The batch named by partition keys: one database, strictly increasing segment ids."""
    if not partition_keys:
        raise HistoryError("a compaction run names no segment: its run config lists no partition key")
    parsed = []
    for key in partition_keys:
        try:
            parsed.append(parse_segment_partition_key(key))
        except ValueError:
            raise HistoryError(f"partition key {key!r} of the run config is not <database>.<segment id>") from None
    databases = {database for database, _ in parsed}
    if len(databases) != 1:
        raise HistoryError(f"a compaction run names segments of several databases ({', '.join(sorted(databases))}); "
                           "one run compacts segments of one database")
    ids = tuple(segment_id for _, segment_id in parsed)
    if any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
        raise HistoryError(f"the segments of a compaction run must be in increasing order, not {list(ids)}")
    return SegmentBatch(parsed[0][0], ids)


def batch_run_config(partition_keys: list[str]) -> dict:
    """The run config of ``compact_segments_job`` for these partition keys."""
    return {"ops": {OP_NAME: {"config": {"partition_keys": list(partition_keys)}}}}


class SegmentsConfig(dg.Config):
    """The partition keys (``<database>.<segment id>``) the run compacts, in segment order."""

    partition_keys: list[str]


def _open_reader() -> None:
    reader_cursor().close()


def _hand_back(store: HistoryStore, refs: list[SegmentRef]) -> None:
    """Have the sensor request these segments again: each touched file is a new version of its
    segment, the journal marker makes the sensor look at the database."""
    for ref in refs:
        retry_when_engine_is_back(store, ref)


@dg.op(name=OP_NAME, out={}, description="Verify and compact the run's segments of one database, in order, in one "
       "compaction; each segment recorded on its own partitions.")
def compact_segments(context: dg.OpExecutionContext, config: SegmentsConfig, history: HistoryRootResource,
                     spark: SparkResource):  # noqa: ANN201 - Dagster takes an annotation as an output
    # no output (``out={}``): nothing reads one, and its events would be written after the commit
    batch = parse_batch(config.partition_keys)
    # the previews after the commit count rows on the process-wide DuckDB reader: opened while the
    # segments compact, not after their commit, which the database's next run waits behind
    threading.Thread(target=_open_reader, name="open-duckdb-reader", daemon=True).start()
    store = history.open(batch.database)
    # an earlier one missing fails the run before anything is applied: order is never broken
    ordered = store.segment_refs(batch.segment_ids)
    refs = {ref.segment_id: ref for ref in ordered}
    keys = dict(zip(batch.segment_ids, config.partition_keys, strict=True))
    # verified first: a segment that does not verify is quarantined, and the batch is the ones before it
    verified: dict[int, dict] = {}
    unverified: SegmentQuarantinedError | None = None
    for ref in ordered:
        try:
            verified[ref.segment_id] = verified_metadata(store, ref)
        except SegmentQuarantinedError as exc:
            unverified = exc
            break
    ids = list(verified)
    context.log.info(f"compacting {len(ids)} segment(s) of {batch.database}: {', '.join(keys[i] for i in ids)}")
    outcome = store.compact_batch(ids, spark=spark.session(),
                                  on_step=lambda step: context.log.info(f"compaction: {step}")) if ids else None
    applied = {a.segment_id: a for a in outcome.applied} if outcome else {}
    reached = [i for i in ids if i in applied or (outcome is not None and i in outcome.already_applied)]
    for i in reached:
        if i not in applied:
            context.log.info(f"segment {refs[i].name} was already applied")
        context.log_event(dg.AssetMaterialization(asset_key=wal_segments.key, partition=keys[i], metadata=verified[i]))
        context.log_event(dg.AssetMaterialization(asset_key=compacted_batches.key, partition=keys[i],
                                                  metadata=applied_metadata(store, refs[i], applied.get(i))))
    if unverified is not None:  # quarantined on disk by its verification, whatever stopped the batch
        report_quarantine(context.instance, keys[ordered[len(ids)].segment_id], unverified)
    error: Exception | None = outcome.error if outcome is not None else None
    stopped_at = outcome.stopped_at if outcome is not None and error is not None else None
    if error is None and unverified is not None:
        error, stopped_at = unverified, ordered[len(ids)].segment_id
    if error is None:
        return
    if stopped_at is None:  # every segment applied; what failed came after (a snapshot's refresh)
        raise_engine_failure(error, spark.master)
        raise error
    at = batch.segment_ids.index(stopped_at)
    if isinstance(error, SegmentQuarantinedError):
        shown = value_free(store, error)
        if error is not unverified:
            report_quarantine(context.instance, keys[stopped_at], shown)
        _hand_back_later(context, store, batch, ordered[at + 1:])
        raise shown from None
    if engine_failure(error):
        _hand_back_later(context, store, batch, ordered[at:])
        raise_engine_failure(error, spark.master)
    raise error


def _hand_back_later(context: dg.OpExecutionContext, store: HistoryStore, batch: SegmentBatch,
                     later: list[SegmentRef]) -> None:
    if later:
        context.log.info(f"{len(later)} segment(s) of {batch.database} wait for a later run")
        _hand_back(store, later)


@dg.job(
    name="compact_segments_job",
    description="Verify and compact several ready segments of one database in one run, in order; "
    "each segment's partitions record its own work.",
    # one process for the run: the work runs on the Spark engine, a step process would only add start-up
    executor_def=dg.in_process_executor,
)
def compact_segments_job() -> None:
    compact_segments()
