"""The operator's tools on the WAL, without Spark: all-or-nothing appends, repair and skip of a
quarantined segment (bounds kept, new seal, original kept for audit), and one rule for segments
that no longer verify."""

import json

import pytest

from history_pipeline.errors import InputRecordError, SealError, SegmentCorruptedError, SegmentQuarantinedError
from history_pipeline.events import Close
from history_pipeline.store import HistoryStore
from history_pipeline.wal import SegmentState, read_segment
from history_pipeline.wal.repair import corrected_events, repair_records
from history_pipeline.wal.segments import quarantine_segment, verify_or_quarantine
from history_pipeline.wal.writer import InputLines, WalWriter
from history_pipeline_tests.conftest import create_table


def _lines(*records):
    return [json.dumps(r).encode() for r in records]


def test_append_all_writes_nothing_when_a_line_is_bad(wal_dir):
    with WalWriter(wal_dir) as wal:
        good = _lines(create_table(1), {"op": "close", "t": 1})
        assert wal.append_all(good, source="a.jsonl", seal=True) == 2
        bad = _lines({"op": "insert", "t": 2, "table_uuid": "tbl-1", "key": 1, "values": {}},
                     {"op": "insert", "t": 1, "table_uuid": "tbl-1", "key": 2, "values": {}})
        with pytest.raises(InputRecordError, match=r"^b.jsonl, line 2: t=1 is at or below the closed timestamp 1"):
            wal.append_all(bad, source="b.jsonl")
        with pytest.raises(SealError, match="not a close"):
            wal.append_all(bad[:1], source="c.jsonl", seal=True)
    # nothing of b or c reached the log: the next writer starts a fresh segment after the sealed one
    refs = HistoryStore.open(wal_dir.parent, database="x", wal_dir=wal_dir).segments()
    assert [(r.segment_id, r.state) for r in refs] == [(1, SegmentState.SEALED)]


def test_append_all_reads_a_file_twice_without_keeping_it(tmp_path, wal_dir):
    source = tmp_path / "events.jsonl"
    source.write_bytes(b"\n".join(_lines(create_table(1), {"op": "close", "t": 1})) + b"\n\n")
    with WalWriter(wal_dir) as wal:
        assert wal.append_all(InputLines(source), source=str(source), seal=True) == 2
    ref = HistoryStore.open(tmp_path, database="x", wal_dir=wal_dir).segments()[0]
    assert [type(e).__name__ for _, e in read_segment(ref).events] == ["Close", "CreateTable", "Close"]


def test_identifiers_must_be_uuids_when_asked(wal_dir):
    with WalWriter(wal_dir) as wal, pytest.raises(InputRecordError, match="table_uuid 'tbl-1' is not a UUID"):
        wal.append_all(_lines(create_table(1)), source="in", require_uuids=True)


def test_corrected_events_keep_the_segments_bounds():
    insert = {"op": "insert", "t": 5, "table_uuid": "tbl-1", "key": 1, "values": {}}
    # only the events: both bounds are added
    events = corrected_events(_lines(insert), "fix", lower=3, upper=7)
    assert events[0] == Close(3) and events[-1] == Close(7) and len(events) == 3
    # a whole edited copy (opening close, events, closing close, old seal): the old seal is dropped
    copy = _lines({"op": "close", "t": 3}, insert, {"op": "close", "t": 7},
                  {"op": "close", "t": 7, "seal": {"records": 3, "sha256": "0" * 64}})
    assert corrected_events(copy, "fix", lower=3, upper=7) == events
    with pytest.raises(InputRecordError, match="fix, line 1: t=9 is above the segment's upper bound 7"):
        corrected_events(_lines({**insert, "t": 9}), "fix", lower=3, upper=7)
    with pytest.raises(InputRecordError, match="fix, line 1: t=3 is at or below the closed timestamp 3"):
        corrected_events(_lines({**insert, "t": 3}), "fix", lower=3, upper=7)
    with pytest.raises(InputRecordError, match="fix, line 2: not valid JSON"):
        corrected_events([json.dumps(insert).encode(), b"{oops"], "fix", lower=3, upper=7)


def _quarantined_store(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    with store.wal_writer() as wal:
        for record in (create_table(1), {"op": "close", "t": 1},
                       {"op": "delete", "t": 2, "table_uuid": "tbl-1", "key": 99}, {"op": "close", "t": 2}):
            wal.append(record)
        wal.seal()
    ref = store.segments(SegmentState.SEALED)[0]
    quarantine_segment(ref, store.wal_dir, "segment 1, line 4: delete of key 99, which does not exist", 4)
    return store


def test_repair_reseals_releases_and_keeps_the_original(tmp_path):
    store = _quarantined_store(tmp_path)
    original = store.segments(SegmentState.QUARANTINED)[0].path.read_bytes()
    fixed = tmp_path / "fixed.jsonl"
    fixed.write_bytes(b"".join(line + b"\n" for line in original.splitlines() if b'"key":99' not in line))
    record = store.repair_segment(1, fixed, reason="typo")
    [ref] = store.segments()
    assert ref.state is SegmentState.SEALED
    contents = read_segment(ref)  # the new seal verifies
    assert (contents.lower, contents.upper) == (-1, 2)
    assert [type(e).__name__ for _, e in contents.events] == ["Close", "CreateTable", "Close", "Close"]
    assert record.action == "repaired" and record.reason == "typo" and record.by
    assert record.original_sha256 != record.new_sha256
    audit = tmp_path / record.audit_dir
    assert (audit / "original.sealed").read_bytes() == original
    assert json.loads((audit / "error.json").read_text())["line"] == 4
    assert repair_records(store.wal_dir) == [record]
    assert not store.segments(SegmentState.QUARANTINED) and store.wal_problems() == []


def test_skip_needs_a_reason_and_keeps_only_the_bounds(tmp_path):
    store = _quarantined_store(tmp_path)
    with pytest.raises(Exception, match="needs a reason"):
        store.skip_segment(1, reason=" ")
    record = store.skip_segment(1, reason="bad import")
    contents = read_segment(store.segments(SegmentState.SEALED)[0])
    assert [e for _, e in contents.events] == [Close(-1), Close(2)] and contents.upper == 2
    assert record.action == "skipped" and record.new_records == 2
    with pytest.raises(Exception, match="segment 1 of db is not quarantined"):
        store.skip_segment(1, reason="again")


def test_an_edited_sealed_segment_is_quarantined_on_read_and_reported_by_verify(tmp_path):
    store = HistoryStore.open(tmp_path, database="db")
    with store.wal_writer() as wal:
        wal.append(create_table(1))
        wal.append({"op": "close", "t": 1})
        wal.seal()
    ref = store.segments(SegmentState.SEALED)[0]
    ref.path.write_bytes(ref.path.read_bytes().replace(b"orders", b"ordres"))
    assert [p.kind for p in store.verify()] == ["unverifiable segment"]
    with pytest.raises(SegmentQuarantinedError, match="checksum mismatch"):
        verify_or_quarantine(ref, store.wal_dir)
    assert [p.kind for p in store.verify()] == ["quarantined segment"]
    with pytest.raises(SegmentCorruptedError):
        read_segment(store.segments(SegmentState.QUARANTINED)[0])


def test_a_segment_whose_bounds_are_unreadable_is_refused(tmp_path):
    store = _quarantined_store(tmp_path)
    ref = store.segments(SegmentState.QUARANTINED)[0]
    ref.path.write_bytes(ref.path.read_bytes()[:-30])  # torn inside its sealing record
    with pytest.raises(SegmentCorruptedError, match="bounds are unknown"):
        store.skip_segment(1, reason="torn")
    assert store.segments(SegmentState.QUARANTINED) == [ref]  # left as it was
    assert not (store.wal_dir / "audit").exists()
