"""Dagster glue: the code location loads, assets materialize on real local Spark, the sensor and
schedules evaluate as the daemon would evaluate them, and the asset checks run."""

import os
import time

import dagster as dg
import pytest

from history_pipeline.errors import SegmentNotFoundError
from history_pipeline.orchestration.assets import compacted_batches, supertables, wal_segments
from history_pipeline.orchestration.checks import (
    catalog_verifies_check,
    frontier_lag_check,
    reconstruction_invariant_check,
)
from history_pipeline.orchestration.definitions import defs
from history_pipeline.orchestration.partitions import segment_partitions
from history_pipeline.orchestration.resources import SparkResource, history_root
from history_pipeline.orchestration.schedules import (
    cleanup_schedule,
    cold_tier_export_schedule,
    retention_job,
    retention_schedule,
)
from history_pipeline.orchestration.segment_runs import batch_run_config, compact_segments_job
from history_pipeline.orchestration.sensors import RunBatch, SegmentView, finished_wal_segments_sensor
from history_pipeline.store import HistoryStore
from history_pipeline.wal import SegmentState
from history_pipeline.wal.segments import release_segment
from history_pipeline_tests.test_compaction import example_events, write


def test_definitions_load_with_the_contract_names():
    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == {
        "wal_segments", "compacted_batches", "supertables", "schema_history", "cold_tier_export",
    }
    assert defs.resolve_sensor_def("finished_wal_segments_sensor")
    for name in ("supertables_schedule", "retention_schedule", "cold_tier_export_schedule", "cleanup_schedule"):
        # on by default: `make demo` shows them working without a click
        assert defs.resolve_schedule_def(name).default_status == dg.DefaultScheduleStatus.RUNNING


@pytest.fixture
def root(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def resources(root, spark):
    return {"history": history_root(str(root)), "spark": SparkResource(master="local[2]")}


def _sealed_example(root, database="db"):
    store = HistoryStore.open(root, database=database)
    events = example_events()
    write(store, events[:3], events[3:])
    return store


def test_a_request_gets_its_segments_in_its_order_or_fails_naming_the_first_missing(root):
    store = _sealed_example(root)
    assert [ref.segment_id for ref in store.segment_refs([2, 1])] == [2, 1]
    with pytest.raises(SegmentNotFoundError, match=r"segment 0+3 of db is not in .*wal \(removed from the WAL\?\)"):
        store.segment_refs([1, 3, 4])


def test_every_compaction_entry_refuses_a_missing_segment_in_the_same_words(root):
    """The run's op, a batch and a single segment look segments up the same way: one error."""
    store = _sealed_example(root)
    expected = r"segment 0+3 of db is not in .*wal \(removed from the WAL\?\)"
    with pytest.raises(SegmentNotFoundError, match=expected):
        store.compact_batch([1, 3], spark=False)
    with pytest.raises(SegmentNotFoundError, match=expected):
        store.compact(spark=False, only_segment=3)
    assert [r.segment_id for r in store.segments(SegmentState.SEALED)] == [1, 2]  # nothing applied


def test_materialize_a_segment_partition_on_spark(root, resources):
    store = _sealed_example(root)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(segment_partitions.name, ["db.00000000000000000002", "db.00000000000000000001"])
    # exactly its partition's segment: the second is refused while the first is pending
    refused = dg.materialize([compacted_batches], resources=resources, instance=instance,
                             partition_key="db.00000000000000000002", raise_on_error=False)
    assert not refused.success
    failure = next(e for e in refused.all_events if e.is_step_failure)
    assert "waits for the earlier segment 00000000000000000001 (sealed)" in str(failure.step_failure_data.error)
    assert store.frontier == -1
    per_partition = {}
    for key in ("db.00000000000000000001", "db.00000000000000000002"):
        result = dg.materialize([wal_segments, compacted_batches], resources=resources, instance=instance,
                                partition_key=key)
        assert result.success
        per_partition[key] = (result.asset_materializations_for_node("wal_segments")[0].metadata,
                              result.asset_materializations_for_node("compacted_batches")[0].metadata)
    verified, compacted = per_partition["db.00000000000000000002"]
    assert verified["records"].value == 4 and verified["upper"].value == 5
    assert "| delete | 1 |" in verified["records_by_kind"].value  # readable, not a JSON blob
    # each partition's metadata describes its own work
    assert compacted["segment"].value == "00000000000000000002" and compacted["versions_written"].value == 2
    assert compacted["timestamp_range"].value == "[4, 6)" and compacted["frontier"].value == 5
    first = per_partition["db.00000000000000000001"][1]
    assert first["versions_written"].value == 2 and first["schema_changes"].value == 1
    assert first["tables_touched"].value == "my_table"
    assert "| my_table |" in compacted["preview"].value and "value2_prime" not in compacted["preview"].value
    assert store.fetch_row("my_table", 2, 6) == {"column1": "value2_prime"}
    again = dg.materialize([compacted_batches], resources=resources, instance=instance,
                           partition_key="db.00000000000000000001")
    assert again.asset_materializations_for_node("compacted_batches")[0].metadata["versions_written"].value == 0


def test_a_run_compacts_on_the_spark_resource_session(root, resources, spark):
    """The resource hands back a real session, and a run's compaction runs jobs on it."""
    assert SparkResource(master="local[2]").session() is spark
    _sealed_example(root)
    tracker = spark.sparkContext.statusTracker()
    jobs_before = len(tracker.getJobIdsForGroup(None))
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(segment_partitions.name, ["db.00000000000000000001"])
    result = dg.materialize([wal_segments, compacted_batches], resources=resources, instance=instance,
                            partition_key="db.00000000000000000001")
    assert result.success
    assert len(tracker.getJobIdsForGroup(None)) > jobs_before


def test_supertables_schema_history_and_checks(root, resources):
    store = _sealed_example(root)
    store.compact()
    result = dg.materialize(
        [supertables], resources=resources,
        selection=None,
    )
    assert result.success
    checks = dg.materialize(
        [supertables, catalog_verifies_check, frontier_lag_check, reconstruction_invariant_check],
        resources=resources,
    )
    evaluations = {e.check_name: e for e in checks.get_asset_check_evaluations()}
    assert evaluations["catalog_verifies_check"].passed
    assert evaluations["frontier_lag_check"].passed
    assert evaluations["reconstruction_invariant_check"].passed
    assert evaluations["reconstruction_invariant_check"].metadata["states_checked"].value > 0
    store.objects.delete(store.catalog_state().files_of("tbl-example")[0].path)
    broken = dg.materialize([supertables, catalog_verifies_check], resources=resources, raise_on_error=False)
    assert not {e.check_name: e for e in broken.get_asset_check_evaluations()}["catalog_verifies_check"].passed


def keys_of(request):
    """The partition keys a run request's batch compacts, in order."""
    return request.run_config["ops"]["compact_segments"]["config"]["partition_keys"]


def materialized(instance, asset, key):
    """Metadata of each materialization of one partition, oldest first."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[key]), limit=10).records
    return [r.asset_materialization.metadata for r in reversed(records)]


def in_flight(instance, database):
    """A compaction run of ``database``, running."""
    return instance.create_run_for_job(
        compact_segments_job, run_config=batch_run_config([f"{database}.00000000000000000001"]),
        tags={"history_pipeline/database": database, "history_pipeline/compaction": "segments"},
        status=dg.DagsterRunStatus.STARTED)


class Daemon:
    """Evaluates the sensor as the daemon does: keeps its cursor between ticks and applies its
    partition requests to the instance."""

    def __init__(self, root, instance=None, spark=None, history=None):
        self.root = root
        self.instance = instance or dg.DagsterInstance.ephemeral()
        self.cursor = None
        self.spark = spark or SparkResource()
        self.history = history or history_root(str(root))

    def tick(self):
        resources = {"history": self.history, "spark": self.spark}
        with dg.build_sensor_context(instance=self.instance, cursor=self.cursor, resources=resources) as context:
            result = finished_wal_segments_sensor(context)
        self.cursor = result.cursor
        for request in result.dynamic_partitions_requests or []:
            if isinstance(request, dg.DeleteDynamicPartitionsRequest):
                for key in request.partition_keys:
                    self.instance.delete_dynamic_partition(request.partitions_def_name, key)
            else:
                self.instance.add_dynamic_partitions(request.partitions_def_name, [
                    k for k in request.partition_keys
                    if not self.instance.has_dynamic_partition(request.partitions_def_name, k)])
        return result


@pytest.mark.spark
def test_sensor_registers_partitions_and_requests_runs_in_order(root):
    _sealed_example(root, "db_a")
    _sealed_example(root, "db_b")
    daemon = Daemon(root)
    first = daemon.tick()
    # one run per database, its segments in order
    assert [keys_of(r) for r in first.run_requests] == [
        ["db_a.00000000000000000001", "db_a.00000000000000000002"],
        ["db_b.00000000000000000001", "db_b.00000000000000000002"]]
    assert set(first.dynamic_partitions_requests[0].partition_keys) == {
        k for r in first.run_requests for k in keys_of(r)}
    assert [r.tags["history_pipeline/database"] for r in first.run_requests] == ["db_a", "db_b"]
    assert all(r.tags["history_pipeline/compaction"] == "segments" for r in first.run_requests)
    assert first.run_requests[0].tags["history_pipeline/segments"] == (
        "00000000000000000001..00000000000000000002 (2)")
    second = daemon.tick()
    assert second.dynamic_partitions_requests == []  # nothing new to register
    assert second.run_requests == []  # the cursor knows they were requested
    HistoryStore.open(root, database="db_a").compact()
    third = daemon.tick()  # db_a's segments left for applied/: their partitions stay, nothing to run
    assert third.run_requests == [] and third.dynamic_partitions_requests == []
    store_b = HistoryStore.open(root, database="db_b")
    write(store_b, [{"op": "insert", "t": 9, "table_uuid": "tbl-example", "key": 5, "values": {"col1": "v"}}])
    fourth = daemon.tick()
    assert [keys_of(r) for r in fourth.run_requests] == [["db_b.00000000000000000003"]]
    # a fresh cursor (a reset sensor) requests every pending segment again, as one batch ...
    assert [keys_of(r) for r in Daemon(root, daemon.instance).tick().run_requests] == [
        ["db_b.00000000000000000001", "db_b.00000000000000000002", "db_b.00000000000000000003"]]
    # ... but not while a run of that database is queued or running: those segments wait for its end
    run = in_flight(daemon.instance, "db_b")
    held = Daemon(root, daemon.instance).tick()
    assert held.run_requests == [] and "waits for the run of db_b in flight" in held.skip_reason.skip_message
    daemon.instance.report_run_canceled(run)
    assert len(Daemon(root, daemon.instance).tick().run_requests) == 1


@pytest.mark.spark
def test_quarantined_segment_is_retried_only_after_an_operator_releases_it(root):
    store = HistoryStore.open(root, database="db")
    write(store, example_events(), [{"op": "delete", "t": 9, "table_uuid": "tbl-example", "key": 99}])
    daemon = Daemon(root)
    with pytest.raises(Exception, match="quarantined"):
        store.compact()
    assert [r.partition_key for r in daemon.tick().run_requests] == []
    quarantined = store.segments(SegmentState.QUARANTINED)[0]
    before = quarantined.path.stat().st_ctime_ns
    time.sleep(0.01)
    released = release_segment(quarantined, store.wal_dir)
    os.utime(released.path)  # an operator's fix touches the file
    again = daemon.tick().run_requests
    assert [keys_of(r) for r in again] == [["db.00000000000000000002"]]
    old = SegmentView("db", 2, "00000000000000000002", SegmentState.SEALED, before)
    assert again[0].run_key != RunBatch("db", (old,)).run_key  # a new file: a new run


@pytest.mark.spark
def test_schedules_evaluate_and_retention_job_runs(root):
    store = _sealed_example(root)
    store.compact()
    for schedule in (retention_schedule, cold_tier_export_schedule, cleanup_schedule):
        result = schedule.evaluate_tick(dg.build_schedule_context(scheduled_execution_time=None))
        assert len(result.run_requests) == 1
        assert result.run_requests[0].tags["dagster/schedule_name"] == schedule.name
    run = retention_job.execute_in_process(
        resources={"history": history_root(str(root)), "spark": SparkResource(enabled=False)},
        run_config={"ops": {"retain_op": {"config": {"keep_timestamps": 2, "cold_tier": str(root / "cold")}}}},
    )
    assert run.success
    assert store.earliest == 4
    assert run.output_for_node("retain_op")["db"]["files_removed"] >= 1


def test_quarantined_segment_fails_its_run_with_the_error(root, resources):
    store = HistoryStore.open(root, database="db")
    write(store, example_events(), [{"op": "delete", "t": 9, "table_uuid": "tbl-example", "key": 99}])
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(segment_partitions.name, ["db.00000000000000000001", "db.00000000000000000002"])
    result = dg.materialize([compacted_batches], resources=resources, instance=instance,
                            partition_key="db.00000000000000000002", raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "waits for the earlier segment 00000000000000000001" in str(failure.step_failure_data.error)
    dg.materialize([compacted_batches], resources=resources, instance=instance,
                   partition_key="db.00000000000000000001")
    assert store.frontier == 5  # the segment before it was applied
    result = dg.materialize([compacted_batches], resources=resources, instance=instance,
                            partition_key="db.00000000000000000002", raise_on_error=False)
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "delete of key 99, which does not exist" in str(failure.step_failure_data.error)
    # the partition itself says quarantined and why
    observed = [record.asset_observation for key in ("wal_segments", "compacted_batches")
                for record in instance.fetch_observations(dg.AssetKey(key), limit=5).records]
    assert {o.asset_key.to_user_string() for o in observed} == {"wal_segments", "compacted_batches"}
    assert all(o.partition == "db.00000000000000000002" and o.metadata["state"].value == "quarantined"
               for o in observed)
    assert "delete of key 99" in observed[0].metadata["reason"].value
    # the sensor does not report the same quarantine again: not when it registers the partitions,
    # nor on the next tick, when it would report a quarantine that nothing reported yet
    daemon = Daemon(root, instance)
    assert daemon.tick().asset_events == []
    assert daemon.tick().asset_events == []


def _fix_delete(store):
    """An operator's corrected events for the quarantined segment 2: the delete of key 99 removed."""
    ref = store.segments(SegmentState.QUARANTINED)[0]
    fixed = ref.path.parent.parent / "fixed.jsonl"
    fixed.write_text("".join(line for line in ref.path.read_text().splitlines(keepends=True) if '"key":99' not in line))
    return fixed


def test_a_batch_stops_at_a_quarantined_segment_and_the_rest_run_once_it_is_repaired(root, resources):
    store = HistoryStore.open(root, database="db")
    write(store, example_events(), [{"op": "delete", "t": 9, "table_uuid": "tbl-example", "key": 99}],
          [{"op": "insert", "t": 10, "table_uuid": "tbl-example", "key": 7, "values": {"col1": "x"}}])
    daemon = Daemon(root)
    instance = daemon.instance
    first = daemon.tick()
    batch = keys_of(first.run_requests[0])
    assert batch == [f"db.{n:020d}" for n in (1, 2, 3)]
    third_changed = store.segments(SegmentState.SEALED)[2].path.stat().st_ctime_ns
    stopped = compact_segments_job.execute_in_process(
        run_config=first.run_requests[0].run_config, resources=resources, instance=instance, raise_on_error=False)
    assert not stopped.success
    failure = next(e for e in stopped.all_events if e.is_step_failure)
    assert "delete of key 99, which does not exist" in str(failure.step_failure_data.error)
    assert store.frontier == 5  # segment 1 applied, nothing of 2 or 3
    # segment 1's partitions record its own work; 2 says quarantined and why; 3 has neither
    assert [m["segment"].value for m in materialized(instance, "wal_segments", batch[0])] == [batch[0][3:]]
    [applied] = materialized(instance, "compacted_batches", batch[0])
    assert applied["versions_written"].value == 4 and applied["timestamp_range"].value == "[0, 6)"
    observed = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=compacted_batches.key, asset_partitions=[batch[1]]), limit=5).records
    assert [o.asset_observation.metadata["state"].value for o in observed] == ["quarantined"]
    assert materialized(instance, "compacted_batches", batch[1]) == []
    assert materialized(instance, "compacted_batches", batch[2]) == []
    # segment 3 goes back to the sensor (a new version of its file), and waits behind segment 2
    assert store.segments(SegmentState.SEALED)[0].path.stat().st_ctime_ns != third_changed
    second = daemon.tick()
    assert second.run_requests == [] and second.asset_events == []  # the run said it on the partition
    skipped = second.skip_reason.skip_message
    assert "db.00000000000000000002 is quarantined (segment 00000000000000000002, line 2" in skipped
    assert "1 sealed segment(s) wait behind them; repair or skip them" in skipped
    assert daemon.tick().asset_events == []  # reported once
    store.repair_segment(2, _fix_delete(store), reason="no such key")
    after = daemon.tick()
    assert [keys_of(r) for r in after.run_requests] == [batch[1:]]  # the repaired one, then the one behind it
    done = compact_segments_job.execute_in_process(run_config=after.run_requests[0].run_config,
                                                   resources=resources, instance=instance)
    assert done.success
    assert [materialized(instance, "compacted_batches", k)[-1]["timestamp_range"].value for k in batch[1:]] == [
        "[6, 10)", "[10, 11)"]
    assert store.frontier == 10 and store.fetch_row("my_table", 7, 11) == {"column1": "x"}
    assert daemon.tick().skip_reason.skip_message.startswith("no sealed segment is waiting to be requested (1 database")


def test_a_batch_records_each_segment_as_a_run_of_its_partition_would(root, resources):
    store = _sealed_example(root)
    instance = dg.DagsterInstance.ephemeral()
    keys = ["db.00000000000000000001", "db.00000000000000000002"]
    instance.add_dynamic_partitions(segment_partitions.name, keys)
    result = compact_segments_job.execute_in_process(run_config=batch_run_config(keys), resources=resources,
                                                     instance=instance)
    assert result.success and store.frontier == 5
    verified = materialized(instance, "wal_segments", keys[1])[0]
    assert verified["records"].value == 4 and verified["upper"].value == 5
    first, second = (materialized(instance, "compacted_batches", k)[0] for k in keys)
    assert first["versions_written"].value == 2 and first["schema_changes"].value == 1
    assert first["timestamp_range"].value == "[0, 4)" and first["frontier"].value == 3
    assert second["segment"].value == "00000000000000000002" and second["versions_written"].value == 2
    assert second["timestamp_range"].value == "[4, 6)" and second["frontier"].value == 5
    assert "value2_prime" not in second["preview"].value
    # the materializations are the run's, in segment order
    events = [e for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]
    assert [(e.asset_key.to_user_string(), e.partition) for e in events] == [
        ("wal_segments", keys[0]), ("compacted_batches", keys[0]),
        ("wal_segments", keys[1]), ("compacted_batches", keys[1])]
    # a run naming segments out of order, or of two databases, is refused before any work
    for wrong in (keys[::-1], [keys[0], "other.00000000000000000002"]):
        bad = compact_segments_job.execute_in_process(run_config=batch_run_config(wrong), resources=resources,
                                                      instance=instance, raise_on_error=False)
        assert not bad.success
        message = str(next(e for e in bad.all_events if e.is_step_failure).step_failure_data.error)
        assert "increasing order" in message or "several databases" in message


def test_a_batch_runs_one_set_of_spark_jobs_whatever_its_segments(root, resources, spark):
    """The run's segments are compacted in one call: a batch of three segments runs the Spark jobs
    of a batch of one, not three times as many."""
    tracker = spark.sparkContext.statusTracker()
    create = {"op": "create_table", "t": 1, "table_uuid": "tbl-example", "table_name": "my_table",
              "columns": [{"column_uuid": "col1", "column_name": "column1", "data_type": "TEXT"}]}
    jobs = []
    for database, count in (("one", 1), ("three", 3)):
        store = HistoryStore.open(root, database=database)
        segments = [[{"op": "insert", "t": 2 * i + 2, "table_uuid": "tbl-example", "key": i,
                      "values": {"col1": f"v{i}"}}] for i in range(count)]
        write(store, [create, *segments[0]], *segments[1:])
        keys = [f"{database}.{n:020d}" for n in range(1, count + 1)]
        instance = dg.DagsterInstance.ephemeral()
        instance.add_dynamic_partitions(segment_partitions.name, keys)
        before = set(tracker.getJobIdsForGroup())
        result = compact_segments_job.execute_in_process(run_config=batch_run_config(keys), resources=resources,
                                                         instance=instance)
        jobs.append(len(set(tracker.getJobIdsForGroup()) - before))
        assert result.success and store.frontier == 2 * count
        written = [materialized(instance, "compacted_batches", k)[0]["versions_written"].value for k in keys]
        assert written == [1] * count
    assert jobs[0] >= 1 and jobs[1] == jobs[0]


def _closed_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


def test_sensor_waits_for_the_engine_and_requests_the_segment_once_it_answers(root):
    _sealed_example(root)
    away = Daemon(root, spark=SparkResource(master=f"sc://127.0.0.1:{_closed_port()}"))
    first = away.tick()
    assert first.run_requests == []
    assert "does not answer" in first.skip_reason.skip_message
    assert away.tick().run_requests == []  # still away: still nothing
    away.spark = SparkResource(master="local[2]")  # back (a local master always answers)
    back = away.tick()
    assert [keys_of(r) for r in back.run_requests] == [["db.00000000000000000001", "db.00000000000000000002"]]
    assert away.tick().run_requests == []  # requested once


def test_a_segment_whose_run_lost_the_engine_is_requested_again(root):
    from history_pipeline.orchestration.assets import retry_when_engine_is_back

    store = _sealed_example(root)
    daemon = Daemon(root)
    first = daemon.tick()
    assert len(first.run_requests) == 1
    assert daemon.tick().run_requests == []
    # the run lost the engine at segment 1: it asks for the segment to be requested again
    retry_when_engine_is_back(store, store.segments(SegmentState.SEALED)[0])
    again = daemon.tick()
    assert [keys_of(r) for r in again.run_requests] == [["db.00000000000000000001"]]
    assert again.run_requests[0].run_key != first.run_requests[0].run_key  # a new run, not a duplicate key


def test_a_lost_engine_is_one_clear_error():
    import grpc
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException

    from history_pipeline.execution import EngineUnavailableError, engine_failure, raise_engine_failure

    class Unavailable(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

    try:
        try:
            raise Unavailable()
        except Unavailable as rpc:
            raise SparkConnectGrpcException("retries exceeded") from rpc
    except SparkConnectGrpcException as exc:
        lost = exc
    assert engine_failure(lost)
    with pytest.raises(EngineUnavailableError, match="the Spark engine at sc://h:1 stopped answering"):
        raise_engine_failure(lost, "sc://h:1")
    assert not engine_failure(ValueError("a bug in the work"))
    raise_engine_failure(ValueError("a bug in the work"), "sc://h:1")  # other errors pass through

    # the engine lost while a run asks for its master: that loss, not a master taken for a remote one
    from history_pipeline.execution import spark_master

    class Conf:
        def __init__(self, error):
            self.error = error

        def get(self, key):
            raise self.error

    class Session:
        def __init__(self, error):
            self.conf = Conf(error)

    with pytest.raises(SparkConnectGrpcException):
        spark_master(Session(lost))
    assert spark_master(Session(ValueError("not exposed"))) == "unknown"


def test_sensor_removes_partitions_of_segments_gone_from_the_wal(root):
    import shutil

    _sealed_example(root, "db_a")
    _sealed_example(root, "db_b")
    daemon = Daemon(root)
    daemon.tick()
    shutil.rmtree(root / "db_b")  # a database removed from the root
    result = daemon.tick()
    assert list(result.dynamic_partitions_requests[0].partition_keys) == [
        "db_b.00000000000000000001", "db_b.00000000000000000002"]
    assert set(daemon.instance.get_dynamic_partitions(segment_partitions.name)) == {
        "db_a.00000000000000000001", "db_a.00000000000000000002"}


def test_an_edited_segment_is_quarantined_by_dagster_as_by_the_cli(root, resources):
    store = _sealed_example(root)
    sealed = store.segments(SegmentState.SEALED)[0]
    sealed.path.write_text(sealed.path.read_text().replace("my_table", "my_tabel"))  # breaks the seal
    assert any("unverifiable segment" in str(p) for p in store.verify())
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(segment_partitions.name, ["db.00000000000000000001"])
    result = dg.materialize([wal_segments, compacted_batches], resources=resources, instance=instance,
                            partition_key="db.00000000000000000001", raise_on_error=False)
    assert not result.success
    assert [r.segment_id for r in store.segments(SegmentState.QUARANTINED)] == [1]
    assert any("checksum mismatch" in str(p) for p in store.verify())
    store.repair_segment(1, store.segments(SegmentState.QUARANTINED)[0].path, reason="renamed by mistake")
    ok = dg.materialize([wal_segments, compacted_batches], resources=resources, instance=instance,
                        partition_key="db.00000000000000000001")
    assert ok.success and store.get_catalog(store.frontier + 1)[0].table_name == "my_tabel"


def test_supertables_job_runs_its_checks_with_readable_metadata(root, resources):
    from history_pipeline.orchestration.assets import schema_history
    from history_pipeline.orchestration.schedules import supertables_job, supertables_schedule

    store = _sealed_example(root)
    store.compact(spark=False)
    local = dg.Definitions(
        assets=[supertables, schema_history],
        asset_checks=[catalog_verifies_check, frontier_lag_check, reconstruction_invariant_check],
        jobs=[supertables_job], schedules=[supertables_schedule], resources=resources,
    )
    assert local.resolve_schedule_def("supertables_schedule").job_name == "supertables_job"
    result = local.resolve_job_def("supertables_job").execute_in_process()
    assert result.success
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(evaluations) == {"catalog_verifies_check", "frontier_lag_check", "reconstruction_invariant_check"}
    verified = evaluations["catalog_verifies_check"]
    assert verified.passed and verified.metadata["problems"].value == 0
    assert verified.metadata["details"].value == "no problem found"
    lag = evaluations["frontier_lag_check"].metadata
    assert lag["most_pending_segments"].value == 0 and "| db | 5 | 0 | 0 |" in lag["by_database"].value
    for evaluation in (verified, evaluations["frontier_lag_check"]):
        assert not any(isinstance(v, dg.JsonMetadataValue) for v in evaluation.metadata.values())
    merged = result.asset_materializations_for_node("supertables")[0].metadata
    assert "| db | 5 |" in merged["by_database"].value


def test_the_engine_variable_names_a_connect_url_in_process_or_nothing(monkeypatch):
    """HISTORY_PIPELINE_SPARK: a URL is resolved by Dagster in each run, ``in-process`` runs the work
    without Spark, unset gives each run a classic local session."""
    from history_pipeline.orchestration.resources import ENGINE_ENV, IN_PROCESS, spark_engine

    monkeypatch.setenv(ENGINE_ENV, IN_PROCESS)
    engine = spark_engine()
    assert engine.enabled is False and engine.session() is False and engine.reachable()
    monkeypatch.setenv(ENGINE_ENV, "sc://127.0.0.1:15002")
    assert spark_engine().enabled is True
    monkeypatch.delenv(ENGINE_ENV)
    assert spark_engine().enabled is True and spark_engine().master == "local[*]"


def test_connect_urls_name_one_engine_session_per_period():
    """Every run on a Connect engine attaches to the same server-side session during a period
    shorter than the server's idle timeout; an explicit session in the URL is kept."""
    from history_pipeline.execution import SHARED_SESSION_SECONDS, shared_session_url

    url = "sc://127.0.0.1:15002"
    start = 10 * SHARED_SESSION_SECONDS
    same = {shared_session_url(url, start + s) for s in (0, 1, SHARED_SESSION_SECONDS - 1)}
    assert len(same) == 1 and same.pop().startswith(url + "/;session_id=")
    assert shared_session_url(url, start + SHARED_SESSION_SECONDS) != shared_session_url(url, start)
    assert shared_session_url("sc://other:15002", start).split("=")[1] != shared_session_url(url, start).split("=")[1]
    assert shared_session_url(url + "/;use_ssl=true", start).startswith(url + "/;use_ssl=true;session_id=")
    assert shared_session_url(url + "/;session_id=mine", start) == url + "/;session_id=mine"
    # two deployments (Dagster instances) on one engine: their settings and credentials stay apart
    assert shared_session_url(url, start, "/srv/a") == shared_session_url(url, start + 1, "/srv/a")
    assert shared_session_url(url, start, "/srv/a") != shared_session_url(url, start, "/srv/b")
    assert SHARED_SESSION_SECONDS < 3600  # Spark Connect closes an idle session after 60 min by default


def test_an_engine_warmed_near_a_periods_end_warms_the_next_periods_session_too(monkeypatch):
    """Runs move to the next period's shared session at the period's end: an engine started just
    before it warms that session as well, so the runs after the turn find it warm."""
    from history_pipeline import engine, execution
    from history_pipeline.execution import SHARED_SESSION_SECONDS, WARM_NEXT_WITHIN_SECONDS, shared_session_url

    warmed: list[str] = []

    class FakeSession:
        def __init__(self, url):
            self.url = url

        def addTag(self, tag):  # noqa: N802 (pyspark's name)
            pass

        def clearTags(self):  # noqa: N802
            pass

        def stop(self):
            pass

    monkeypatch.setattr(execution, "spark_session", lambda url, conf=None: FakeSession(url))
    monkeypatch.setattr(execution, "map_tasks", lambda session, fn, items: warmed.append(session.url))
    url, scope, start = "sc://127.0.0.1:15002", "/srv/home", 10 * SHARED_SESSION_SECONDS
    early = start + 60
    engine.warm_engine(url, scope, now=early)
    assert warmed == [shared_session_url(url, early, scope)]
    warmed.clear()
    late = start + SHARED_SESSION_SECONDS - WARM_NEXT_WITHIN_SECONDS + 1
    engine.warm_engine(url, scope, now=late)
    turn = late + SHARED_SESSION_SECONDS
    assert warmed == [shared_session_url(url, late, scope), shared_session_url(url, turn, scope)]
    # the next session is first used before the engine would close it for idleness (60 min)
    assert WARM_NEXT_WITHIN_SECONDS + SHARED_SESSION_SECONDS < 3600


def test_a_quiet_tick_listens_to_the_journal_and_requests_a_segment_sealed_meanwhile(root):
    """With nothing due, a tick waits for the change journal: a segment sealed while it waits is
    requested by that tick, not by the daemon's next evaluation."""
    import threading

    from history_pipeline.orchestration.resources import HistoryRootResource, S3Settings

    store = _sealed_example(root)
    # folders changed long ago: the first tick leaves the database settled, not pending
    for folder in (store.wal_dir / "segments", store.wal_dir / "quarantine"):
        if folder.exists():
            os.utime(folder, (time.time() - 60, time.time() - 60))
    listening = HistoryRootResource(root=str(root), s3=S3Settings(), sensor_listen_seconds=60)
    daemon = Daemon(root, history=listening)
    assert [keys_of(r) for r in daemon.tick().run_requests] == [["db.00000000000000000001", "db.00000000000000000002"]]
    later = threading.Timer(1.0, write, (store, [{"op": "insert", "t": 9, "table_uuid": "tbl-example", "key": 5,
                                                   "values": {"col1": "v"}}]))
    later.start()
    try:
        # segments 1 and 2 are requested and not yet applied: nothing is due, the tick listens
        assert [keys_of(r) for r in daemon.tick().run_requests] == [["db.00000000000000000003"]]
    finally:
        later.join()


def test_a_tick_listens_only_while_nothing_can_be_requested():
    from history_pipeline.orchestration.sensors import SensorCursor, listen_due

    steady = SensorCursor("epoch", generation=3, since_full_scan=1)
    assert listen_due(steady, True, [], [])  # nothing named: wait for a marker
    assert not listen_due(steady, True, ["db_a"], [])  # a marker or a pending database: look now
    # every database named is held behind its run in flight: wait for a run's end (or a marker)
    assert listen_due(steady, True, ["db_a"], ["db_a", "db_b"])
    assert not listen_due(steady, True, ["db_a", "db_c"], ["db_a"])  # db_c can be requested now
    assert not listen_due(steady, False, [], [])  # no journal: a full scan
    assert not listen_due(SensorCursor("epoch"), True, [], [])  # first tick: a full scan
    assert not listen_due(SensorCursor("epoch", 3, 59), True, [], [], every=60)


def test_a_tick_held_behind_a_run_in_flight_requests_the_next_batch_when_that_run_ends(root):
    """A database whose run is in flight is pending: a tick listens for that run's end and then
    requests the database's waiting segments, instead of leaving them to the daemon's next loop."""
    import threading

    from history_pipeline.orchestration.resources import HistoryRootResource, S3Settings

    _sealed_example(root)
    listening = HistoryRootResource(root=str(root), s3=S3Settings(), sensor_listen_seconds=60)
    daemon = Daemon(root, history=listening)
    run = in_flight(daemon.instance, "db")
    assert daemon.tick().run_requests == []  # held behind the run in flight
    ends = threading.Timer(1.0, daemon.instance.report_run_canceled, (run,))
    # a tick that listened on after the run's end would see this segment too
    store = HistoryStore.open(root, database="db")
    sealed_late = threading.Timer(30.0, write, (store, [{"op": "insert", "t": 9, "table_uuid": "tbl-example",
                                                         "key": 5, "values": {"col1": "v"}}]))
    ends.start()
    sealed_late.start()
    try:
        assert [keys_of(r) for r in daemon.tick().run_requests] == [["db.00000000000000000001",
                                                                     "db.00000000000000000002"]]
    finally:
        sealed_late.cancel()
        ends.join()
