"""The write-ahead log on real files: sealing, rotation, ordering rules, recovery, corruption, locking."""

import multiprocessing
import os

import pytest

from history_pipeline.errors import (
    MalformedRecordError,
    SealError,
    SegmentCorruptedError,
    TimestampOrderError,
    WriterLockedError,
)
from history_pipeline.events import Close, Insert
from history_pipeline.wal import SegmentState, WalWriter, list_segments, read_segment
from history_pipeline_tests.conftest import create_table


def insert(t, key, amount="1.00"):
    return {"op": "insert", "t": t, "table_uuid": "tbl-1", "key": key, "values": {"c-id": key, "c-amount": amount}}


def test_sealed_segment_begins_and_ends_with_close_and_verifies(wal_dir):
    with WalWriter(wal_dir) as wal:
        wal.append(create_table(1))
        wal.append(insert(2, 1))
        wal.append(insert(2, 2))
        wal.append({"op": "close", "t": 2})
        ref = wal.seal()
    assert ref is not None and ref.state is SegmentState.SEALED
    contents = read_segment(ref)
    events = [e for _, e in contents.events]
    assert isinstance(events[0], Close) and isinstance(events[-1], Close)
    assert (contents.lower, contents.upper) == (-1, 2)
    assert [type(e) for e in events[1:-1]].count(Insert) == 2
    assert [n for n, _ in contents.events] == [1, 2, 3, 4, 5]


def test_next_segment_starts_at_previous_upper_bound(wal_dir):
    with WalWriter(wal_dir) as wal:
        wal.append(create_table(1))
        wal.append({"op": "close", "t": 5})
        first = wal.seal()
        wal.append(insert(6, 1))
        wal.append({"op": "close", "t": 9})
        second = wal.seal()
    assert read_segment(second).lower == read_segment(first).upper == 5
    assert second.segment_id == first.segment_id + 1


def test_seal_requires_close_last(wal_dir):
    with WalWriter(wal_dir) as wal:
        wal.append(create_table(1))
        with pytest.raises(SealError, match="not a close"):
            wal.seal()
        wal.append({"op": "close", "t": 1})
        assert wal.seal() is not None
        assert wal.seal() is None  # nothing appended since


def test_rotation_by_size_waits_for_a_close(wal_dir):
    with WalWriter(wal_dir, max_segment_bytes=300) as wal:
        wal.append(create_table(1))
        for i in range(2, 12):
            wal.append(insert(i, i))
        assert list_segments(wal_dir, SegmentState.SEALED) == []  # no close yet
        wal.append({"op": "close", "t": 11})
        assert len(list_segments(wal_dir, SegmentState.SEALED)) == 1
        wal.append(insert(12, 12))
        assert len(list_segments(wal_dir, SegmentState.OPEN)) == 1


def test_rotation_by_age(wal_dir):
    with WalWriter(wal_dir, max_segment_age_s=0) as wal:
        wal.append(create_table(1))
        wal.append({"op": "close", "t": 1})
    assert len(list_segments(wal_dir, SegmentState.SEALED)) == 1


@pytest.mark.parametrize(
    "events, bad, fragment",
    [
        ([insert(5, 1)], insert(4, 2), "goes backwards"),
        ([insert(5, 1), {"op": "close", "t": 5}], insert(5, 2), "closed timestamp"),
        ([{"op": "close", "t": 7}], insert(3, 2), "closed timestamp"),
        ([insert(5, 1)], create_table(5, "tbl-2", "other"), "timestamp of its own"),
        ([create_table(5, "tbl-2", "other")], insert(5, 1), "timestamp of its own"),
        ([insert(5, 1)], {"op": "close", "t": 4}, "below the last event"),
    ],
)
def test_ordering_violations_are_refused_and_write_nothing(wal_dir, events, bad, fragment):
    with WalWriter(wal_dir) as wal:
        wal.append(create_table(1))
        for e in events:
            wal.append(e)
        open_path = list_segments(wal_dir, SegmentState.OPEN)[0].path
        before = open_path.read_bytes()
        with pytest.raises(TimestampOrderError, match=fragment):
            wal.append(bad)
        assert open_path.read_bytes() == before


def test_malformed_event_is_refused_and_write_nothing(wal_dir):
    with WalWriter(wal_dir) as wal:
        wal.append(create_table(1))
        path = list_segments(wal_dir, SegmentState.OPEN)[0].path
        before = path.read_bytes()
        with pytest.raises(MalformedRecordError, match="missing field 'key'"):
            wal.append({"op": "insert", "t": 2, "table_uuid": "tbl-1", "values": {}})
        assert path.read_bytes() == before
        wal.append(insert(2, 1))  # the writer is still usable


def test_torn_tail_is_truncated_on_recovery(wal_dir):
    with WalWriter(wal_dir) as wal:
        wal.append(create_table(1))
        wal.append(insert(2, 1))
        wal.flush()
    path = list_segments(wal_dir, SegmentState.OPEN)[0].path
    intact = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"op":"insert","t":3,"table_uu')
    with WalWriter(wal_dir) as wal:
        assert path.read_bytes() == intact
        wal.append(insert(3, 2))
        wal.append({"op": "close", "t": 3})
        ref = wal.seal()
    keys = [e.key for _, e in read_segment(ref).events if isinstance(e, Insert)]
    assert keys == [1, 2]


def test_recovered_writer_keeps_ordering_state(wal_dir):
    with WalWriter(wal_dir) as wal:
        wal.append(create_table(1))
        wal.append({"op": "close", "t": 4})
        wal.seal()
    with WalWriter(wal_dir) as wal:
        with pytest.raises(TimestampOrderError):
            wal.append(insert(4, 1))
        wal.append(insert(5, 1))
    with WalWriter(wal_dir) as wal:
        with pytest.raises(TimestampOrderError):
            wal.append(insert(3, 1))


def test_flipped_byte_in_sealed_segment_is_detected(wal_dir):
    with WalWriter(wal_dir) as wal:
        wal.append(create_table(1))
        wal.append(insert(2, 1, "12.34"))
        wal.append({"op": "close", "t": 2})
        ref = wal.seal()
    data = bytearray(ref.path.read_bytes())
    position = data.index(b"12.34")
    data[position] = ord("9")
    ref.path.write_bytes(bytes(data))
    with pytest.raises(SegmentCorruptedError, match="checksum") as info:
        read_segment(ref)
    assert info.value.segment == ref.name


def test_truncated_sealed_segment_is_detected(wal_dir):
    with WalWriter(wal_dir) as wal:
        wal.append(create_table(1))
        wal.append({"op": "close", "t": 2})
        ref = wal.seal()
    data = ref.path.read_bytes()
    ref.path.write_bytes(data[: len(data) - 10])
    with pytest.raises(SegmentCorruptedError):
        read_segment(ref)


def test_two_writers_cannot_both_write(wal_dir):
    first = WalWriter(wal_dir)
    with pytest.raises(WriterLockedError, match="only one writer"):
        WalWriter(wal_dir)
    first.close()
    WalWriter(wal_dir).close()  # released


def _hold_lock_then_die(wal_dir, ready):
    WalWriter(wal_dir)
    ready.set()
    os._exit(0)  # a crash: no close, no cleanup


def test_crashed_writer_does_not_leave_the_lock_stuck(wal_dir):
    ready = multiprocessing.get_context("fork").Event()
    proc = multiprocessing.get_context("fork").Process(target=_hold_lock_then_die, args=(wal_dir, ready))
    proc.start()
    proc.join(10)
    assert ready.is_set()
    WalWriter(wal_dir).close()


def _try_lock(wal_dir, result):
    try:
        WalWriter(wal_dir).close()
        result.put("acquired")
    except WriterLockedError:
        result.put("locked")


def test_writer_in_another_process_is_refused(wal_dir):
    ctx = multiprocessing.get_context("fork")
    result = ctx.Queue()
    with WalWriter(wal_dir):
        proc = ctx.Process(target=_try_lock, args=(wal_dir, result))
        proc.start()
        proc.join(10)
    assert result.get(timeout=5) == "locked"
