"""The whole path on S3: WAL on local disk, warehouse and catalog on a real S3 endpoint (moto server)."""

from history_pipeline import HistoryStore
from history_pipeline_tests.test_compaction import check_against_model, random_history, write


def test_compaction_and_queries_on_s3(tmp_path, s3_bucket, s3_options, spark):
    store = HistoryStore.open(s3_bucket, database="db", wal_dir=tmp_path / "wal", s3=s3_options)
    events = random_history(77, n_events=40)
    write(store, events[:20], events[20:])
    store.compact(spark=spark)
    assert store.objects.list("db/tables/")  # the supertables live in the bucket
    assert store.objects.list("db/_catalog/transactions/")
    check_against_model(store, events)
