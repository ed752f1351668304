"""The driver-routed DataFrame path's plumbing: one read verifies and routes a segment, each (table,
key part) task is handed its lines' byte ranges and reads exactly those lines, on a local root and
on the S3 endpoint, and the answers equal the per-event reference."""

from __future__ import annotations

import numpy as np
import pytest

from history_pipeline import HistoryStore, SegmentQuarantinedError, StoreSettings
from history_pipeline.compaction import compactor, frames
from history_pipeline.errors import SegmentCorruptedError
from history_pipeline.schema import replay_schema_history
from history_pipeline.wal import SegmentState
from history_pipeline.wal.segments import SealedSegment, verify_segment
from history_pipeline_tests.spark_scenario import answers
from history_pipeline_tests.test_compaction import random_history, write

FRAMES = StoreSettings(spark_master=None, compaction_engine="dataframes")


def scan_segment(segment: SealedSegment) -> tuple[list[tuple[int, bytes]], list[tuple[str, int, int]]] | None:
    """The reference route of a segment's body in a second read, after verification (as the
    driver did before routing moved into the verifying read): (the lines that are not row events
    in the writer's form, per touched table (uuid, rows, max t)), as ``frames.route`` returns; None
    when the segment is not for the driver's shortcut."""
    router = frames._Router()
    with open(segment.ref.path, "rb") as f:
        offset, line, carry = 0, 1, b""
        while offset + len(carry) < segment.body_bytes:
            data = carry + f.read(min(frames.ROUTE_BYTES, segment.body_bytes - offset - len(carry)))
            end = data.rfind(b"\n") + 1
            router(data[:end], offset, line)
            offset, line, carry = offset + end, line + data.count(b"\n", 0, end), data[end:]
    routed = router.routed()
    return None if routed is None else (list(routed.records), list(routed.touched))


def _two_tables(n: int) -> list[list[dict]]:
    """Two segments over two tables, text values with commas and braces, a schema change between."""
    cols = [{"column_uuid": "c", "column_name": "c", "data_type": "TEXT"},
            {"column_uuid": "i", "column_name": "i", "data_type": "BIGINT"}]
    first = [{"op": "create_table", "t": 1, "table_uuid": u, "table_name": u.lower(), "columns": cols}
             for u in ("A", "B")]
    first[1]["t"] = 2
    first += [{"op": "insert", "t": 3 + k // 7, "table_uuid": "AB"[k % 2], "key": k * 3 - n,
               "values": {"c": f"v{k},{{x}}", "i": k}} for k in range(n)]
    second = [{"op": "update", "t": 100 + k, "table_uuid": "AB"[k % 2], "key": k * 3 - n, "values": {"i": -k}}
              for k in range(0, n, 3)]
    second.append({"op": "rename_column", "t": 100 + n, "table_uuid": "A", "column_uuid": "i", "new_name": "j"})
    second += [{"op": "delete", "t": 101 + n + k, "table_uuid": "AB"[k % 2], "key": k * 3 - n}
               for k in range(1, n, 5)]
    return [first, second]


def _python_lines(path) -> dict[int, bytes]:
    """The reference: every line of the file by number, split in Python."""
    return dict(enumerate(path.read_bytes().split(b"\n")[:-1], start=1))


@pytest.mark.parametrize("piece", [50, 700, 1 << 22])
def test_one_read_verifies_and_routes_as_the_two_passes_did(tmp_path, monkeypatch, piece):
    monkeypatch.setattr(frames, "ROUTE_BYTES", piece)  # reads cut lines (even shorter than one line)
    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    write(store, *_two_tables(60))
    for ref in store.segments(SegmentState.SEALED):
        sealed, routed = frames.verify_and_route(ref)
        assert sealed == verify_segment(ref)
        assert routed is not None
        assert (list(routed.records), list(routed.touched)) == scan_segment(sealed)
        lines = _python_lines(ref.path)
        for uuid, rows in routed.rows.items():
            wanted = [n for n, text in lines.items() if f'"table_uuid":"{uuid}","key"'.encode() in text]
            assert rows.lines.tolist() == wanted
            data = ref.path.read_bytes()
            assert [data[s:e] for s, e in zip(rows.starts, rows.ends, strict=True)] == [lines[n] for n in wanted]
            assert all(f'"key":{k},'.encode() in lines[n] or f'"key":{k}}}'.encode() in lines[n]
                       for n, k in zip(rows.lines, rows.keys, strict=True))
        routed_lines = {n for n, _ in routed.records} | {n for r in routed.rows.values() for n in r.lines}
        assert routed_lines == set(range(1, sealed.records + 1))


def test_a_corrupted_segment_fails_the_single_read_before_any_routing_is_used(tmp_path):
    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    write(store, *_two_tables(20))
    ref = store.segments(SegmentState.SEALED)[1]
    data = bytearray(ref.path.read_bytes())
    data[data.index(b'"i":-3')] ^= 0x01
    ref.path.write_bytes(bytes(data))
    with pytest.raises(SegmentCorruptedError, match="checksum"):
        frames.verify_and_route(ref)


@pytest.mark.parametrize(("span", "gap"), [(1 << 20, 1 << 20), (300, 40), (10, 1)])
def test_a_task_reads_exactly_its_lines(tmp_path, monkeypatch, span, gap):
    """Spans of any size (one line at least) and skipped gaps give back exactly the named lines."""
    monkeypatch.setattr(frames, "ROUTE_BYTES", span)
    monkeypatch.setattr(frames, "SKIP_GAP", gap)
    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    write(store, *_two_tables(80))
    ref = store.segments(SegmentState.SEALED)[0]
    _, routed = frames.verify_and_route(ref)
    lines = _python_lines(ref.path)
    rows = routed.rows["A"]
    picked = rows.take(np.arange(len(rows.lines)) % 3 != 1)  # a part: not every line of its table
    got = [(n, text) for b in frames._read_lines(str(ref.path), picked)
           for n, text in zip(b.column(0).to_pylist(), b.column(1).to_pylist(), strict=True)]
    assert got == [(int(n), lines[int(n)]) for n in picked.lines]


def test_key_parts_get_disjoint_keys_and_every_line_of_their_table(tmp_path, monkeypatch):
    monkeypatch.setattr(compactor, "SPLIT_THRESHOLD", 10)
    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    write(store, *_two_tables(90))
    ref = store.segments(SegmentState.SEALED)[0]
    sealed, routed = frames.verify_and_route(ref)
    state = store.catalog_state()
    plan = frames.plan_frames(sealed, routed.records, routed.touched, replay_schema_history(state.schema_history),
                              state)
    ctx = frames.FrameContext({}, "db", state.frontier + 1, state.txn_id + 1, ref.segment_id)
    tasks = frames.part_tasks(plan, routed, ctx, compactor.files_per_table)
    for uuid in ("A", "B"):
        mine = [t for t in tasks if t.work.table_uuid == uuid]
        assert len(mine) > 1  # split
        keys = [set(t.rows.keys.tolist()) for t in mine]
        assert sum(len(k) for k in keys) == len(set().union(*keys))  # a key lives in one part only
        assert sorted(n for t in mine for n in t.rows.lines) == routed.rows[uuid].lines.tolist()
    assert [len(t.rows.lines) for t in tasks] == sorted((len(t.rows.lines) for t in tasks), reverse=True)


@pytest.mark.parametrize("root", ["local", "s3"])
def test_split_tables_with_byte_ranges_equal_the_reference(tmp_path, monkeypatch, spark, root, request):
    """Compacted with tables split into parts and tasks reading small spans, on a local root and on
    the S3 endpoint: every answer at every T equals the per-event reference's."""
    monkeypatch.setattr(compactor, "SPLIT_THRESHOLD", 8)
    monkeypatch.setattr(frames, "ROUTE_BYTES", 2_000)
    monkeypatch.setattr(frames, "SKIP_GAP", 200)
    planned, group_tasks = [], frames.group_tasks
    monkeypatch.setattr(frames, "group_tasks", lambda *a: planned.append((len(a[0]), group_tasks(*a))) or planned[-1][1])
    events = random_history(5, n_events=120)
    cuts = [i for i in range(1, len(events)) if events[i]["t"] > events[i - 1]["t"]]  # a t is not split
    a, b = cuts[len(cuts) // 3], cuts[2 * len(cuts) // 3]
    batches = [events[:a], events[a:b], events[b:]]
    got = []
    for name, session in (("frames", spark), ("reference", False)):
        if root == "s3" and name == "frames":
            store = HistoryStore.open(request.getfixturevalue("s3_bucket"), database="db", wal_dir=tmp_path / "wal",
                                      s3=request.getfixturevalue("s3_options"), settings=FRAMES)
        else:
            store = HistoryStore.open(tmp_path / name, database="db", settings=FRAMES)
        write(store, *batches)
        store.compact(spark=session)
        got.append(answers(store))
        if name == "frames":
            assert store.segments() and all(s.state is SegmentState.APPLIED for s in store.segments())
    assert got[0] == got[1]
    assert [members for members, _ in planned] == [3]  # every segment routed on the driver, one job
    tasks = planned[0][1]
    assert len({t.table_uuid for t in tasks}) < len(tasks)  # tables split


def test_a_bad_segment_after_good_ones_is_quarantined_alone(tmp_path, spark):
    """Segments are still applied one by one: the good ones commit, the bad one is quarantined
    naming its line, and the frontier stops before it."""
    store = HistoryStore.open(tmp_path, database="db", settings=FRAMES)
    first, second = _two_tables(30)
    bad = [{"op": "update", "t": 500, "table_uuid": "B", "key": 10_000, "values": {"i": 1}}]
    write(store, first, second, bad)
    with pytest.raises(SegmentQuarantinedError, match="line 2"):
        store.compact(spark=spark)
    assert [s.segment_id for s in store.segments(SegmentState.APPLIED)] == [1, 2]
    assert [s.segment_id for s in store.segments(SegmentState.QUARANTINED)] == [3]
    assert store.frontier == second[-1]["t"]


def test_part_tasks_are_dealt_into_one_partition_per_local_core(spark):
    def task(n: int) -> frames.PartTask:
        rows = frames.RowLines(*(np.arange(n, dtype=np.int64) for _ in range(4)))
        return frames.PartTask(None, rows, 0)  # type: ignore[arg-type]

    tasks = [task(n) for n in (50, 40, 30, 20, 5)]
    assert frames.pack_tasks(tasks, 2) == [[0, 3, 4], [1, 2]]  # each to the lighter partition
    assert frames.pack_tasks(tasks, 8) == [[0], [1], [2], [3], [4]]
    assert frames.pack_tasks(tasks, None) == [[0], [1], [2], [3], [4]]  # a cluster: one each
    assert frames.local_slots(spark) == 2  # the test session is local[2]
