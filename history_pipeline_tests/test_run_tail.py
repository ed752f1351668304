"""What a compaction run does after its commit, which the database's next run waits behind: each
segment's partitions recorded with its own figures and preview, nothing else written to the
instance but the step's end, and the preview's row counts the same as SQL's."""

import dagster as dg

from history_pipeline.orchestration.partitions import segment_partitions
from history_pipeline.orchestration.resources import SparkResource, history_root
from history_pipeline.orchestration.segment_runs import batch_run_config, compact_segments_job
from history_pipeline.store import HistoryStore
from history_pipeline_tests.test_compaction import example_events, write


def test_row_counts_without_the_sql_sandbox_agree_with_sql_at_every_time(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    events = example_events()
    write(store, events[:3], events[3:])
    store.compact(spark=False)
    context = store.query_context()
    for as_of in range(2, store.frontier + 2):
        (descriptor,) = context.get_catalog(as_of)
        expected = store.sql('SELECT count(*) AS n FROM "my_table"', as_of).column("n")[0].as_py()
        assert context.count_rows(descriptor, as_of) == expected
    # inserted at 2 and 3, key 1 deleted at 5
    assert [context.count_rows(context.get_catalog(t)[0], t) for t in (2, 3, 4, 5, 6)] == [0, 1, 2, 2, 1]


def test_after_its_commit_a_run_writes_its_segments_records_and_its_end_only(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    events = example_events()
    write(store, events[:3], events[3:])
    instance = dg.DagsterInstance.ephemeral()
    keys = ["db.00000000000000000001", "db.00000000000000000002"]
    instance.add_dynamic_partitions(segment_partitions.name, keys)
    resources = {"history": history_root(str(tmp_path)), "spark": SparkResource(enabled=False)}
    result = compact_segments_job.execute_in_process(run_config=batch_run_config(keys), resources=resources,
                                                     instance=instance)
    assert result.success and store.frontier == 5
    kinds = [e.event_type_value for e in result.all_events]
    after = kinds[kinds.index("STEP_START") + 1:]
    # no output nor its handling: nothing reads one, and the next run of the database would wait for it
    assert [k for k in after if k not in ("ASSET_MATERIALIZATION",)][:1] == ["STEP_SUCCESS"]
    assert after.count("ASSET_MATERIALIZATION") == 4 and "STEP_OUTPUT" not in kinds
    previews = [e.step_materialization_data.materialization.metadata["preview"].value for e in result.all_events
                if e.event_type_value == "ASSET_MATERIALIZATION"
                and e.asset_key.to_user_string() == "compacted_batches"]
    # each segment's preview counts the rows as of that segment's own frontier (3, then 5)
    assert "| my_table | 2 |" in previews[0] and "| my_table | 1 |" in previews[1]
    assert "value2" not in "".join(previews)
