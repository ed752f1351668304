"""Dagster glue: the code location loads, assets materialize on real local Spark, the sensor and
schedules evaluate as the daemon would evaluate them, and the asset checks run."""

import os
import time

import dagster as dg
import pytest

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
from history_pipeline.orchestration.sensors import finished_wal_segments_sensor
from history_pipeline.store import HistoryStore
from history_pipeline.wal import SegmentState
from history_pipeline.wal.segments import release_segment
from history_pipeline_tests.test_compaction import rfc_events, write


def test_definitions_load_with_the_contract_names():
    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == {
        "wal_segments", "compacted_batches", "supertables", "schema_history", "cold_tier_export",
    }
    assert defs.resolve_sensor_def("finished_wal_segments_sensor")
    for name in ("retention_schedule", "cold_tier_export_schedule", "cleanup_schedule"):
        assert defs.resolve_schedule_def(name)


@pytest.fixture
def root(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def resources(root, spark):
    return {"history": history_root(str(root)), "spark": SparkResource(master="local[2]")}


def _sealed_rfc(root, database="db"):
    store = HistoryStore.open(root, database=database)
    events = rfc_events()
    write(store, events[:3], events[3:])
    return store


def test_materialize_a_segment_partition_on_spark(root, resources):
    store = _sealed_rfc(root)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(segment_partitions.name, ["db.00000000000000000002", "db.00000000000000000001"])
    result = dg.materialize(
        [wal_segments, compacted_batches], resources=resources, instance=instance,
        partition_key="db.00000000000000000002",
    )
    assert result.success
    verified = result.asset_materializations_for_node("wal_segments")[0].metadata
    assert verified["records"].value == 4 and verified["upper"].value == 5
    compacted = result.asset_materializations_for_node("compacted_batches")[0].metadata
    # the earlier segment of the database is applied first: order is kept
    assert compacted["segments_applied"].value == [1, 2]
    assert compacted["frontier"].value == 5 and compacted["versions_written"].value == 4
    assert "value2_prime" in compacted["preview"].value
    assert store.fetch_row("my_table", 2, 6) == {"column1": "value2_prime"}
    again = dg.materialize([compacted_batches], resources=resources, instance=instance,
                           partition_key="db.00000000000000000001")
    assert again.asset_materializations_for_node("compacted_batches")[0].metadata["versions_written"].value == 0


def test_supertables_schema_history_and_checks(root, resources):
    store = _sealed_rfc(root)
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
    store.objects.delete(store.catalog_state().files_of("tbl-rfc")[0].path)
    broken = dg.materialize([supertables, catalog_verifies_check], resources=resources, raise_on_error=False)
    assert not {e.check_name: e for e in broken.get_asset_check_evaluations()}["catalog_verifies_check"].passed


def _evaluate(instance, root):
    with dg.build_sensor_context(instance=instance, resources={"history": history_root(str(root))}) as context:
        result = finished_wal_segments_sensor(context)
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result


def test_sensor_registers_partitions_and_requests_runs_in_order(root):
    _sealed_rfc(root, "db_a")
    _sealed_rfc(root, "db_b")
    instance = dg.DagsterInstance.ephemeral()
    first = _evaluate(instance, root)
    keys = [r.partition_key for r in first.run_requests]
    assert keys == ["db_a.00000000000000000001", "db_a.00000000000000000002",
                    "db_b.00000000000000000001", "db_b.00000000000000000002"]
    assert set(first.dynamic_partitions_requests[0].partition_keys) == set(keys)
    assert all(r.tags["history_pipeline/database"] == r.partition_key.split(".")[0] for r in first.run_requests)
    second = _evaluate(instance, root)
    assert second.dynamic_partitions_requests == []  # nothing new to register
    assert [r.run_key for r in second.run_requests] == [r.run_key for r in first.run_requests]  # dedup by run key
    HistoryStore.open(root, database="db_a").compact()
    third = _evaluate(instance, root)
    assert [r.partition_key for r in third.run_requests] == keys[2:]


def test_quarantined_segment_is_retried_only_after_an_operator_releases_it(root):
    store = HistoryStore.open(root, database="db")
    write(store, rfc_events(), [{"op": "delete", "t": 9, "table_uuid": "tbl-rfc", "key": 99}])
    instance = dg.DagsterInstance.ephemeral()
    with pytest.raises(Exception, match="quarantined"):
        store.compact()
    assert [r.partition_key for r in _evaluate(instance, root).run_requests] == []
    quarantined = store.segments(SegmentState.QUARANTINED)[0]
    before = quarantined.path.stat().st_ctime_ns
    time.sleep(0.01)
    released = release_segment(quarantined, store.wal_dir)
    os.utime(released.path)  # an operator's fix touches the file
    again = _evaluate(instance, root).run_requests
    assert [r.partition_key for r in again] == ["db.00000000000000000002"]
    assert again[0].run_key != f"db.00000000000000000002@{before}"


def test_schedules_evaluate_and_retention_job_runs(root):
    store = _sealed_rfc(root)
    store.compact()
    for schedule in (retention_schedule, cold_tier_export_schedule, cleanup_schedule):
        result = schedule.evaluate_tick(dg.build_schedule_context(scheduled_execution_time=None))
        assert len(result.run_requests) == 1
        assert result.run_requests[0].tags["dagster/schedule_name"] == schedule.name
    run = retention_job.execute_in_process(
        resources={"history": history_root(str(root))},
        run_config={"ops": {"retain_op": {"config": {"keep_timestamps": 2, "cold_tier": str(root / "cold")}}}},
    )
    assert run.success
    assert store.earliest == 4
    assert run.output_for_node("retain_op")["db"]["files_removed"] >= 1


def test_quarantined_segment_fails_its_run_with_the_error(root, resources):
    store = HistoryStore.open(root, database="db")
    write(store, rfc_events(), [{"op": "delete", "t": 9, "table_uuid": "tbl-rfc", "key": 99}])
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(segment_partitions.name, ["db.00000000000000000002"])
    result = dg.materialize([compacted_batches], resources=resources, instance=instance,
                            partition_key="db.00000000000000000002", raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "delete of key 99, which does not exist" in str(failure.step_failure_data.error)
    assert store.frontier == 5  # the segment before it was applied
