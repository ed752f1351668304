"""The whole path on S3: WAL on local disk, warehouse and catalog on a real S3 endpoint (moto server)."""

import tempfile

import dagster as dg

from history_pipeline import HistoryStore
from history_pipeline.wal.segments import segment_name
from history_pipeline_tests.model import BaseDatabase
from history_pipeline_tests.test_compaction import check_against_model, random_history, write


def test_compaction_and_queries_on_s3(tmp_path, s3_bucket, s3_options, spark):
    store = HistoryStore.open(s3_bucket, database="db", wal_dir=tmp_path / "wal", s3=s3_options)
    events = random_history(77, n_events=40)
    write(store, events[:20], events[20:])
    store.compact(spark=spark)
    assert store.objects.list("db/tables/")  # the supertables live in the bucket
    assert store.objects.list("db/_catalog/transactions/")
    check_against_model(store, events)


def _expected_tables(events, as_of):
    """The model's tables as of ``as_of``: name -> {key: row}."""
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    return {t["name"]: model.table_as_of(t["name"], as_of) for t in model.state_as_of(as_of).values()}


def _tables(store, as_of):
    return {d.table_name: {r.pop("synthetic_key"): r for r in store.load_table(d.table_name, as_of).to_pylist()}
            for d in store.get_catalog(as_of)}


def test_dagster_on_s3_sensor_runs_query_and_maintenance(tmp_path, s3_bucket, s3_options, spark, monkeypatch):
    """The S3 deployment's own definitions (settings only through dg.EnvVar): sensor -> compaction runs
    on a real Dagster instance -> answers as of T equal the model's -> merge, snapshots and retention."""
    wal_root = tmp_path / "wal"
    for name, value in {"HISTORY_PIPELINE_ROOT": s3_bucket, "HISTORY_PIPELINE_WAL_ROOT": str(wal_root),
                        "AWS_ENDPOINT_URL": s3_options.endpoint_url, "AWS_REGION": s3_options.region,
                        "AWS_ACCESS_KEY_ID": s3_options.access_key_id,
                        "AWS_SECRET_ACCESS_KEY": s3_options.secret_access_key}.items():
        monkeypatch.setenv(name, value)
    from history_pipeline.orchestration.s3_deployment import defs

    histories = {"tenant_a": random_history(5, n_events=30), "tenant_b": random_history(6, n_events=30)}
    for database, events in histories.items():
        store = HistoryStore.open(s3_bucket, database=database, wal_dir=wal_root / database, s3=s3_options)
        cut = next(i for i in range(12, len(events)) if events[i]["t"] != events[i - 1]["t"])  # between two t
        write(store, events[:cut], events[cut:])
    sensor = defs.resolve_sensor_def("finished_wal_segments_sensor")
    with tempfile.TemporaryDirectory() as home, dg.DagsterInstance.local_temp(home) as instance:
        resources = {"history": defs.resources["history"], "spark": defs.resources["spark"]}
        with dg.build_sensor_context(instance=instance, resources=resources) as context:
            tick = sensor(context)
        # one run per database, its segments in order
        assert [r.run_config["ops"]["compact_segments"]["config"]["partition_keys"] for r in tick.run_requests] == [
            [f"{db}.{segment_name(i)}" for i in (1, 2)] for db in ("tenant_a", "tenant_b")]
        instance.add_dynamic_partitions("wal_segments", list(tick.dynamic_partitions_requests[0].partition_keys))
        job = defs.resolve_job_def("compact_segments_job")
        for request in tick.run_requests:
            run = job.execute_in_process(instance=instance, run_config=request.run_config, tags=request.tags)
            assert run.success
            assert [e.partition for e in run.all_events if e.event_type_value == "ASSET_MATERIALIZATION"
                    and e.asset_key.to_user_string() == "compacted_batches"] == [
                request.tags["history_pipeline/database"] + f".{segment_name(i)}" for i in (1, 2)]
        stores = {db: HistoryStore.open(s3_bucket, database=db, wal_dir=wal_root / db, s3=s3_options, create=False)
                  for db in histories}
        for database, store in stores.items():
            assert not (wal_root / database / "_catalog").exists()  # the catalog is in the bucket
            assert store.objects.list(f"{database}/_catalog/transactions/")
            for as_of in range(0, store.frontier + 2):
                assert _tables(store, as_of) == _expected_tables(histories[database], as_of), (database, as_of)
        maintained = defs.resolve_job_def("supertables_job").execute_in_process(instance=instance)
        assert maintained.success
        assert {e.check_name: e.passed for e in maintained.get_asset_check_evaluations()}[
            "catalog_verifies_check"]
        cold = s3_bucket.rsplit("/", 1)[0] + "/cold"
        retained = defs.resolve_job_def("retention_job").execute_in_process(
            instance=instance,
            run_config={"ops": {"retain_op": {"config": {"keep_timestamps": 10, "cold_tier": cold}}}})
        assert retained.success
        for database, store in stores.items():
            frontier = store.frontier
            assert store.earliest == frontier + 1 - 10
            for as_of in range(store.earliest, frontier + 2):
                assert _tables(store, as_of) == _expected_tables(histories[database], as_of), (database, as_of)
            assert not store.verify()
