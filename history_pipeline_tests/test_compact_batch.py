"""HistoryStore.compact_batch: several segments of a database in one call, each applied exactly once,
in order, in its own catalog transaction, with its own figures; a failure part way is returned
with what was applied before it. In-process (``spark=False``): the same tasks as on Spark."""

import pytest

from history_pipeline import HistoryStore
from history_pipeline.errors import SegmentOrderError, SegmentQuarantinedError
from history_pipeline.wal import SegmentState
from history_pipeline_tests.test_compaction import T1, example_events, write


def _three(root, database="db"):
    store = HistoryStore.open(root, database=database)
    events = example_events()
    write(store, events[:3], events[3:],
          [{"op": "insert", "t": 7, "table_uuid": T1, "key": 7, "values": {"col1": "seven"}},
           {"op": "update", "t": 8, "table_uuid": T1, "key": 7, "values": {"col1": "eight"}}])
    return store


def test_a_batch_reports_each_segment_as_compacting_it_alone_would(tmp_path):
    batched = _three(tmp_path / "batched")
    outcome = batched.compact_batch([1, 2, 3], spark=False)
    assert outcome.error is None and outcome.stopped_at is None and outcome.already_applied == ()
    alone = _three(tmp_path / "alone")
    singles = [alone.compact(spark=False, only_segment=i).applied[0] for i in (1, 2, 3)]
    assert list(outcome.applied) == singles  # versions, files, bytes, tables, frontiers: each its own
    assert [(a.segment_id, a.versions_written, a.schema_changes, a.frontier_before, a.frontier)
            for a in outcome.applied] == [(1, 2, 1, -1, 3), (2, 2, 0, 3, 5), (3, 2, 0, 5, 8)]
    assert outcome.summary.versions_written == 6 and batched.frontier == 8
    # one commit per segment, as compacting them one by one
    assert [c.operation for c in batched.history()][:3] == [c.operation for c in alone.history()][:3]
    assert batched.load_table("my_table", 9, ordered=True).to_pylist() == \
        alone.load_table("my_table", 9, ordered=True).to_pylist()
    # exactly once: the same batch again applies nothing and says so
    again = batched.compact_batch([1, 2, 3], spark=False)
    assert again.applied == () and again.already_applied == (1, 2, 3) and again.error is None


def test_a_batch_stops_at_a_quarantined_segment_with_the_ones_before_it_applied(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    write(store, example_events(), [{"op": "delete", "t": 9, "table_uuid": T1, "key": 99}],
          [{"op": "insert", "t": 10, "table_uuid": T1, "key": 7, "values": {"col1": "x"}}])
    outcome = store.compact_batch([1, 2, 3], spark=False)
    assert isinstance(outcome.error, SegmentQuarantinedError) and outcome.stopped_at == 2
    assert [a.segment_id for a in outcome.applied] == [1] and store.frontier == 5
    assert [r.segment_id for r in store.segments(SegmentState.QUARANTINED)] == [2]
    assert [r.segment_id for r in store.segments(SegmentState.SEALED)] == [3]  # untouched, still pending
    # a batch naming the quarantined segment stops there before any work
    stopped = store.compact_batch([2, 3], spark=False)
    assert isinstance(stopped.error, SegmentQuarantinedError) and stopped.stopped_at == 2
    assert stopped.applied == () and store.frontier == 5


def test_a_batch_refuses_to_skip_a_pending_segment(tmp_path):
    store = _three(tmp_path)
    for wrong in ([2, 3], [1, 3]):
        with pytest.raises(SegmentOrderError, match="waits for the earlier segment 00000000000000000002"
                           if wrong == [1, 3] else "waits for the earlier segment 00000000000000000001"):
            store.compact_batch(wrong, spark=False)
    assert store.frontier == -1  # refused before any work
