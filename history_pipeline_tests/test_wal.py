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


# --- the change journal (<wal base>/_changes): every transition the sensor must see leaves a marker --


def _sealed_segment(wal_dir, t=2):
    with WalWriter(wal_dir) as wal:
        wal.append(create_table(t - 1))
        wal.append(insert(t, 1))
        wal.append({"op": "close", "t": t})
        return wal.seal()


def _marked(journal_base):
    from history_pipeline.wal.journal import journal_dir, read_journal

    return [m.database for m in read_journal(journal_dir(journal_base))]


def test_seal_quarantine_skip_and_release_each_leave_one_marker_naming_the_database(tmp_path):
    from history_pipeline.wal.journal import ensure_journal
    from history_pipeline.wal.repair import skip_segment
    from history_pipeline.wal.segments import quarantine_segment, release_segment

    base = tmp_path / "data"  # a local root: <root>/<database>/wal
    wal_dir = base / "tenant.a" / "wal"
    wal_dir.mkdir(parents=True)
    assert ensure_journal(base)
    ref = _sealed_segment(wal_dir)
    assert _marked(base) == ["tenant.a"]
    quarantined = quarantine_segment(ref, wal_dir, "line 2: bad", 2)
    assert _marked(base) == ["tenant.a"] * 2
    released = release_segment(quarantined, wal_dir)
    assert _marked(base) == ["tenant.a"] * 3
    again = quarantine_segment(released, wal_dir, "line 2: still bad", 2)
    skip_segment(again, wal_dir, reason="bad import")
    assert _marked(base) == ["tenant.a"] * 5
    assert sorted(p.name for p in wal_dir.parent.iterdir()) == ["wal"]  # nothing written beside the WAL


def test_a_repaired_segment_leaves_a_marker(tmp_path):
    from history_pipeline.store import HistoryStore
    from history_pipeline.wal.journal import ensure_journal
    from history_pipeline.wal.segments import quarantine_segment

    root = tmp_path / "data"
    store = HistoryStore.open(root, database="db")
    ref = _sealed_segment(store.wal_dir)
    quarantine_segment(ref, store.wal_dir, "line 3: bad amount", 3)
    assert ensure_journal(root) and _marked(root) == []  # (the journal made after: nothing so far)
    fixed = tmp_path / "fixed.jsonl"
    fixed.write_text('{"op": "insert", "t": 2, "table_uuid": "tbl-1", "key": 1, '
                     '"values": {"c-id": 1, "c-amount": "2.00"}}\n')
    store.repair_segment(1, fixed, reason="typo")
    assert _marked(root) == ["db"]


def test_without_a_journal_folder_a_seal_writes_no_marker_and_creates_nothing(tmp_path):
    from history_pipeline.wal.journal import JOURNAL, note_change

    wal_dir = tmp_path / "data" / "db" / "wal"
    _sealed_segment(wal_dir)
    assert note_change(wal_dir) == []
    assert not (tmp_path / "data" / JOURNAL).exists() and not (tmp_path / "data" / "db" / JOURNAL).exists()


def test_markers_are_unique_and_consuming_deletes_only_those_read(tmp_path):
    from history_pipeline.wal.journal import consume, ensure_journal, journal_dir, note_change, read_journal

    base = tmp_path / "wals"  # a WAL root: <wal_root>/<database>
    assert read_journal(journal_dir(base)) is None and not ensure_journal(base)  # no base: no journal
    (base / "db").mkdir(parents=True)
    assert ensure_journal(base)
    written = [note_change(base / "db") for _ in range(50)]
    assert all(len(w) == 1 for w in written) and len({w[0] for w in written}) == 50
    read = read_journal(journal_dir(base))
    assert len(read) == 50 and {m.database for m in read} == {"db"}
    later = note_change(base / "db")  # left after the read: survives the delete
    consume(journal_dir(base), read)
    assert [m.name for m in read_journal(journal_dir(base))] == [os.path.basename(later[0])]
    consume(journal_dir(base), read)  # consumed twice (two evaluations): no error
